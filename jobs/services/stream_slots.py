"""How many streamed responses one user may have open at once.

A streamed response (a whole log, a file from storage, a whole job list, a
job's attempts) holds a web thread until the client has read the last byte,
and a client may read as slowly as it likes. Every web worker has only
PORTAL_HTTP_THREADS threads, so one user opening dozens of slow downloads
could hold every thread of every worker and keep everyone else out. Each
user may therefore hold at most STREAMED_RESPONSES_PER_USER of them;
anonymous callers (API_ANONYMOUS_READ) share one such limit per client
address.

The count must be the same in every worker process, so it lives in Redis:
a sorted set per holder whose members are the open streams, each scored by
when it expires. A stream's worker moves that time forward every
REFRESH_SECONDS for as long as the stream is open (a thread of its own does,
not the stream: a client that reads nothing blocks the stream's thread, and
that thread must go on counting), and removes the member when the response
is closed: at its end, when the client goes away, or after an error. A
worker that is killed does neither, so its streams are simply not refreshed
any more, and every take drops members past their time: a slot is never
lost for longer than SLOT_SECONDS.

If Redis cannot be reached, streams go ahead uncounted, as the other rate
limits do (jobs/services/ratelimit.py): a Redis outage must not stop
everyone's downloads to stop one user's.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from redis.exceptions import RedisError

from jobs import queues
from jobs.services import ratelimit
from jobs.models import User

log = logging.getLogger(__name__)

T = TypeVar("T")

SLOT_SECONDS = 60  # how long a slot outlives the last sign that its worker is alive
REFRESH_SECONDS = 15  # a few refreshes per SLOT_SECONDS: one lost to a Redis hiccup costs nothing
RETRY_AFTER_SECONDS = 10  # when a refused client may ask again: a slot frees when some stream ends

# Redis's clock, not the workers': web workers on several machines must
# agree on when a slot is past its time.
_NOW = """
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
"""

# Drop slots past their time (their worker died), then take one if fewer
# than the limit are held. One script: two takes at once cannot both see
# the last free slot. The key's own expiry removes a holder nobody refreshes.
_TAKE = _NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# XX: only slots still there. One released (or dropped as past its time)
# while this refresh was on its way must not come back.
_REFRESH = _NOW + """
for i, key in ipairs(KEYS) do
  if redis.call('ZADD', key, 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i + 1]) == 1 then
    redis.call('EXPIRE', key, ARGV[1])
  end
end
return 0
"""


class TooManyStreams(Exception):
    """The holder has STREAMED_RESPONSES_PER_USER streams open already."""

    status = 429
    code = "TooManyRequestsError"

    def __init__(self, *, limit: int, anonymous: bool) -> None:
        self.limit = limit
        self.retry_after = RETRY_AFTER_SECONDS
        who = "Anonymous clients at your address have" if anonymous else "You have"
        self.message = (f"{who} {limit} downloads or whole lists open already, the most allowed at once "
                        f"(STREAMED_RESPONSES_PER_USER={limit}). Let one finish or cancel it, then try again "
                        f"in {self.retry_after} seconds.")
        super().__init__(self.message)


class WorkerBusy(TooManyStreams):
    """This web worker streams to as many clients as it may
    (worker_stream_limit()): its other threads stay for everyone's pages."""

    status = 503
    code = "ServiceUnavailableError"

    def __init__(self, *, limit: int) -> None:
        Exception.__init__(self)
        self.limit = limit
        self.retry_after = RETRY_AFTER_SECONDS
        self.message = (f"The server is sending as many downloads and whole lists as it can at once ({limit}). "
                        f"Try again in {self.retry_after} seconds.")
        self.args = (self.message,)


def worker_stream_limit() -> int:
    """How many streamed responses one web worker sends at once: all its
    threads (PORTAL_HTTP_THREADS) but two, which stay for pages and API
    calls however many users download at once; at least one."""
    return max(1, settings.PORTAL_HTTP_THREADS - 2)


class _WorkerStreams:
    """This process's open streams: counted against worker_stream_limit(),
    and the ones its refresher keeps alive in Redis. Weak: a slot dropped
    without its release (a response never closed, a bug) gives its place
    back as it is collected, and is no longer refreshed, so its Redis entry
    runs out too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: weakref.WeakSet[StreamSlot] = weakref.WeakSet()

    @property
    def open(self) -> int:
        return len(self._slots)

    def take(self, slot: StreamSlot) -> None:
        limit = worker_stream_limit()
        with self._lock:
            if len(self._slots) >= limit:
                raise WorkerBusy(limit=limit)
            self._slots.add(slot)

    def give_back(self, slot: StreamSlot) -> None:
        with self._lock:
            self._slots.discard(slot)

    def counted(self) -> list[StreamSlot]:
        """Those with an entry in Redis (taken while Redis answered)."""
        with self._lock:
            return [slot for slot in self._slots if slot.counted]


_worker_streams = _WorkerStreams()


class StreamSlot:
    """One open stream's place in its holder's set, and in its worker's."""

    def __init__(self, key: str, member: str, *, counted: bool) -> None:
        self.key, self.member = key, member
        self.counted = counted  # False when Redis was down at the take: nothing to release
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        _worker_streams.give_back(self)
        if not self.counted:
            return
        try:
            queues.connection().zrem(self.key, self.member)
        except RedisError:  # its time runs out instead
            log.warning("stream limit unavailable", exc_info=True)


class HeldStream(Generic[T]):
    """`content`, holding a stream slot until the response is closed.

    A class and not a generator: Django and the server call close() on a
    response that was never read too (its client gone before the first
    byte: portal/http_bridge.py watches for that), and a generator that
    never started skips its `finally`."""

    def __init__(self, content: Iterable[T], slot: StreamSlot) -> None:
        self._content = content
        self._iterator = iter(content)
        self.slot = slot

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        return next(self._iterator)

    def close(self) -> None:
        try:
            _close(self._iterator)
            if self._content is not self._iterator:
                _close(self._content)  # what Django would have closed (an open file, an HDFS connection)
        finally:
            self.slot.release()


def _close(thing: object) -> None:
    close = getattr(thing, "close", None)
    if close is not None:
        close()


def holder_of(*, user: User | AnonymousUser, address: str) -> str:
    """Whose limit a stream counts toward: the user's; anonymous callers
    share their address's, an IPv6 client its /64 (one machine commonly
    holds a whole /64, and would otherwise have a limit per address)."""
    if user.is_authenticated:
        return f"user:{user.pk}"
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return f"address:{address}"
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return f"address:{parsed.ipv4_mapped}"
        if parsed in _NAT64:  # every IPv4 client behind the translator: each its own address
            return f"address:{ipaddress.IPv4Address(int(parsed) & 0xFFFFFFFF)}"
        if parsed.is_link_local:  # each interface's fe80::/64 is everyone on that link
            return f"address:{parsed}"
        return f"address:{ipaddress.IPv6Network((int(parsed) >> 64 << 64, 64))}"
    return f"address:{parsed}"


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _key(holder: str) -> str:
    return f"{settings.PAI_INSTANCE}:streams:{ratelimit.digest(holder)}"


def stream_slot_take(*, holder: str) -> StreamSlot:
    """A slot for one more open stream of `holder`: TooManyStreams past
    the holder's limit, WorkerBusy past this worker's."""
    slot = StreamSlot(_key(holder), uuid.uuid4().hex, counted=True)
    _worker_streams.take(slot)
    try:
        _take_holders(slot, holder)
    except BaseException:
        _worker_streams.give_back(slot)
        raise
    return slot


def _take_holders(slot: StreamSlot, holder: str) -> None:
    limit = settings.STREAMED_RESPONSES_PER_USER
    try:
        taken = queues.script(_TAKE)(keys=[slot.key], args=[slot.member, limit, SLOT_SECONDS])
    except RedisError:  # Redis is down: never block work on the limiter
        log.warning("stream limit unavailable", exc_info=True)
        slot.counted = False
        return
    if not taken:
        raise TooManyStreams(limit=limit, anonymous=holder.startswith("address:"))
    _ensure_refresher()


def stream_hold(*, user: User | AnonymousUser, address: str, content: Iterable[T],
                head: bool = False) -> Iterable[T]:
    """`content` to stream, counted toward its caller's limit until it is
    closed. Call it once the caller may see what `content` holds: a refused
    or unauthorised request must not take the owner's slots. Raises
    TooManyStreams, having closed `content` (an open file or connection).
    For a HEAD request (`head`), whose answer has no body, `content` is
    closed unread and nothing is taken: a HEAD of the API's whole job list
    or job attempts used to read them all for nothing (the pages' downloads
    take GET only)."""
    if head:
        _close(content)
        return ()
    try:
        slot = stream_slot_take(holder=holder_of(user=user, address=address))
    except TooManyStreams:
        _close(content)
        raise
    return HeldStream(content, slot)


def streams_open(*, holder: str) -> int:
    """How many streams `holder` has open now (none past its time)."""
    redis = queues.connection()
    seconds, micros = redis.time()
    return redis.zcount(_key(holder), f"({seconds}.{micros:06d}", "+inf")


# ------------------------------------------- this process's refresher

_refresher_lock = threading.Lock()
_refresher_pid: int | None = None


def _ensure_refresher() -> None:
    """One refresher per process, started by its first counted stream: a
    thread started before gunicorn forks its workers would not exist in them."""
    global _refresher_pid
    with _refresher_lock:
        if _refresher_pid != os.getpid():
            _refresher_pid = os.getpid()
            threading.Thread(target=_refresh_forever, name="stream-slots", daemon=True).start()


def _after_fork_in_child() -> None:
    """A forked process holds none of its parent's streams, and must not
    inherit a lock some other thread of the parent held at the fork."""
    global _worker_streams, _refresher_lock
    _worker_streams = _WorkerStreams()
    _refresher_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _refresh_forever() -> None:
    while True:
        time.sleep(REFRESH_SECONDS)
        try:
            stream_slots_refresh()
        except Exception:  # a refresher that died would let every open stream of this worker run out
            log.exception("refreshing stream slots failed")


def stream_slots_refresh() -> int:
    """Move the time of every slot this process holds SLOT_SECONDS ahead;
    how many there were."""
    slots = _worker_streams.counted()
    if not slots:
        return 0
    try:
        queues.script(_REFRESH)(keys=[slot.key for slot in slots],
                                args=[SLOT_SECONDS, *(slot.member for slot in slots)])
    except RedisError:  # the next refresh may get through before the slots run out
        log.warning("stream limit unavailable", exc_info=True)
    return len(slots)
