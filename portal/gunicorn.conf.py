"""gunicorn's settings for the portal, the same for scripts/run, the test
cluster and the benchmarks (`gunicorn -c portal/gunicorn.conf.py`); the
address comes from the command line (`-b`).

uvicorn workers serve ASGI: the browser terminal's WebSockets, and plain
HTTP through a pool of threads per worker (portal/asgi.py). Every view is
synchronous Python, so one worker per core is what the CPUs can run; more
workers only add database connections and contention for SQLite's lock.
"""

import os

wsgi_app = "portal.asgi:application"
worker_class = "uvicorn_worker.UvicornWorker"
workers = int(os.environ.get("PORTAL_WORKERS") or min(max(os.cpu_count() or 1, 2), 8))
timeout = 120
graceful_timeout = 10
