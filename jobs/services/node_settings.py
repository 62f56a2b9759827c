"""What a joining node is handed (`POST /api/v2/nodes/join`): the settings
a node agent needs to start on a fresh machine, as environment variables,
so no secret is copied by hand.

Every setting the portal reads is in exactly one of two lists below, and a
test (tests/test_join.py) fails when one is in neither: a new setting must
be decided on, not forgotten. HANDED_OVER settings are sent with the value
the portal was given (its environment), so the agent parses exactly what
the portal parsed; a few are computed (the database and Redis as nodes
reach them, the secret key, the resolved storage folder). NOT_HANDED_OVER
are the web process's own (sessions, login limits, the proxy) or the node's
own (its Docker engine, its var folder, its log level).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from urllib.parse import urlsplit

from django.conf import settings

# The agent needs these to behave as the portal decided: where the state
# is, the secret that opens sealed job keys and secrets and signs the web
# port forwarder's proofs, storage, the platform's timings and limits,
# notifications (agents deliver them), and the portal's host names (an
# agent refuses to publish task ports on one of them).
HANDED_OVER = (
    "DATABASE_URL", "REDIS_URL", "PORTAL_SECRET_KEY", "PORTAL_SECRET_KEY_FALLBACKS", "PAI_INSTANCE",
    "PORTAL_DB_CONN_MAX_AGE", "PORTAL_ALLOWED_HOSTS", "PORTAL_CSRF_TRUSTED_ORIGINS", "PORTAL_URL",
    "STORAGE_BACKEND", "STORAGE_LOCAL_ROOT", "WEBHDFS_URL", "WEBHDFS_USER", "PAI_DEFAULT_FS_URI",
    "STORAGE_SHARED_FOLDERS", "CODE_DIR_MAX_MB", "DATA_DIR_MAX_MB", "STORAGE_QUOTA_MB", "STORAGE_QUOTA_FILES",
    "STORAGE_USAGE_CACHE_SECONDS", "OUTPUT_MAX_MB_PER_TASK", "OUTPUT_MAX_FILES_PER_TASK", "UPLOAD_OUTPUTS_DEFAULT",
    "OUTPUT_UPLOAD_RETRY_SECONDS", "OUTPUT_KEEP_HOURS",
    "NODE_HEARTBEAT_SECONDS", "NODE_LOST_AFTER_SECONDS", "RECONCILE_SECONDS", "SCHEDULE_REPAIR_SECONDS",
    "SCHEDULER_MAX_OVERTAKES", "SCHEDULER_MIN_PASS_GAP", "SCHEDULER_MAX_PASS_GAP",
    "STOP_GRACE_SECONDS",
    "LOG_MAX_BYTES_PER_TASK", "LOG_MAX_BYTES_PER_JOB", "LOG_MAX_ROWS_PER_JOB", "LOG_MAX_LINE_CHARS",
    "LOG_FLUSH_SECONDS", "LOG_WRITER_QUEUE_BYTES",
    "WEB_PORT_LABELS", "NODE_WEB_PORT_ADDRESS", "NODE_WEB_FORWARD_PORT", "WEB_PORT_NODE_CONNECTIONS_PER_USER",
    "JOB_SUBNET_POOL",
    "SINGLE_TASK_NETWORK", "JUPYTER_IDLE_MINUTES", "REGISTRY_ALLOWED", "FIXED_PORTS_ALLOWED",
    "WEBHOOK_TIMEOUT_SECONDS", "WEBHOOK_RETRY_SECONDS", "WEBHOOK_ALLOWED_NETWORKS", "NOTIFY_THREADS",
    "EMAIL_HOST", "EMAIL_PORT", "EMAIL_HOST_USER", "EMAIL_HOST_PASSWORD", "EMAIL_USE_TLS", "EMAIL_USE_SSL",
    "EMAIL_TIMEOUT", "DEFAULT_FROM_EMAIL",
    "USAGE_SAMPLE_SECONDS", "USAGE_DETAIL_HOURS", "USAGE_MINUTES_DAYS", "IDLE_GPU_PERCENT", "IDLE_GPU_MINUTES",
    "IDLE_GPU_POLICY", "IDLE_GPU_STOP_GRACE_MINUTES",
    "IMAGE_PULL_STALL_SECONDS", "IMAGE_PULL_MAX_MB", "IMAGE_PULL_MAX_SECONDS", "IMAGE_PULLS_PER_USER",
    "IMAGE_PULL_REGISTRY_WAIT_SECONDS", "IMAGE_MAX_UNPACKED_MB", "IMAGE_PULL_MIN_FREE_MB",
)
NOT_HANDED_OVER = (
    # the node's own
    "PORTAL_VAR_DIR", "PORTAL_DEBUG", "PORTAL_LOG_LEVEL", "DOCKER_HOST", "PAI_STAGE_DIR", "PORTAL_REQUIRE_SERVICES",
    # the web process's own
    "PORTAL_HTTPS", "PORTAL_HSTS_SECONDS", "PORTAL_BEHIND_PROXY", "PORTAL_SESSION_SECONDS", "PORTAL_HTTP_THREADS",
    "PORTAL_PROXY_DOMAIN", "PORTAL_PROXY_PORT", "PORTAL_PROXY_SESSION_SECONDS", "TERMINAL_SESSIONS_PER_USER",
    "TERMINAL_INPUT_STALL_SECONDS", "TERMINAL_IDLE_SECONDS", "SUBMIT_DEFAULT_IMAGE", "API_ANONYMOUS_READ", "CORS_ALLOWED_ORIGINS",
    "LOGIN_FAILURES_ALLOWED", "LOGIN_FAILURE_WINDOW_SECONDS", "LIVE_CHECKS_PER_MINUTE", "API_SUBMISSIONS_PER_MINUTE",
    "STREAMED_RESPONSES_PER_USER", "WEB_PORT_CONNECTIONS_PER_USER", "METRICS_TOKEN", "DASHBOARD_CACHE_SECONDS",
    "USAGE_SUMMARY_MAX_SAMPLES",
    # what nodes are handed instead of the portal's own DATABASE_URL and REDIS_URL
    "PORTAL_NODE_DATABASE_URL", "PORTAL_NODE_REDIS_URL",
)

# Computed rather than copied from the portal's environment.
_COMPUTED: dict[str, Callable[[], str]] = {
    "DATABASE_URL": lambda: settings.PORTAL_NODE_DATABASE_URL,
    "REDIS_URL": lambda: settings.PORTAL_NODE_REDIS_URL,
    "PORTAL_SECRET_KEY": lambda: settings.SECRET_KEY,
    "PORTAL_SECRET_KEY_FALLBACKS": lambda: ",".join(settings.SECRET_KEY_FALLBACKS),
    "PAI_INSTANCE": lambda: settings.PAI_INSTANCE,
    "STORAGE_BACKEND": lambda: settings.STORAGE_BACKEND,
    "PAI_DEFAULT_FS_URI": lambda: settings.PAI_DEFAULT_FS_URI,
}


def node_settings() -> dict[str, str]:
    """NAME -> value for the node's environment: the computed ones always,
    the others when the portal was given them (else both use the default).
    Values never hold a newline or a single quote (refused: the node's file
    quotes values in single quotes, for the shell and systemd alike)."""
    values = {name: make() for name, make in _COMPUTED.items()}
    if settings.STORAGE_BACKEND == "local":
        values["STORAGE_LOCAL_ROOT"] = str(settings.STORAGE_LOCAL_ROOT)
    for name in HANDED_OVER:
        if name not in values and name in os.environ:
            values[name] = os.environ[name]
    values = {name: value for name, value in values.items() if value != ""}
    for name, value in values.items():
        if "\n" in value or "'" in value or "\0" in value:
            raise ValueError(f"{name} holds a newline or a single quote, which a node's settings file cannot carry")
    return values


def node_settings_warnings(values: dict[str, str]) -> list[str]:
    """What will not work from another machine, in words, for join-node to print."""
    warnings = []
    database = urlsplit(values["DATABASE_URL"])
    if database.scheme.startswith("sqlite"):
        warnings.append("the database is SQLite: only a node on the portal's own machine can use it. Use "
                        "PostgreSQL and set PORTAL_NODE_DATABASE_URL for nodes on other machines.")
    elif (database.hostname or "") in ("127.0.0.1", "localhost", "::1", ""):
        warnings.append("the database URL names loopback: set PORTAL_NODE_DATABASE_URL to the address nodes reach "
                        "it at.")
    redis = urlsplit(values["REDIS_URL"])
    if redis.scheme == "unix" or (redis.hostname or "") in ("127.0.0.1", "localhost", "::1"):
        warnings.append("the Redis URL is a unix socket or loopback: set PORTAL_NODE_REDIS_URL to the address "
                        "nodes reach it at.")
    if values.get("STORAGE_BACKEND") == "local":
        warnings.append("storage is local (STORAGE_LOCAL_ROOT): nodes must share the portal's machine or that "
                        "folder; use WebHDFS for nodes on other machines.")
    return warnings
