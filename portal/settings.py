"""Settings for the GPU job portal, read from environment variables.

`.env.example` documents every variable. Bad values fail loudly at start-up
(see portal/env.py); nothing here falls back silently on a typo.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from jobs.storage import registry as _storage_registry
from portal.env import (
    env_bool, env_choice, env_float, env_float_list, env_int, env_list, env_network_list, env_port_list, env_str,
    private_folder,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PORTAL_VAR_DIR", str(BASE_DIR / "var"))).resolve()
# var/ holds the database, secrets, logs and users' files: the portal's user
# alone may enter it (finding 12). Staged code below it is bind-mounted into
# containers, which does not need the way there to be open.
private_folder(VAR_DIR, name="PORTAL_VAR_DIR")

DEBUG = env_bool("PORTAL_DEBUG", False)
SECRET_KEY = env_str("PORTAL_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "PORTAL_SECRET_KEY is not set: give a long random string (scripts/run makes one in var/secret_key)"
        )
    SECRET_KEY = "insecure-development-key-only-used-with-PORTAL_DEBUG"
# Old keys, newest first, while rotating PORTAL_SECRET_KEY: sessions signed and
# job private keys sealed (jobs/keys.py) with them still open.
SECRET_KEY_FALLBACKS = env_list("PORTAL_SECRET_KEY_FALLBACKS", [])

ALLOWED_HOSTS = env_list("PORTAL_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("PORTAL_CSRF_TRUSTED_ORIGINS", [])

# Behind TLS (a reverse proxy or a load balancer) everything that carries a
# credential must be marked secure; `manage.py check --deploy` passes then.
HTTPS = env_bool("PORTAL_HTTPS", False)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
if HTTPS:
    # A browser takes a __Host- cookie from this very host only (Secure,
    # Path=/, no Domain): no page of another host under a shared domain (a
    # task's web port, review finding 42) can set the portal's session or
    # CSRF cookie. Over plain HTTP the prefix would keep them from being set.
    SESSION_COOKIE_NAME = "__Host-sessionid"
    CSRF_COOKIE_NAME = "__Host-csrftoken"
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = env_int("PORTAL_HSTS_SECONDS", 31536000 if HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
if env_bool("PORTAL_BEHIND_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_AGE = env_int("PORTAL_SESSION_SECONDS", 14 * 24 * 3600, minimum=300)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_rq",
    "channels",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.csp.ContentSecurityPolicyMiddleware",
    "portal.no_nul.RefuseNulMiddleware",  # before anything looks a name up
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Every page needs a signed-in user unless its view says otherwise
    # (@login_not_required: the login page, the REST API with its own auth).
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "jobs.context_processors.portal",
            ],
        },
    },
]

# SQLite under var/ by default; PostgreSQL (or anything dj-database-url reads)
# when DATABASE_URL says so.
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'portal.sqlite3'}")
try:
    # Health checks: a kept connection is tested before each request (or
    # unit of work, see close_old_connections) reuses it, so a database that
    # restarted costs a reconnect, not a failed request (tests/test_restarts.py).
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("PORTAL_DB_CONN_MAX_AGE", 60, minimum=0),
                                conn_health_checks=True)
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL={DATABASE_URL!r}: {exc}") from None
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes write (gunicorn workers, node agents): WAL lets readers
    # go on during a write, IMMEDIATE takes the write lock at BEGIN so two
    # transactions never deadlock upgrading a read lock, and the timeout
    # queues writers instead of failing them. Temporary storage in memory:
    # otherwise SQLite created and deleted a file in /var/tmp for every
    # job's INSERT, a new inode per submission (strace and perf of
    # bench/api_submit_rate.py's web workers). The cost: a big sort with no
    # index to use is held in memory rather than spilled to a file.
    _db["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; "
                        "PRAGMA temp_store=MEMORY;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    _db["TEST"] = {"NAME": str(VAR_DIR / "test-portal.sqlite3")}
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(f"REDIS_URL={REDIS_URL!r}: expected a redis://, rediss:// or unix:// URL")
RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 300}}
# The database and Redis as node agents on other machines reach them (their
# host names, TLS, passwords), handed to nodes that join with a join token
# (scripts/join-node); the portal's own by default.
PORTAL_NODE_DATABASE_URL = env_str("PORTAL_NODE_DATABASE_URL", "") or DATABASE_URL
try:
    dj_database_url.parse(PORTAL_NODE_DATABASE_URL)
except ValueError as exc:
    raise ImproperlyConfigured(f"PORTAL_NODE_DATABASE_URL: {exc}") from None
PORTAL_NODE_REDIS_URL = env_str("PORTAL_NODE_REDIS_URL", "") or REDIS_URL
if not PORTAL_NODE_REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(f"PORTAL_NODE_REDIS_URL={PORTAL_NODE_REDIS_URL!r}: expected a redis://, rediss:// "
                               "or unix:// URL")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "portal",
    }
}

CHANNEL_LAYERS: dict = {}

AUTH_USER_MODEL = "jobs.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "jobs:list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG

# Uploads larger than this go to a temporary file, never to memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024
FILE_UPLOAD_TEMP_DIR = str(VAR_DIR / "tmp")
# Django checks this folder exists; it is ours and git-ignored, so make it.
Path(FILE_UPLOAD_TEMP_DIR).mkdir(parents=True, exist_ok=True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("PORTAL_LOG_LEVEL", "INFO").upper()},
    "loggers": {"rq.worker": {"level": "WARNING"}},
}

# ---------------------------------------------------------------- the platform
# Containers, networks and staged folders carry this in a label, so two
# portals (or a test run beside a live portal) sharing one Docker engine never
# touch each other's containers.
PAI_INSTANCE = env_str("PAI_INSTANCE", "portal")
DOCKER_HOST = env_str("DOCKER_HOST", "unix:///var/run/docker.sock")

# Storage: STORAGE_BACKEND picks a kind of storage from jobs/storage/registry.py:
# "local" keeps files under STORAGE_LOCAL_ROOT and addresses them with file://
# URIs; "webhdfs" talks to an HDFS namenode's WebHDFS endpoint (hdfs:// URIs).
# The kind knows its URI scheme, its default PAI_DEFAULT_FS_URI and which of
# the settings below it needs, and checks them here, at start-up.
STORAGE_BACKEND = env_choice("STORAGE_BACKEND", "local", _storage_registry.BACKEND_NAMES)
STORAGE_LOCAL_ROOT = Path(env_str("STORAGE_LOCAL_ROOT", str(VAR_DIR / "storage"))).resolve()
WEBHDFS_URL = env_str("WEBHDFS_URL", "")
WEBHDFS_USER = env_str("WEBHDFS_USER", "pai")
_storage = _storage_registry.storage_for_backend(STORAGE_BACKEND)
# Empty (as in .env.example) means the backend's default. "file://" ends up
# as "file:", so "$PAI_DEFAULT_FS_URI/alice/code" reads "file:/alice/code".
PAI_DEFAULT_FS_URI = (env_str("PAI_DEFAULT_FS_URI", "") or _storage.default_fs_uri).rstrip("/")
_storage.check_settings(globals())
STORAGE_SHARED_FOLDERS = env_list("STORAGE_SHARED_FOLDERS", ["shared"])
CODE_DIR_MAX_MB = env_int("CODE_DIR_MAX_MB", 200, minimum=1)
# dataDir is copied to /pai/data up to this size; a bigger one is left for the
# task to read from $PAI_DATA_DIR itself (jobs/node/staging.py).
DATA_DIR_MAX_MB = env_int("DATA_DIR_MAX_MB", 2048, minimum=0)
# Per user, over /<user> and /Output/<user> (jobs/storage/quota.py); 0: no limit.
STORAGE_QUOTA_MB = env_int("STORAGE_QUOTA_MB", 10240, minimum=0)
STORAGE_QUOTA_FILES = env_int("STORAGE_QUOTA_FILES", 100000, minimum=0)
# How long a measured usage is kept (writes through the portal add to it).
STORAGE_USAGE_CACHE_SECONDS = env_int("STORAGE_USAGE_CACHE_SECONDS", 300, minimum=0)
# What one task's /pai/output may upload; past it, the files that fit.
OUTPUT_MAX_MB_PER_TASK = env_int("OUTPUT_MAX_MB_PER_TASK", 1024, minimum=1)
OUTPUT_MAX_FILES_PER_TASK = env_int("OUTPUT_MAX_FILES_PER_TASK", 10000, minimum=1)
UPLOAD_OUTPUTS_DEFAULT = env_bool("UPLOAD_OUTPUTS_DEFAULT", False)
# Storage unreachable when a task ends: its /pai/output is kept on the node and
# the upload retried (backoff) for this long, then kept there this many hours.
OUTPUT_UPLOAD_RETRY_SECONDS = env_int("OUTPUT_UPLOAD_RETRY_SECONDS", 600, minimum=0)
OUTPUT_KEEP_HOURS = env_int("OUTPUT_KEEP_HOURS", 72, minimum=1)
STAGE_DIR = Path(env_str("PAI_STAGE_DIR", str(VAR_DIR / "stage"))).resolve()

NODE_HEARTBEAT_SECONDS = env_float("NODE_HEARTBEAT_SECONDS", 5.0, minimum=0.2)
NODE_LOST_AFTER_SECONDS = env_float("NODE_LOST_AFTER_SECONDS", 30.0, minimum=1.0)
RECONCILE_SECONDS = env_float("RECONCILE_SECONDS", 15.0, minimum=0.5)
# While jobs wait, a scheduling pass starts at least this often: a lost
# wake-up is repaired within this plus one heartbeat (jobs/node/agent.py).
SCHEDULE_REPAIR_SECONDS = env_float("SCHEDULE_REPAIR_SECONDS", 5.0, minimum=0.5)
SCHEDULER_MAX_OVERTAKES = env_int("SCHEDULER_MAX_OVERTAKES", 3, minimum=0)
# Scheduling passes start at most this often (seconds); see jobs/queues.py.
SCHEDULER_MIN_PASS_GAP = env_float("SCHEDULER_MIN_PASS_GAP", 0.1, minimum=0.0)
# ... and, after a long pass, at most this long after it started (jobs/queues.py).
SCHEDULER_MAX_PASS_GAP = env_float("SCHEDULER_MAX_PASS_GAP", 1.0, minimum=0.0)
STOP_GRACE_SECONDS = env_int("STOP_GRACE_SECONDS", 10, minimum=0)
LOG_MAX_BYTES_PER_TASK = env_int("LOG_MAX_BYTES_PER_TASK", 50 * 1024 * 1024, minimum=1024)
LOG_MAX_BYTES_PER_JOB = env_int("LOG_MAX_BYTES_PER_JOB", 200 * 1024 * 1024, minimum=1024)
LOG_MAX_ROWS_PER_JOB = env_int("LOG_MAX_ROWS_PER_JOB", 2_000_000, minimum=100)
LOG_MAX_LINE_CHARS = env_int("LOG_MAX_LINE_CHARS", 64 * 1024, minimum=256)
LOG_FLUSH_SECONDS = env_float("LOG_FLUSH_SECONDS", 0.25, minimum=0.01)
# Lines a node agent holds in memory before they are stored (text, plus
# about 64 bytes a line); when full, it reads no more from the engine,
# which keeps them meanwhile (jobs/node/logwriter.py).
LOG_WRITER_QUEUE_BYTES = env_int("LOG_WRITER_QUEUE_BYTES", 64 * 1024 * 1024, minimum=1024 * 1024)
WEB_PORT_LABELS = env_list("WEB_PORT_LABELS", ["jupyter", "http", "https", "tensorboard", "web"])
# Web-labelled ports are published only on this loopback address of their
# node, never on its public address; the portal's proxy (jobs/webports/)
# reaches them there for their owner. It must not be one of the portal's own
# host names (the portal's cookies would reach every job's web port).
NODE_WEB_PORT_ADDRESS = env_str("NODE_WEB_PORT_ADDRESS", "127.0.0.3")
try:
    _web_address_is_loopback = ipaddress.ip_address(NODE_WEB_PORT_ADDRESS).is_loopback
except ValueError:
    _web_address_is_loopback = False
if not _web_address_is_loopback:
    raise ImproperlyConfigured(f"NODE_WEB_PORT_ADDRESS={NODE_WEB_PORT_ADDRESS!r}: expected a loopback IP address "
                               "such as 127.0.0.3 (web ports are reached through the portal's proxy only)")
# The portal's proxy reaches those ports through each node agent's forwarder
# (jobs/node/webforward.py), on the node's address at this port; it takes a
# connection only with a proof signed with the secret key. 0: a port the
# kernel picks (the agent tells the portal which, through Redis); give a
# fixed one to open it in a firewall, to the portal's machine only.
NODE_WEB_FORWARD_PORT = env_int("NODE_WEB_FORWARD_PORT", 0, minimum=0, maximum=65535)
# The proxy serves each task's web port at its own host name,
# t<task attempt>-<port>.PORTAL_PROXY_DOMAIN (any *.localhost name is
# loopback to browsers), on the port the portal was reached on unless
# PORTAL_PROXY_PORT says otherwise (a TLS front on 443, for instance).
PORTAL_PROXY_DOMAIN = env_str("PORTAL_PROXY_DOMAIN", "localhost").strip().strip(".").lower()
if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", PORTAL_PROXY_DOMAIN):
    raise ImproperlyConfigured(f"PORTAL_PROXY_DOMAIN={PORTAL_PROXY_DOMAIN!r}: expected a DNS name such as localhost "
                               "or jobs.example.org")
PORTAL_PROXY_PORT = env_int("PORTAL_PROXY_PORT", 0, minimum=0, maximum=65535)
# How long the proxy's own sign-in (a host-only cookie per task host) lasts;
# every request is checked again anyway (user active, allowed, task running).
PORTAL_PROXY_SESSION_SECONDS = env_int("PORTAL_PROXY_SESSION_SECONDS", 8 * 3600, minimum=60)
JOB_SUBNET_POOL = env_str("JOB_SUBNET_POOL", "10.213.0.0/16")
# One-task jobs run where containers cannot reach each other; multi-task
# jobs each get a network of their own. "isolated": the engine's default
# bridge if the engine was started to isolate it (ICC off, a `pai-` bridge
# the node's firewall matches: scripts/lib.sh starts dockerd so), which
# starts a container 50-80 ms sooner; else a shared network of ours with ICC
# off. "shared": always that network (an engine whose default bridge serves
# other containers too). Docker's default bridge as it comes, where every
# job reached every other (security finding 5), is never used.
SINGLE_TASK_NETWORK = env_choice("SINGLE_TASK_NETWORK", "isolated", ("isolated", "shared"))
# Browser terminals one user may have open at once.
TERMINAL_SESSIONS_PER_USER = env_int("TERMINAL_SESSIONS_PER_USER", 4, minimum=1)
# A terminal whose shell takes none of the user's input for this long is
# closed (its input waits for the shell, never piles up in the portal).
TERMINAL_INPUT_STALL_SECONDS = env_float("TERMINAL_INPUT_STALL_SECONDS", 30.0, minimum=1.0)
# A terminal its browser sends no input to for this long is closed: a shell
# left open in a forgotten tab is root in the container for whoever comes to
# that screen, holds one of the user's sessions, and keeps the task "in use".
TERMINAL_IDLE_SECONDS = env_int("TERMINAL_IDLE_SECONDS", 3600, minimum=1)
# Requests and WebSockets of one user the web-port proxy forwards at once,
# per portal worker: each holds a socket in the worker and two in the node
# agent's forwarder for as long as the client and the job (both the user's)
# keep it open (jobs/webports/app.py). A browser opens 6 connections per
# host at most, plus a few WebSockets per tab.
WEB_PORT_CONNECTIONS_PER_USER = env_int("WEB_PORT_CONNECTIONS_PER_USER", 64, minimum=1)
# Connections a node agent's web-port forwarder splices at once to the web
# ports of one user's tasks (whoever opened them: the owner or an admin).
# Each holds two of the agent's file descriptors; every portal worker may
# send WEB_PORT_CONNECTIONS_PER_USER, so without this one user's tasks
# could take all of the agent's (jobs/node/webforward.py).
WEB_PORT_NODE_CONNECTIONS_PER_USER = env_int("WEB_PORT_NODE_CONNECTIONS_PER_USER", 128, minimum=1)
JUPYTER_IDLE_MINUTES = env_int("JUPYTER_IDLE_MINUTES", 60, minimum=1)
# Submit Job: the image a new job starts with (pick one every node has locally).
SUBMIT_DEFAULT_IMAGE = env_str("SUBMIT_DEFAULT_IMAGE", "pai-local/debian:bookworm")

# Threads per gunicorn worker serving plain HTTP (portal/asgi.py); each
# keeps its own database connection.
PORTAL_HTTP_THREADS = env_int("PORTAL_HTTP_THREADS", 8, minimum=1, maximum=256)
# Streamed responses (whole logs, storage downloads, whole job lists, a
# job's attempts) one user may have open at once, over all workers: each
# holds a thread above while its client reads (jobs/services/stream_slots.py).
# Anonymous callers share one such limit per client address.
STREAMED_RESPONSES_PER_USER = env_int("STREAMED_RESPONSES_PER_USER", 4, minimum=1)

# REST API
API_ANONYMOUS_READ = env_bool("API_ANONYMOUS_READ", False)
CORS_ALLOWED_ORIGINS = env_list("CORS_ALLOWED_ORIGINS", [])
LOGIN_FAILURES_ALLOWED = env_int("LOGIN_FAILURES_ALLOWED", 10, minimum=1)
LOGIN_FAILURE_WINDOW_SECONDS = env_int("LOGIN_FAILURE_WINDOW_SECONDS", 300, minimum=1)
# Fixed task ports (portList beginAt > 0) must lie in a node's task port
# range; these ports are allowed besides (e.g. "6006,8888" or "9000-9010").
FIXED_PORTS_ALLOWED = env_port_list("FIXED_PORTS_ALLOWED")
# Registries a job's image may name although they are on a private (or, for a
# test set-up, loopback) address: "registry:5000", host names or CIDRs.
REGISTRY_ALLOWED = env_list("REGISTRY_ALLOWED", [])
# A pull with no news from the engine for this long is given up (a registry
# that stops sending mid-download would hold a node's launch for good);
# 0: no limit. Extraction sends news too, so this bounds silence, not size.
IMAGE_PULL_STALL_SECONDS = env_int("IMAGE_PULL_STALL_SECONDS", 300, minimum=0)
# The most an image's new layers may download (MB, compressed, as the
# registry sends them); a bigger image is given up mid-pull. 0: no limit.
IMAGE_PULL_MAX_MB = env_int("IMAGE_PULL_MAX_MB", 50_000, minimum=0)
# The most a pulled image may take on the engine's disk, unpacked (MB, the
# engine's Size of it, shared layers included); one bigger is refused and
# removed once pulled. Its own limit, not a factor of IMAGE_PULL_MAX_MB:
# layers compress 2-4 times as a rule, a gzip bomb a thousand times.
# Generous: three times IMAGE_PULL_MAX_MB's default. 0: no limit.
IMAGE_MAX_UNPACKED_MB = env_int("IMAGE_MAX_UNPACKED_MB", 150_000, minimum=0)
# A pull is given up (or not begun) once the engine's disk has less than
# this many MB free: the check above comes only once the image is on the
# disk. Watched only where the agent sees the engine's data root (a local
# engine); 0: not watched.
IMAGE_PULL_MIN_FREE_MB = env_int("IMAGE_PULL_MIN_FREE_MB", 2_000, minimum=0)
# The longest a pull may last, news or not (a registry that trickles sends
# news for ever); 0: no limit.
IMAGE_PULL_MAX_SECONDS = env_int("IMAGE_PULL_MAX_SECONDS", 7200, minimum=0)
# Image pulls one user may have under way on one node at once; their other
# launches there wait, off the node's 4 launch threads (jobs/node/images/
# PullSlots), so that others' launches go on. 0: no limit.
IMAGE_PULLS_PER_USER = env_int("IMAGE_PULLS_PER_USER", 2, minimum=0)
# How long a launch waits for a registry it cannot reach (refused connection,
# timeout, 5xx), asking again with backoff, before its task fails; a refusal
# fails at once. 0: fail at once.
IMAGE_PULL_REGISTRY_WAIT_SECONDS = env_int("IMAGE_PULL_REGISTRY_WAIT_SECONDS", 600, minimum=0)
# The Submit page's live check of a config as it is typed, per user.
LIVE_CHECKS_PER_MINUTE = env_int("LIVE_CHECKS_PER_MINUTE", 60, minimum=1)
# Job submissions through the REST API, per token and minute (a fixed
# window, so a burst at a window's edge may reach twice as many). Generous:
# a sweep script runs at full speed; a runaway loop is slowed down. The
# per-user waiting-job limits (Django admin, "User limits") cap what is kept.
API_SUBMISSIONS_PER_MINUTE = env_int("API_SUBMISSIONS_PER_MINUTE", 1200, minimum=1)

# ------------------------------------------------------------------ insight
# /metrics (Prometheus): admins (session or API token), and a scraper that
# sends `Authorization: Bearer <METRICS_TOKEN>`. Empty: admins only.
METRICS_TOKEN = env_str("METRICS_TOKEN", "").strip()
if METRICS_TOKEN and len(METRICS_TOKEN) < 32:
    raise ImproperlyConfigured("METRICS_TOKEN: use at least 32 random characters (e.g. `openssl rand -hex 32`)")
# The portal's own address, for the job links in webhooks and e-mails (sent
# by node agents, which serve no request to take it from).
PORTAL_URL = env_str("PORTAL_URL", "").strip().rstrip("/")
if PORTAL_URL and not re.match(r"https?://[^/\s]+(/\S*)?\Z", PORTAL_URL):
    raise ImproperlyConfigured(f"PORTAL_URL={PORTAL_URL!r}: expected http(s)://host[:port][/path]")


def _proxy_domain_clash(proxy_domain: str, portal_hosts: list[str]) -> str | None:
    """A host name of the portal's that task hosts (t<n>.<proxy_domain>)
    could set cookies for: the proxy domain itself, a parent of it, or a
    name under it. A page may set a cookie for any parent domain of its
    host, and the browser sends it to every host under that domain (review
    finding 42). `localhost` is exempt: browsers set no cookie for all of it."""
    if proxy_domain == "localhost":
        return None
    for entry in portal_hosts:
        # ".example.org" (ALLOWED_HOSTS) and "*.example.org" (trusted
        # origins) stand for example.org and every name under it.
        host = entry.lower().removeprefix("*").lstrip(".").rstrip(".")
        if not host or host.startswith("["):
            continue
        if host == proxy_domain or proxy_domain.endswith("." + host) or host.endswith("." + proxy_domain):
            return entry
    return None


_clash = _proxy_domain_clash(PORTAL_PROXY_DOMAIN, [
    *ALLOWED_HOSTS, *(re.sub(r"^https?://|[:/].*$", "", origin) for origin in [*CSRF_TRUSTED_ORIGINS, PORTAL_URL])])
if _clash is not None:
    raise ImproperlyConfigured(
        f"PORTAL_PROXY_DOMAIN={PORTAL_PROXY_DOMAIN!r} shares the portal's host name {_clash!r}: a task's page could "
        "set the portal's cookies (its session, its CSRF token). Give task hosts a domain of their own, e.g. "
        "portal pai.example.org, PORTAL_PROXY_DOMAIN=pai-jobs.example.net.")
# Where webhooks may be delivered: CIDRs, and "public" for every globally
# routable address (never loopback, private, link-local, the cloud metadata
# address ...). Checked on the address each delivery connects to.
WEBHOOK_ALLOWED_NETWORKS = env_network_list("WEBHOOK_ALLOWED_NETWORKS", ["public"], keywords=("public",))
WEBHOOK_TIMEOUT_SECONDS = env_float("WEBHOOK_TIMEOUT_SECONDS", 5.0, minimum=0.5)
# Threads per node agent that send webhooks and e-mails (jobs/node/notifier.py).
NOTIFY_THREADS = env_int("NOTIFY_THREADS", 4, minimum=1)
# Waits before each retry of a failed delivery (webhook or e-mail); one try
# plus one per entry.
WEBHOOK_RETRY_SECONDS = env_float_list("WEBHOOK_RETRY_SECONDS", [10, 60, 300, 1800, 7200])
# Usage of running tasks (jobs/node/usage.py): each node agent samples its
# tasks' containers every USAGE_SAMPLE_SECONDS; samples are kept in full for
# USAGE_DETAIL_HOURS, then as one-minute averages for USAGE_MINUTES_DAYS.
USAGE_SAMPLE_SECONDS = env_float("USAGE_SAMPLE_SECONDS", 5.0, minimum=0.2)
USAGE_DETAIL_HOURS = env_float("USAGE_DETAIL_HOURS", 24.0, minimum=0.1)
USAGE_MINUTES_DAYS = env_float("USAGE_MINUTES_DAYS", 30.0, minimum=0.1)
# The most raw samples one job-wide usage summary (.../metrics/summary) may
# read: about 0.8 s of a web worker's CPU on SQLite (bench/big_job_page.py).
# A window of more gets minute buckets from the per-job roll-up, and raw
# samples only for its newest minutes not rolled up yet (jobs/services/usage_series.py).
USAGE_SUMMARY_MAX_SAMPLES = env_int("USAGE_SUMMARY_MAX_SAMPLES", 200_000, minimum=10_000)
# The admin dashboard keeps each window's figures this long (Django's cache),
# shared by every admin who opens it then; 0 computes them at every view.
DASHBOARD_CACHE_SECONDS = env_float("DASHBOARD_CACHE_SECONDS", 60.0, minimum=0.0)
# A task whose real GPUs all stay under IDLE_GPU_PERCENT utilisation for
# IDLE_GPU_MINUTES is flagged idle; "notify" also tells its owner once;
# "stop" tells them when the job will be stopped, and stops it (exit type
# IDLE_GPUS, never retried) if its GPUs are still idle
# IDLE_GPU_STOP_GRACE_MINUTES after that notice. Agents check once a
# minute, so a grace under a minute would mean nothing.
IDLE_GPU_PERCENT = env_float("IDLE_GPU_PERCENT", 5.0, minimum=0.0)
IDLE_GPU_MINUTES = env_float("IDLE_GPU_MINUTES", 30.0, minimum=0.1)
IDLE_GPU_POLICY = env_choice("IDLE_GPU_POLICY", "flag", ("flag", "notify", "stop"))
IDLE_GPU_STOP_GRACE_MINUTES = env_float("IDLE_GPU_STOP_GRACE_MINUTES", 15.0, minimum=1.0)
# E-mail about job state changes, for users who ask for it (Profile page, or
# extras.jobStatusChangeNotification in a job config). No EMAIL_HOST: none.
EMAIL_HOST = env_str("EMAIL_HOST", "").strip()
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL: set one of them, not both")
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "portal@localhost")

# Tests that need Docker, Redis or a browser fail instead of skipping when
# this is set (the README's test command and CI set it).
PORTAL_REQUIRE_SERVICES = env_bool("PORTAL_REQUIRE_SERVICES", False)
