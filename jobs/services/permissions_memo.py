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

How a process knows the number without asking Redis every call: a bump
publishes the new number, and each process follows those messages on a
subscription of its own (`_Follower`). A call first takes what arrived on
it, a poll of the socket, instead of a round trip: that round trip was a
tenth of a submission's time in the web workers (bench/api_submit_rate.py).
Redis writes a bump's message to its subscribers in the same pass as the
bumper's answer, so by the time the change's own request has answered, the
message waits in every other process's socket. The subscription is
confirmed before the number is first read, and a lost connection is never
quietly remade (the follower's connection does not retry): the process
reads the number afresh on a new subscription, so no message falls between.
The number is also read again every RECHECK_SECONDS, in case a connection
died without a word (or Redis was emptied).

One request reads the number once (a submission asks both questions): its
answers are those of the moment it first asked, as if it had asked them all
at once. A change made by the request itself still counts at once.

Without Redis nothing is kept, and every call asks the database. If Redis
is lost just as a change bumps the number, other processes may keep an old
answer for at most MAX_AGE_SECONDS.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from django.conf import settings
from django.db import connection as db_connection
from django.db import transaction
from redis import ConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.client import PubSub
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from jobs import queues

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_AGE_SECONDS = 60.0
MAX_ENTRIES = 20_000  # a process that sees more keys starts over rather than grow
RECHECK_SECONDS = 1.0
SUBSCRIBE_TIMEOUT_SECONDS = 2.0

# key -> (generation, monotonic time kept, answer). Plain dict operations are
# atomic under the GIL; two threads building the same answer at once is harmless.
_answers: dict[Hashable, tuple[int, float, object]] = {}
# The generation this thread's current request read first; set only between
# request_started and request_finished (see jobs/signals.py).
_request = threading.local()


def _generation_key() -> str:
    return f"{settings.PAI_INSTANCE}:permissions-generation"


def _channel() -> str:
    return f"{settings.PAI_INSTANCE}:permissions-changed"


# The bump and its message in one step: no process can see the new number
# without its message having been sent.
_BUMP = """
local generation = redis.call('INCR', KEYS[1])
redis.call('PUBLISH', ARGV[1], generation)
return generation
"""


def publish_change() -> int:
    """Bump the generation in Redis and tell every process; the new number.
    Raises RedisError."""
    return int(queues.script(_BUMP)(keys=[_generation_key()], args=[_channel()]))


class _Follower:
    """This process's copy of the generation, kept up to date by the
    messages each bump publishes (see the module's docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pubsub: PubSub | None = None
        self.pid = 0  # the process that subscribed: a forked child subscribes anew
        self.channel = ""  # the one followed (PAI_INSTANCE's; tests change it)
        self.generation = 0
        self.read_at = 0.0  # monotonic time the number was last read from Redis

    def current(self) -> int | None:
        """The generation as of now; None without Redis."""
        with self.lock:
            try:
                now = time.monotonic()
                if self.pubsub is None or self.pid != os.getpid() or self.channel != _channel():
                    self._follow(now)
                else:
                    self._take_messages()
                    if now - self.read_at >= RECHECK_SECONDS:
                        self._read(now)
                return self.generation
            except (RedisError, OSError, ValueError):
                self._drop()
                return None

    def learned(self, generation: int) -> None:
        """This process bumped the number to `generation` itself."""
        with self.lock:
            if self.pubsub is not None:
                self.generation = max(self.generation, generation)

    def _follow(self, now: float) -> None:
        self._drop()
        pubsub, channel = _follower_client(os.getpid()).pubsub(), _channel()
        try:
            pubsub.subscribe(channel)
            # Subscribed before the number is read: a bump after the read
            # is then sure to arrive as a message.
            deadline = now + SUBSCRIBE_TIMEOUT_SECONDS
            while True:
                message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
                if message is not None and message["type"] == "subscribe":
                    break
                if time.monotonic() >= deadline:
                    raise RedisTimeoutError("no confirmation of the subscription to permission changes")
        except BaseException:
            pubsub.close()
            raise
        self.pubsub, self.pid, self.channel = pubsub, os.getpid(), channel
        self._read(now)

    def _take_messages(self) -> None:
        assert self.pubsub is not None
        # get_message(timeout=0) polls the socket: it never waits.
        while (message := self.pubsub.get_message(timeout=0)) is not None:
            if message["type"] == "message":
                # Never back: this process's own bump is learned from Redis'
                # answer, which may come before the messages of earlier bumps.
                self.generation = max(self.generation, int(message["data"]))

    def _read(self, now: float) -> None:
        self.generation = int(queues.connection().get(_generation_key()) or 0)
        self.read_at = now

    def _drop(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None and self.pid == os.getpid():  # a parent's connection is not the child's to close
            try:
                pubsub.close()
            except (RedisError, OSError):
                pass


def follower_name(pid: int) -> str:
    """The Redis client name of process `pid`'s subscription (CLIENT LIST)."""
    return f"portal-permissions-{pid}"


@functools.cache
def _follower_client(pid: int) -> Redis:
    """The queues' Redis, on a connection pool of its own that never
    retries: a subscription that reconnected on its own would have missed
    what was published meanwhile without anyone knowing."""
    shared = queues.connection().connection_pool
    kwargs = {**shared.connection_kwargs, "retry": Retry(NoBackoff(), 0), "client_name": follower_name(pid)}
    return Redis(connection_pool=ConnectionPool(connection_class=shared.connection_class, **kwargs))


_follower = _Follower()


def request_started() -> None:
    _request.active, _request.generation = True, None


def request_finished() -> None:
    _request.active, _request.generation = False, None


def _generation() -> int | None:
    kept = getattr(_request, "generation", None)
    if kept is not None:
        return kept
    generation = _follower.current()
    if generation is not None and getattr(_request, "active", False):
        _request.generation = generation
    return generation


def _bump() -> None:
    try:
        _follower.learned(publish_change())
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
