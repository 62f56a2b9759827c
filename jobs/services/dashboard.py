"""The admin dashboard's figures over time (read-only, a selector).

Built from rows the portal keeps anyway, so it needs no recorder of its own:

- jobs waiting and running per virtual cluster: each job attempt waits from
  its creation until it starts (or ends unstarted) and runs until it ends;
- GPUs in use per virtual cluster and per user: each task attempt holds its
  GPUs from its placement until it ends;
- CPU cores and memory in use: the usage samples (jobs/services/usage.py),
  summed per minute in the database and weighted by the time each sample
  stands for (USAGE_SAMPLE_SECONDS for a detailed one, 60 s for an average).

The intervals are counted in the database: a busy lab's week holds millions
of task attempts, which read into Python took seconds and hundreds of MB a
view (bench/dashboard.py). One query per figure sums the weights of the
intervals that start and stop at the same buckets, per key; a running sum
over count + 1 changes per key then gives each series, exactly as counting
each interval did (`_count_intervals`, the reference the tests hold the
queries to). The page keeps each window's answer DASHBOARD_CACHE_SECONDS
(`dashboard_figures`), so that many admins opening it cost one computation,
also the moment it runs out: one computes, the others wait for it or are
shown the answer before.

GPUs in the cluster (and each virtual cluster's share of them, for its free
GPUs) is today's count of ready nodes' GPUs: nodes keep no history, so a
node that joined or left within the window is not reflected.
Each figure is the value at the start of its bucket.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db import NotSupportedError
from django.db.models import (BigIntegerField, Count, DateTimeField, F, Field, Func, IntegerField, Min, Q, QuerySet,
                              Sum, Value)
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from jobs.models import IdleGpus, JobAttempt, Node, TaskAttempt, TaskUsage, User, VirtualCluster
from jobs.services.sql_time import EpochSeconds

# Window (hours) -> bucket (minutes): about 70 to 100 points a graph.
WINDOWS = {6: 5, 24: 15, 168: 120}
TOP_USERS = 8
Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class Buckets:
    start: datetime
    step: timedelta
    count: int

    def index(self, at: datetime) -> int:
        """The first bucket starting at or after `at` (clamped to the window)."""
        if at <= self.start:
            return 0
        whole, rest = divmod(at - self.start, self.step)
        return min(self.count, whole + (1 if rest else 0))

    def times(self) -> list[float]:
        return [(self.start + i * self.step).timestamp() for i in range(self.count)]


def buckets_for(hours: int, now: datetime) -> Buckets:
    step = timedelta(minutes=WINDOWS[hours])
    end = now - (now - now.replace(hour=0, minute=0, second=0, microsecond=0)) % step + step
    count = int(timedelta(hours=hours) / step) + 1
    return Buckets(start=end - count * step, step=step, count=count)


def _running(changes: list[int]) -> list[int]:
    """A series from its count + 1 changes (the last, at the window's end, is dropped)."""
    running, values = 0, []
    for change in changes[:-1]:
        running += change
        values.append(running)
    return values


def _spans_to_series(count: int, spans: Iterable[tuple[Key, int, int, int]]) -> dict[Key, list[int]]:
    """{key: [sum of the weights covering each bucket's start]} for (key, first
    bucket, bucket it stops at, weight) spans; a key appears once a span of
    it covers a bucket, in the order the spans come."""
    deltas: dict[Key, list[int]] = defaultdict(lambda: [0] * (count + 1))
    for key, first, last, weight in spans:
        if first < last:
            deltas[key][first] += weight
            deltas[key][last] -= weight
    return {key: _running(changes) for key, changes in deltas.items()}


def _count_intervals(buckets: Buckets, intervals: Iterable[tuple[str, datetime, datetime | None, int]]
                     ) -> dict[str, list[int]]:
    """{key: [sum of the weights of the intervals covering each bucket's start]}
    for (key, from, until or None, weight) intervals, counted in Python: the
    reference the database's counting (`_interval_spans`) is held to."""
    return _spans_to_series(buckets.count, (
        (key, buckets.index(begin), buckets.index(end) if end is not None else buckets.count, weight)
        for key, begin, end, weight in intervals))


class MinuteOf(Func):
    """The minute a timestamp falls in, to sum usage samples by: on SQLite
    the text 'YYYY-MM-DD HH:MM' (Django stores UTC as text; cutting it costs
    a fraction of strftime(), which took half the read of a week's million
    samples), on PostgreSQL whole minutes since 1970. `_minute_start` reads
    either."""

    output_field = Field()

    def as_sqlite(self, compiler, connection, **extra):
        at, params = compiler.compile(self.source_expressions[0])
        return f"substr({at}, 1, 16)", params

    def as_postgresql(self, compiler, connection, **extra):
        at, params = compiler.compile(self.source_expressions[0])
        return f"(CAST(FLOOR(EXTRACT(EPOCH FROM {at})) AS BIGINT) / 60)", params

    def as_sql(self, compiler, connection, **extra):
        raise NotSupportedError(f"MinuteOf is written for SQLite and PostgreSQL, not {connection.vendor}")


def _minute_start(minute: str | int) -> int:
    """A MinuteOf value as epoch seconds."""
    if isinstance(minute, str):
        return int(datetime.fromisoformat(minute).replace(tzinfo=dt_timezone.utc).timestamp())
    return minute * 60


class GpuCount(Func):
    """The length of a task attempt's `gpus` list."""

    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, function="json_array_length", **extra)

    def as_postgresql(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, function="jsonb_array_length", **extra)


def _whole(value: int) -> Value:
    return Value(value, output_field=BigIntegerField())


def _window_seconds(buckets: Buckets) -> tuple[int, int]:
    """The first bucket's start (epoch) and the step, in seconds."""
    start, step = buckets.start.timestamp(), buckets.step.total_seconds()
    if start % 1 or step % 1:
        raise ValueError("the database counts buckets that start and last whole seconds")
    return int(start), int(step)


def _bucket_after(at: Any, buckets: Buckets) -> Any:
    """Buckets.index in SQL: how many bucket starts come before `at` (0 to count)."""
    start, step = _window_seconds(buckets)
    since = Greatest(EpochSeconds(at, up=True), _whole(start)) - _whole(start)
    return Least(_whole(buckets.count), (since + _whole(step - 1)) / _whole(step))


def _interval_spans(buckets: Buckets, rows: QuerySet, *, keys: tuple[str, ...], begin: Any, end: Any,
                    weight: Any) -> list[tuple[tuple, int, int, int]]:
    """The intervals of `rows` (from `begin` until `end`, or still open when
    NULL) as (key values, first bucket, bucket it stops at, summed weight),
    one row per key and pair of buckets met: about as many as jobs that
    started or ended in the window, not one per task attempt or sample.
    Ordered by the first row (by id) of each span, so that a key comes
    first where its first interval did when they were read one by one."""
    # An open interval runs to the window's end, counted in elapsed seconds
    # as Buckets.index counts (wall-clock arithmetic in a zone with summer
    # time would end an hour early or late).
    start, step = _window_seconds(buckets)
    window_end = datetime.fromtimestamp(start + buckets.count * step, dt_timezone.utc)
    spans = (rows.annotate(first=_bucket_after(begin, buckets),
                           last=_bucket_after(Coalesce(end, Value(window_end, output_field=DateTimeField())), buckets))
             .values_list(*keys, "first", "last").annotate(weight=weight, first_id=Min("id")).order_by("first_id"))
    return [(tuple(key), first, last, total) for *key, first, last, total, _ in spans]


def _by(spans: list[tuple[tuple, int, int, int]], part: int, names: dict[int, str]
        ) -> Iterator[tuple[str, int, int, int]]:
    return ((names[key[part]], first, last, weight) for key, first, last, weight in spans)


def _names(model: Any, field: str, ids: Iterable[int]) -> dict[int, str]:
    return dict(model.objects.filter(pk__in=set(ids)).values_list("pk", field))


def _jobs(buckets: Buckets, end: datetime) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    attempts = JobAttempt.objects.filter(created_at__lt=end).filter(Q(finished_at__isnull=True) |
                                                                     Q(finished_at__gte=buckets.start))
    keys = ("job__virtual_cluster_id",)
    waiting = _interval_spans(buckets, attempts, keys=keys, begin=F("created_at"),
                              end=Coalesce("started_at", "finished_at"), weight=Count("id"))
    running = _interval_spans(buckets, attempts.filter(started_at__isnull=False), keys=keys,
                              begin=F("started_at"), end=F("finished_at"), weight=Count("id"))
    names = _names(VirtualCluster, "name", (key[0] for key, *_ in waiting))
    return (_spans_to_series(buckets.count, _by(waiting, 0, names)),
            _spans_to_series(buckets.count, _by(running, 0, names)))


def _gpus(buckets: Buckets, end: datetime) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    held = (TaskAttempt.objects.filter(assigned_at__lt=end).exclude(gpus=[])
            .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=buckets.start)))
    spans = _interval_spans(buckets, held, keys=("job__virtual_cluster_id", "job__owner_id"),
                            begin=F("assigned_at"), end=F("finished_at"), weight=Sum(GpuCount("gpus")))
    vcs = _names(VirtualCluster, "name", (key[0] for key, *_ in spans))
    owners = _names(User, "username", (key[1] for key, *_ in spans))
    users = _spans_to_series(buckets.count, _by(spans, 1, owners))
    top = sorted(users, key=lambda u: -max(users[u]))[:TOP_USERS]
    return _spans_to_series(buckets.count, _by(spans, 0, vcs)), {user: users[user] for user in sorted(top)}


def _bucket_seconds(buckets: Buckets, now: datetime) -> list[float]:
    """The seconds of each bucket gone by at `now`: the whole step but for
    the last one, which holds now and has samples only up to it."""
    step = buckets.step.total_seconds()
    return [min(step, max(1.0, (now - (buckets.start + i * buckets.step)).total_seconds()))
            for i in range(buckets.count)]


def _samples(buckets: Buckets, end: datetime, now: datetime) -> tuple[list[float], list[float]]:
    """CPU cores and GiB of memory in use, averaged over each bucket (the
    last one over its time so far)."""
    cores = [0.0] * buckets.count
    memory = [0.0] * buckets.count
    spans = _bucket_seconds(buckets, now)
    start, step = _window_seconds(buckets)
    for averaged in (False, True):  # one query each, along the (averaged, at) index
        # Summed per minute (since 1970), as they were read before the
        # database counted the buckets: the same sums, added in the same order.
        # averaged=Value(...): Django writes `averaged=False` as NOT "averaged",
        # which SQLite can take along the index only with ANALYZE's figures
        # (a skip-scan), and the portal never runs ANALYZE: it read every
        # sample of USAGE_MINUTES_DAYS. "averaged" = false is a plain prefix.
        rows = (TaskUsage.objects.filter(averaged=Value(averaged), at__gte=buckets.start, at__lt=end)
                .annotate(minute=MinuteOf("at")).values_list("minute")
                .annotate(cpu=Sum("cpu_percent"), mem=Sum("memory_bytes")).order_by("minute"))
        seconds = 60.0 if averaged else settings.USAGE_SAMPLE_SECONDS
        for minute, cpu, mem in rows:
            i = min(buckets.count - 1, int((_minute_start(minute) - start) / step))
            cores[i] += (cpu or 0.0) / 100.0 * seconds / spans[i]
            memory[i] += (mem or 0) / 2**30 * seconds / spans[i]
    return [round(c, 2) for c in cores], [round(m, 3) for m in memory]


def _tasks(buckets: Buckets, end: datetime) -> list[int]:
    """Task containers running (from their start to their end)."""
    rows = TaskAttempt.objects.filter(started_at__lt=end).filter(Q(finished_at__isnull=True) |
                                                                 Q(finished_at__gte=buckets.start))
    spans = _interval_spans(buckets, rows, keys=(), begin=F("started_at"), end=F("finished_at"), weight=Count("id"))
    series = _spans_to_series(buckets.count, (("tasks", first, last, weight) for _, first, last, weight in spans))
    return series.get("tasks", [0] * buckets.count)


def _figures(hours: int, now: datetime) -> dict[str, Any]:
    """Everything the dashboard draws but each virtual cluster's free GPUs."""
    buckets = buckets_for(hours, now)
    end = buckets.start + buckets.count * buckets.step
    waiting, running = _jobs(buckets, end)
    gpus_vc, gpus_user = _gpus(buckets, end)
    cores, memory = _samples(buckets, end, now)
    total = sum(len(node.gpus) for node in Node.objects.filter(status=Node.Status.READY).only("gpus"))
    return {"times": buckets.times(), "gpusTotal": total, "gpusByVc": gpus_vc, "gpusByUser": gpus_user,
            "waitingByVc": waiting, "runningByVc": running, "tasksRunning": _tasks(buckets, end),
            "cpuCores": cores, "memoryGiB": memory}


def _with_free(figures: dict[str, Any], vc_gpus: dict[str, int] | None) -> dict[str, Any]:
    """The figures and each virtual cluster's free GPUs: its share today less what it used."""
    count = len(figures["times"])
    free = {vc: [max(0, share - used) for used in figures["gpusByVc"].get(vc, [0] * count)]
            for vc, share in (vc_gpus or {}).items() if share}
    return {**figures, "gpusFreeByVc": free}


def cluster_over_time(*, hours: int, vc_gpus: dict[str, int] | None = None,
                      now: datetime | None = None) -> dict[str, Any]:
    """Everything the dashboard draws, JSON-ready (times in epoch seconds).
    `vc_gpus`: each virtual cluster's GPUs today (its share), for its free GPUs."""
    return _with_free(_figures(hours, now or timezone.now()), vc_gpus)


# The page's cache of each window (`dashboard_figures`). An entry is fresh
# DASHBOARD_CACHE_SECONDS and kept STALE_FACTOR times as long, to be shown
# while one process computes its successor: when a fresh entry ends, the first
# view takes the window's lock (cache.add) and computes; the others are shown
# the entry before, or, with none, wait for the computer's. The lock lapses
# after COMPUTE_LOCK_SECONDS, so a computer that died holding it delays the
# others no longer than that.
STALE_FACTOR = 5
COMPUTE_LOCK_SECONDS = 30
WAIT_POLL_SECONDS = 0.05


def cache_key(hours: int) -> str:
    return f"dashboard:window:{hours}"  # hours is one of WINDOWS (the view's choice)


def _compute_and_keep(hours: int, lock: str, token: str) -> dict[str, Any]:
    """Compute a window's figures holding its lock, keep them, free the lock."""
    try:
        figures = _figures(hours, timezone.now())
        seconds = settings.DASHBOARD_CACHE_SECONDS
        # A plain dict (pickled into the cache): a class of ours would tie
        # entries to the code that kept them.
        kept = {"computed": time.time(), "figures": figures}
        cache.set(cache_key(hours), kept, timeout=max(1, math.ceil(seconds * STALE_FACTOR)))
        return figures
    finally:
        # Not atomic: a lock that lapsed while we computed and was taken
        # again may be freed early, costing at most one more computation.
        if cache.get(lock) == token:
            cache.delete(lock)


def _kept_figures(hours: int) -> dict[str, Any]:
    """The window's figures from the cache, computed by one caller at a time."""
    key, lock = cache_key(hours), f"{cache_key(hours)}:computing"
    seconds = settings.DASHBOARD_CACHE_SECONDS
    deadline = time.monotonic() + COMPUTE_LOCK_SECONDS + 1
    kept = cache.get(key)
    while True:
        if kept is not None and time.time() - kept["computed"] < seconds:
            return kept["figures"]
        token = uuid.uuid4().hex
        if cache.add(lock, token, timeout=COMPUTE_LOCK_SECONDS):
            return _compute_and_keep(hours, lock, token)
        if kept is not None:
            return kept["figures"]  # stale, while another computes its successor
        if time.monotonic() > deadline:  # the cache lost the lock's expiry, say
            return _figures(hours, timezone.now())
        time.sleep(WAIT_POLL_SECONDS)
        kept = cache.get(key)


def dashboard_figures(*, hours: int, vc_gpus: dict[str, int] | None = None) -> dict[str, Any]:
    """cluster_over_time now, as the page shows it: each window's figures are
    kept DASHBOARD_CACHE_SECONDS in Django's cache, shared by every admin
    (they see the same cluster), so a room of them opening the page costs one
    computation, also when the figures run out (`_kept_figures`). The free
    GPUs follow today's shares at every view."""
    if settings.DASHBOARD_CACHE_SECONDS <= 0:
        return _with_free(_figures(hours, timezone.now()), vc_gpus)
    return _with_free(_kept_figures(hours), vc_gpus)


def idle_gpu_tasks() -> list[IdleGpus]:
    """Tasks flagged for idle GPUs, oldest first (the dashboard lists them)."""
    return list(IdleGpus.objects.filter(attempt__state="RUNNING")
                .select_related("attempt__task", "attempt__job__owner").order_by("since"))
