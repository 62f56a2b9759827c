"""gunicorn's settings for the portal, the same for scripts/run, the test
cluster and the benchmarks (`gunicorn -c portal/gunicorn.conf.py`); the
address comes from the command line (`-b`).

uvicorn workers serve ASGI: the browser terminal's WebSockets, and plain
HTTP through a pool of threads per worker (portal/asgi.py). Every view is
synchronous Python, so a worker uses at most one core. One worker per core
and one more: a client's keep-alive connection stays with the worker that
accepted it, and with one worker per core an uneven share of busy
connections left one core idle while the other worker was capped at one
(bench/api_submit_rate.py: 10-20% fewer jobs/s). Each worker past that adds
database connections whose commits empty the others' SQLite page caches,
and makes the group commits (jobs/services/job_store.py) smaller: on the
2-core machine, 8 clients submitting, 3 workers took less CPU per job than
4 in 10 of 11 alternated runs, and took 5.7% more jobs/s on average.
"""

import gc
import os

wsgi_app = "portal.asgi:application"
worker_class = "portal.workers.PortalWorker"  # uvicorn's, WebSocket messages bounded
workers = int(os.environ.get("PORTAL_WORKERS") or min((os.cpu_count() or 1) + 1, 8))
timeout = 120
graceful_timeout = 10


def post_worker_init(worker) -> None:
    """Everything the worker loaded to serve (Django, the apps, their
    modules: about 100,000 objects) lives as long as the worker; frozen,
    Python's full collections no longer walk it on every pass, which was
    two-thirds of the collector's time per API submission."""
    gc.freeze()
