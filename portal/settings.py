"""Settings for the GPU job portal, read from environment variables.

`.env.example` documents every variable. Bad values fail loudly at start-up
(see portal/env.py); nothing here falls back silently on a typo.
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_choice, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PORTAL_VAR_DIR", str(BASE_DIR / "var"))).resolve()

DEBUG = env_bool("PORTAL_DEBUG", False)
SECRET_KEY = env_str("PORTAL_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "PORTAL_SECRET_KEY is not set: give a long random string (scripts/run makes one in var/secret_key)"
        )
    SECRET_KEY = "insecure-development-key-only-used-with-PORTAL_DEBUG"

ALLOWED_HOSTS = env_list("PORTAL_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("PORTAL_CSRF_TRUSTED_ORIGINS", [])

# Behind TLS (a reverse proxy or a load balancer) everything that carries a
# credential must be marked secure; `manage.py check --deploy` passes then.
HTTPS = env_bool("PORTAL_HTTPS", False)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
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
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("PORTAL_DB_CONN_MAX_AGE", 60, minimum=0))
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL={DATABASE_URL!r}: {exc}") from None
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes write (gunicorn workers, node agents): WAL lets readers
    # go on during a write, IMMEDIATE takes the write lock at BEGIN so two
    # transactions never deadlock upgrading a read lock, and the timeout
    # queues writers instead of failing them.
    _db["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
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

# Storage: "local" keeps files under STORAGE_LOCAL_ROOT and addresses them
# with file:// URIs; "webhdfs" talks to an HDFS namenode's WebHDFS endpoint.
STORAGE_BACKEND = env_choice("STORAGE_BACKEND", "local", ("local", "webhdfs"))
STORAGE_LOCAL_ROOT = Path(env_str("STORAGE_LOCAL_ROOT", str(VAR_DIR / "storage"))).resolve()
WEBHDFS_URL = env_str("WEBHDFS_URL", "")
WEBHDFS_USER = env_str("WEBHDFS_USER", "pai")
if STORAGE_BACKEND == "webhdfs" and not WEBHDFS_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured("STORAGE_BACKEND=webhdfs needs WEBHDFS_URL, e.g. http://namenode:9870")
# Empty (as in .env.example) means the backend's default. "file://" ends up
# as "file:", so "$PAI_DEFAULT_FS_URI/alice/code" reads "file:/alice/code".
PAI_DEFAULT_FS_URI = (
    env_str("PAI_DEFAULT_FS_URI", "") or ("file://" if STORAGE_BACKEND == "local" else "hdfs://namenode:9000")
).rstrip("/")
if not PAI_DEFAULT_FS_URI.startswith("file:" if STORAGE_BACKEND == "local" else "hdfs://"):
    raise ImproperlyConfigured(
        f"PAI_DEFAULT_FS_URI={PAI_DEFAULT_FS_URI!r} does not match STORAGE_BACKEND={STORAGE_BACKEND}: expected "
        + ("file:// (or leave it empty)" if STORAGE_BACKEND == "local" else "hdfs://<namenode>:<rpc port>, e.g. hdfs://namenode:9000")
    )
STORAGE_SHARED_FOLDERS = env_list("STORAGE_SHARED_FOLDERS", ["shared"])
CODE_DIR_MAX_MB = env_int("CODE_DIR_MAX_MB", 200, minimum=1)
UPLOAD_OUTPUTS_DEFAULT = env_bool("UPLOAD_OUTPUTS_DEFAULT", False)
STAGE_DIR = Path(env_str("PAI_STAGE_DIR", str(VAR_DIR / "stage"))).resolve()

NODE_HEARTBEAT_SECONDS = env_float("NODE_HEARTBEAT_SECONDS", 5.0, minimum=0.2)
NODE_LOST_AFTER_SECONDS = env_float("NODE_LOST_AFTER_SECONDS", 30.0, minimum=1.0)
RECONCILE_SECONDS = env_float("RECONCILE_SECONDS", 15.0, minimum=0.5)
SCHEDULER_MAX_OVERTAKES = env_int("SCHEDULER_MAX_OVERTAKES", 3, minimum=0)
# Scheduling passes start at most this often (seconds); see jobs/queues.py.
SCHEDULER_MIN_PASS_GAP = env_float("SCHEDULER_MIN_PASS_GAP", 0.1, minimum=0.0)
STOP_GRACE_SECONDS = env_int("STOP_GRACE_SECONDS", 10, minimum=0)
LOG_MAX_BYTES_PER_TASK = env_int("LOG_MAX_BYTES_PER_TASK", 50 * 1024 * 1024, minimum=1024)
LOG_MAX_LINE_CHARS = env_int("LOG_MAX_LINE_CHARS", 64 * 1024, minimum=256)
LOG_FLUSH_SECONDS = env_float("LOG_FLUSH_SECONDS", 0.25, minimum=0.01)
WEB_PORT_LABELS = env_list("WEB_PORT_LABELS", ["jupyter", "http", "https", "tensorboard", "web"])
JOB_SUBNET_POOL = env_str("JOB_SUBNET_POOL", "10.213.0.0/16")
# One-task jobs: Docker's default "bridge" network (fastest start), or
# "isolated", a shared network of ours where containers cannot reach each
# other (about 70 ms more per start). Multi-task jobs always get their own.
SINGLE_TASK_NETWORK = env_choice("SINGLE_TASK_NETWORK", "bridge", ("bridge", "isolated"))
JUPYTER_IDLE_MINUTES = env_int("JUPYTER_IDLE_MINUTES", 60, minimum=1)
# Submit Job: the image a new job starts with (pick one every node has locally).
SUBMIT_DEFAULT_IMAGE = env_str("SUBMIT_DEFAULT_IMAGE", "pai-local/debian:bookworm")

# Threads per gunicorn worker serving plain HTTP (portal/asgi.py); each
# keeps its own database connection.
PORTAL_HTTP_THREADS = env_int("PORTAL_HTTP_THREADS", 8, minimum=1, maximum=256)

# REST API
API_ANONYMOUS_READ = env_bool("API_ANONYMOUS_READ", False)
CORS_ALLOWED_ORIGINS = env_list("CORS_ALLOWED_ORIGINS", [])
LOGIN_FAILURES_ALLOWED = env_int("LOGIN_FAILURES_ALLOWED", 10, minimum=1)
LOGIN_FAILURE_WINDOW_SECONDS = env_int("LOGIN_FAILURE_WINDOW_SECONDS", 300, minimum=1)

# Tests that need Docker, Redis or a browser fail instead of skipping when
# this is set (the README's test command and CI set it).
PORTAL_REQUIRE_SERVICES = env_bool("PORTAL_REQUIRE_SERVICES", False)
