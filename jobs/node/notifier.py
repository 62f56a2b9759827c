"""Webhooks and e-mails on threads of their own, beside the node's worker.

A delivery waits on someone else's server: up to WEBHOOK_TIMEOUT_SECONDS
for a receiver that never answers, or EMAIL_TIMEOUT per SMTP step. Run by
the agent's RQ worker itself, one user's stalled receiver held back every
launch and stop on the node (they share that worker) for as long as it
kept stalling. The worker now only hands the delivery over and goes on.

A delivery handed over but not yet tried stays PENDING or RETRYING in the
database, and one cut off by the agent's end stays SENDING: the repair
sweep (jobs/services/notifications.py) puts both back on the queue.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections

log = logging.getLogger(__name__)


class NotificationSender:
    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="notify")
        # What waits for a thread here: the repair sweep puts a delivery that
        # waited long back on the queue, and it need not wait here twice.
        self._waiting: set[tuple] = set()
        self._lock = threading.Lock()

    def submit(self, send: Callable[..., Any], *args: Any) -> None:
        key = (send, *args) if all(isinstance(arg, int) for arg in args) else None  # a delivery's id
        with self._lock:
            if key in self._waiting:
                return
            if key is not None:
                self._waiting.add(key)
        self._pool.submit(self._run, key, send, *args)

    def _run(self, key: tuple | None, send: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._waiting.discard(key)
        close_old_connections()  # as around a web request: a connection gone bad is replaced
        try:
            send(*args)
        except Exception:
            log.exception("notification %s%r failed", getattr(send, "__name__", send), args)
        finally:
            close_old_connections()

    def stop(self, *, wait: bool = False) -> None:
        """Drop what has not started (the repair sweep brings it back); a
        try under way ends within its own timeout (`wait`: for it to end)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)
