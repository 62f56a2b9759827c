"""Webhooks and e-mails on threads of their own, beside the node's worker.

A delivery waits on someone else's server: up to WEBHOOK_TIMEOUT_SECONDS
for a receiver that never answers, or EMAIL_TIMEOUT per SMTP step. Run by
the agent's RQ worker itself, one user's stalled receiver held back every
launch and stop on the node (they share that worker) for as long as it
kept stalling. The worker now only hands the delivery over and goes on.

Each user's deliveries take one thread at a time, in the order they came:
a user whose receiver never answers slows only their own notifications,
never the other users' on the other threads.

A delivery is stored before it is handed over (jobs/tasks.py), and one
handed over but not yet tried stays PENDING or RETRYING in the database, and one cut off by the agent's end stays SENDING: the repair
sweep (jobs/services/notifications.py) puts both back on the queue.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections

log = logging.getLogger(__name__)

_Item = tuple[tuple | None, Callable[..., Any], tuple]  # (the dedup key, what sends, its arguments)


class NotificationSender:
    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="notify")
        self._lock = threading.Lock()
        # What waits for a thread here: the repair sweep puts a delivery that
        # waited long back on the queue, and it need not wait here twice.
        self._waiting: set[tuple] = set()
        # Owners with a delivery on a thread, and what of theirs waits behind it.
        self._later: dict[int, deque[_Item]] = {}

    def submit(self, send: Callable[..., Any], *args: Any, owner: int | None = None) -> None:
        key = (send, *args) if all(isinstance(arg, int) for arg in args) else None  # a delivery's id
        with self._lock:
            if key in self._waiting:
                return
            if key is not None:
                self._waiting.add(key)
            if owner is not None:
                if owner in self._later:
                    self._later[owner].append((key, send, args))
                    return
                self._later[owner] = deque()
        self._start(owner, (key, send, args))

    def _start(self, owner: int | None, item: _Item) -> None:
        try:
            self._pool.submit(self._run, owner, item)
        except RuntimeError:  # stopped: the repair sweep brings it back
            pass

    def _run(self, owner: int | None, item: _Item) -> None:
        key, send, args = item
        with self._lock:
            self._waiting.discard(key)
        close_old_connections()  # as around a web request: a connection gone bad is replaced
        try:
            send(*args)
        except Exception:
            log.exception("notification %s%r failed", getattr(send, "__name__", send), args)
        finally:
            close_old_connections()
            if owner is not None:
                self._next_of(owner)

    def _next_of(self, owner: int) -> None:
        with self._lock:
            later = self._later.get(owner)
            if not later:
                self._later.pop(owner, None)
                return
            item = later.popleft()
        self._start(owner, item)

    def stop(self, *, wait: bool = False) -> None:
        """Drop what has not started (the repair sweep brings it back); a
        try under way ends within its own timeout (`wait`: for it to end)."""
        with self._lock:
            self._later.clear()
        self._pool.shutdown(wait=wait, cancel_futures=True)
