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
# Each pytest session gets its own folder, label, subnets and host ports, so
# two test runs on one machine (or one beside a live portal) never collide.
RUN_ID = os.environ.get("PORTAL_TEST_RUN") or str(os.getpid())
_SLOTS = 18


# The slots' lock files, for every checkout on this machine: host ports,
# network namespaces and subnets are the machine's, not a checkout's. Under
# each checkout's var/test, a run in one clone (a CI run) and a run in
# another took the same slot, and the second's PostgreSQL found its port
# taken.
SLOT_LOCKS = Path("/tmp/portal-test-slots")


def _take_slot() -> int:
    """A slot (host ports, subnets) no other live test run on this machine
    holds: each run keeps an exclusive lock on its slot's file until it
    exits. A slot from the pid alone let two runs whose pids matched modulo
    18 share ports."""
    import fcntl

    (_ROOT / "var" / "test").mkdir(parents=True, exist_ok=True)
    folder = SLOT_LOCKS
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o1777)  # as /tmp: any user's runs share it, none removes another's lock
    start = int(RUN_ID) % _SLOTS if RUN_ID.isdigit() else 0
    for step in range(_SLOTS):
        slot = (start + step) % _SLOTS
        handle = open(folder / f"slot-{slot}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _held_slot_files.append(handle)  # kept open: the lock lasts as long as this process
        return slot
    raise RuntimeError(f"all {_SLOTS} test slots are taken by other test runs on this machine")


_held_slot_files: list = []
_slot = _take_slot()
TEST_VAR = _ROOT / "var" / "test" / f"run-{RUN_ID}"
# Agents take ranges from here (see tests/cluster.py): 21000-32399, below
# Linux's ephemeral ports (32768-60999), which any client may hold.
PORT_BASE = 21000 + _slot * 600
REDIS_SOCKET = TEST_VAR / "redis.sock"
REDIS_PASSWORD = "test-redis-password"

# The database: a SQLite file of the run's own by default. With
# PORTAL_TEST_DATABASE=postgres (scripts/test's second pass), a database of
# the run's own on a real PostgreSQL 15 that conftest starts: one server per
# slot (its data folder kept for the slot's next run, so initdb runs once),
# on a port of the slot's, below the agents' ranges (tests/postgres_server.py).
TEST_DATABASE = os.environ.get("PORTAL_TEST_DATABASE", "sqlite")
if TEST_DATABASE not in ("sqlite", "postgres"):
    raise RuntimeError(f"PORTAL_TEST_DATABASE={TEST_DATABASE!r}: expected sqlite or postgres")
POSTGRES_DIR = _ROOT / "var" / "test" / f"postgres-{_slot}"
POSTGRES_PORT = 20000 + _slot
POSTGRES_PASSWORD = "test-postgres-password"
POSTGRES_DATABASE = "portal_test_" + "".join(c if c.isalnum() else "_" for c in RUN_ID.lower())
if TEST_DATABASE == "postgres":
    _DATABASE_URL = f"postgres://portal:{POSTGRES_PASSWORD}@127.0.0.1:{POSTGRES_PORT}/{POSTGRES_DATABASE}"
else:
    _DATABASE_URL = f"sqlite:///{TEST_VAR / 'portal.sqlite3'}"

TEST_ENV = {
    "PORTAL_SECRET_KEY": "test-only-secret-key-" + "x" * 40,
    "PORTAL_DEBUG": "0",
    "PORTAL_VAR_DIR": str(TEST_VAR),
    "DATABASE_URL": _DATABASE_URL,
    "REDIS_URL": f"unix://{REDIS_SOCKET}?db=0&password={REDIS_PASSWORD}",
    "PAI_INSTANCE": f"pai-test-{RUN_ID}",
    "PORTAL_TEST_RUN": RUN_ID,
    "STORAGE_BACKEND": "local",
    "STORAGE_LOCAL_ROOT": str(TEST_VAR / "storage"),
    "JOB_SUBNET_POOL": f"10.{150 + _slot}.0.0/16",
    "NODE_HEARTBEAT_SECONDS": "1",
    "NODE_LOST_AFTER_SECONDS": "8",
    "RECONCILE_SECONDS": "3",
    "SCHEDULE_REPAIR_SECONDS": "2",
    "TERMINAL_INPUT_STALL_SECONDS": "5",
    "STOP_GRACE_SECONDS": "3",
    "LOG_FLUSH_SECONDS": "0.2",
    "PORTAL_LOG_LEVEL": "WARNING",
    # The tests' webhook receivers listen on 127.0.0.1 (tests/test_notifications.py);
    # the default, public addresses only, is tested there too.
    "WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
}
os.environ.update(TEST_ENV)
# Playwright's sync API runs an event loop in the test thread; the ORM calls
# tests make beside it are still plain synchronous code (this process only).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
TEST_VAR.mkdir(parents=True, exist_ok=True)

from portal.settings import *  # noqa: E402,F401,F403

# Pages rendered in this process (Django's test client) need no collected
# manifest; gunicorn under test still serves the real, collected one.
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
