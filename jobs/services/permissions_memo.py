"""A per-process memo of the two questions every API call asks the database:
which user a bearer token stands for, and whether a user may submit to a
virtual cluster (and, for jobs/services/limits.py, their limits there).

Why: building those ORM queries is the largest CPU cost left on the submit
path (about 0.6 ms each under load, far more than SQLite takes to answer),
and a script submitting a sweep asks the same two questions for every job.

Why a kept answer cannot outlive a change: every change that could alter an
answer (a token revoked or deleted, a user saved or deleted, a virtual
cluster saved or deleted, a membership changed; see jobs/signals.py) bumps one
generation number in Redis, shared by every portal process. An answer is kept
with the generation read *before* the database was asked, and is used only
while the generation has not moved. A change bumps it at once (so its own
transaction sees it) and again when it commits, so an answer read from the
old rows while the change was committing is dropped at the next call.

One request reads the number once (a submission asks both questions): its
answers are those of the moment it first asked, as if it had asked them all
at once. A change made by the request itself still counts at once.

Without Redis nothing is kept, and every call asks the database. If Redis
is lost just as a change bumps the number, other processes may keep an old
answer for at most MAX_AGE_SECONDS.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from django.conf import settings
from django.db import connection as db_connection
from django.db import transaction
from redis.exceptions import RedisError

from jobs import queues

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_AGE_SECONDS = 60.0
MAX_ENTRIES = 20_000  # a process that sees more keys starts over rather than grow

# key -> (generation, monotonic time kept, answer). Plain dict operations are
# atomic under the GIL; two threads building the same answer at once is harmless.
_answers: dict[Hashable, tuple[int, float, object]] = {}
# The generation this thread's current request read first; set only between
# request_started and request_finished (see jobs/signals.py).
_request = threading.local()


def _generation_key() -> str:
    return f"{settings.PAI_INSTANCE}:permissions-generation"


def request_started() -> None:
    _request.active, _request.generation = True, None


def request_finished() -> None:
    _request.active, _request.generation = False, None


def _generation() -> int | None:
    kept = getattr(_request, "generation", None)
    if kept is not None:
        return kept
    try:
        value = queues.connection().get(_generation_key())
    except RedisError:
        return None
    generation = int(value or 0)
    if getattr(_request, "active", False):
        _request.generation = generation
    return generation


def _bump() -> None:
    try:
        queues.connection().incr(_generation_key())
    except RedisError as exc:
        log.warning("could not tell other portal processes that permissions changed: %s", exc)
    _answers.clear()
    _request.generation = None  # this request reads the new number


def permissions_changed() -> None:
    """Drop every kept answer, in every process: now, and again on commit."""
    _bump()
    if db_connection.in_atomic_block:
        transaction.on_commit(_bump)


def remembered(key: Hashable, ask: Callable[[], T]) -> T:
    """The answer kept for `key`, or `ask()`'s (kept if it returns; an
    exception, such as "no such token", is never kept)."""
    generation = _generation()
    if generation is None:
        return ask()
    now = time.monotonic()
    kept = _answers.get(key)
    if kept is not None and kept[0] == generation and now - kept[1] < MAX_AGE_SECONDS:
        return kept[2]  # type: ignore[return-value]
    answer = ask()
    if len(_answers) >= MAX_ENTRIES:
        _answers.clear()
    _answers[key] = (generation, now, answer)
    return answer
