"""The cluster's one clock: the database server's.

Every process of the portal (web workers, node agents on their own hosts,
RQ workers) writes times that others compare: heartbeats, when a task was
assigned, launched, started and ended, usage samples. A host's own clock
may be off by minutes (no NTP, a VM resumed), so:
- heartbeats are stamped and judged by the database's clock itself
  (`database_now`, a query each time): a node agent declares other nodes
  lost by them, and an error there fails tasks;
- other times are this host's clock corrected by its measured offset from
  the database's (`now`, `from_local`), measured again every
  CHECK_SECONDS or at once when this host's clock steps, and applied only
  when it is at least TOLERANCE: times from a well-kept clock, and those
  the Docker engine reports, are stored as they are.

On SQLite the database is a library in this process: its clock is this
host's, as is every process's that can open the file, and the offset is 0.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

CHECK_SECONDS = 60.0
TOLERANCE = timedelta(seconds=1)
# This host's clock moved this much against its monotonic one since the
# offset was measured: stepped (set by hand, NTP, a VM resumed).
STEP_SECONDS = 1.0


def database_now() -> datetime:
    """The database server's clock now (PostgreSQL's statement_timestamp(),
    not now(): that is the transaction's start); on SQLite this host's."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


@dataclass(frozen=True)
class _Offset:
    offset: timedelta  # the database's clock minus this host's, as applied
    checked: float  # time.monotonic() when measured
    wall_minus_monotonic: float  # time.time() - time.monotonic() then


_lock = threading.Lock()
_measured: _Offset | None = None


def _measure() -> _Offset:
    """One round trip, read as NTP does: the database's time is taken to
    be that of the round trip's middle on this host's clock."""
    before = timezone.now()
    at = database_now()
    after = timezone.now()
    offset = at - (before + (after - before) / 2)
    applied = offset if abs(offset) >= TOLERANCE else timedelta(0)
    return _Offset(applied, time.monotonic(), time.time() - time.monotonic())


def offset() -> timedelta:
    """What to add to this host's clock to read the database's, within
    TOLERANCE; 0 on SQLite."""
    global _measured
    if connection.vendor != "postgresql":
        return timedelta(0)
    known = _measured
    stepped = known is not None and abs(time.time() - time.monotonic() - known.wall_minus_monotonic) > STEP_SECONDS
    if known is None or stepped or time.monotonic() - known.checked > CHECK_SECONDS:
        try:
            known = _measure()
        except Exception:  # noqa: BLE001 -- the database away: the last offset known is the best guess
            if known is None:
                return timedelta(0)
        else:
            with _lock:
                _measured = known
    return known.offset


def now() -> datetime:
    """The cluster's time now: this host's clock, corrected."""
    return timezone.now() + offset()


def from_local(at: datetime | None) -> datetime | None:
    """A time read from this host's clock (the Docker engine's StartedAt,
    say) on the cluster's clock."""
    return None if at is None else at + offset()
