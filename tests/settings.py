"""Settings for the test suite: the portal's own settings, read from an
environment that points every moving part at test-only places (a var/test
folder, a Redis on a unix socket, subnets and labels of their own), so a test
run never touches a portal running on the same machine.

Processes the tests start (gunicorn, node agents) get the same environment
from `TEST_ENV`.
"""

import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
TEST_VAR = _ROOT / "var" / "test"
REDIS_SOCKET = TEST_VAR / "redis.sock"
REDIS_PASSWORD = "test-redis-password"

TEST_ENV = {
    "PORTAL_SECRET_KEY": "test-only-secret-key-" + "x" * 40,
    "PORTAL_DEBUG": "0",
    "PORTAL_VAR_DIR": str(TEST_VAR),
    "DATABASE_URL": f"sqlite:///{TEST_VAR / 'portal.sqlite3'}",
    "REDIS_URL": f"unix://{REDIS_SOCKET}?db=0&password={REDIS_PASSWORD}",
    "PAI_INSTANCE": "pai-test",
    "STORAGE_BACKEND": "local",
    "STORAGE_LOCAL_ROOT": str(TEST_VAR / "storage"),
    "JOB_SUBNET_POOL": "10.214.0.0/16",
    "NODE_HEARTBEAT_SECONDS": "1",
    "NODE_LOST_AFTER_SECONDS": "8",
    "RECONCILE_SECONDS": "3",
    "STOP_GRACE_SECONDS": "3",
    "LOG_FLUSH_SECONDS": "0.2",
    "PORTAL_LOG_LEVEL": "WARNING",
}
os.environ.update(TEST_ENV)
TEST_VAR.mkdir(parents=True, exist_ok=True)

from portal.settings import *  # noqa: E402,F401,F403
