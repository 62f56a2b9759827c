"""Usage samples of running tasks: writing them (node agents), keeping them
bounded, flagging idle GPUs, and reading them for the API, the job page,
/metrics and the admin dashboard.

Retention: detailed samples (one per task every USAGE_SAMPLE_SECONDS) are
kept for USAGE_DETAIL_HOURS; older ones are folded into one averaged row per
task and minute, kept for USAGE_MINUTES_DAYS, then deleted. `usage_compact`
does it one minute of samples per transaction, so no transaction holds the
database's write lock for long (SQLite has one for the whole file), and a
call does at most `max_minutes` of them; node agents call it once a minute
(jobs/node/usage.py), one agent at a time. A cluster of 1,000 tasks sampled
every 5 s writes 17 million detailed rows a day; after compaction a task
keeps 1,440 rows a day.

Idle GPUs: `idle_since` (pure, tested on recorded series) says since when a
series of samples shows every GPU under the threshold; `idle_gpus_check`
keeps an IdleGpus row for each running task of a node that has been idle for
IDLE_GPU_MINUTES, and, with IDLE_GPU_POLICY=notify, tells its owner once.
With IDLE_GPU_POLICY=stop the notice also says when the job will be stopped
(`stop_deadline`: IDLE_GPU_STOP_GRACE_MINUTES after it), and a check that
finds the task still idle after that stops the whole job
(lifecycle.job_reclaim_idle_gpus: exit type IDLE_GPUS, never retried). A
task busy again in the meantime loses its flag, and with it the deadline.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Min, OuterRef, Q, Subquery

from jobs import formatting
from jobs.models import IdleGpus, Job, TaskAttempt, TaskState, TaskUsage
from jobs.services import db_clock, lifecycle, notifications, usage_rollup

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    attempt_id: int
    at: datetime
    cpu_percent: float
    memory_bytes: int
    network_rx_bytes: int = 0
    network_tx_bytes: int = 0
    block_read_bytes: int = 0
    block_write_bytes: int = 0
    gpus: list[dict[str, Any]] = field(default_factory=list)


# ------------------------------------------------------------------ writing


@dataclass(frozen=True)
class RunningTask:
    attempt_id: int
    container_id: str
    gpus: list[int]


def running_on_node(node_id: int) -> list[RunningTask]:
    """The node's running tasks with a container: what a sample round reads."""
    rows = TaskAttempt.objects.filter(node_id=node_id, state=TaskState.RUNNING).exclude(container_id="")
    return [RunningTask(pk, container_id, [int(i) for i in gpus or []])
            for pk, container_id, gpus in rows.order_by("id").values_list("id", "container_id", "gpus")]


def samples_record(samples: Sequence[Sample]) -> int:
    """Store a round of samples in one INSERT (SQLite caps one statement at
    999 values, so Django splits a round of more than 90 tasks; PostgreSQL
    takes any round in one) and, in the same transaction, mark the job
    attempts' minutes they fall in for the roll-up (usage_rollup.py)."""
    if not samples:
        return 0
    with transaction.atomic():
        rows = TaskUsage.objects.bulk_create([
            TaskUsage(attempt_id=s.attempt_id, at=s.at, cpu_percent=round(s.cpu_percent, 2),
                      memory_bytes=s.memory_bytes, network_rx_bytes=s.network_rx_bytes,
                      network_tx_bytes=s.network_tx_bytes, block_read_bytes=s.block_read_bytes,
                      block_write_bytes=s.block_write_bytes, gpus=s.gpus)
            for s in samples
        ])
        usage_rollup.minutes_mark(((row.attempt_id, row.at) for row in rows), stamp=max(row.pk for row in rows))
    return len(samples)


# ---------------------------------------------------------------- retention


def _average(rows: list[TaskUsage], at: datetime) -> TaskUsage:
    """One row standing for a task's detailed samples of one minute: means
    of CPU, memory and GPU use; the last of the counters (they only grow)."""
    n = len(rows)
    last = max(rows, key=lambda r: r.at)
    gpus: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        for gpu in row.gpus or []:
            gpus[int(gpu["index"])].append(gpu)
    return TaskUsage(
        attempt_id=rows[0].attempt_id, at=at, averaged=True,
        cpu_percent=round(sum(r.cpu_percent for r in rows) / n, 2),
        memory_bytes=sum(r.memory_bytes for r in rows) // n,
        network_rx_bytes=last.network_rx_bytes, network_tx_bytes=last.network_tx_bytes,
        block_read_bytes=last.block_read_bytes, block_write_bytes=last.block_write_bytes,
        gpus=[{"index": index, "utilPercent": round(sum(g["utilPercent"] for g in found) / len(found), 2),
               "memoryUsedBytes": sum(int(g["memoryUsedBytes"]) for g in found) // len(found)}
              for index, found in sorted(gpus.items())],
    )


def usage_compact(*, now: datetime | None = None, max_minutes: int = 60) -> int:
    """Fold detailed samples older than USAGE_DETAIL_HOURS into one-minute
    averages, oldest minute first, and delete averages older than
    USAGE_MINUTES_DAYS. Returns the detailed rows folded. Each minute is one
    transaction over whole minutes, so a sample is folded exactly once even
    if two callers race (the second finds the minute empty)."""
    now = now or db_clock.now()
    cutoff = (now - timedelta(hours=settings.USAGE_DETAIL_HOURS)).replace(second=0, microsecond=0)
    folded = 0
    for _ in range(max_minutes):
        oldest = TaskUsage.objects.filter(averaged=False, at__lt=cutoff).aggregate(at=Min("at"))["at"]
        if oldest is None:
            break
        start = oldest.replace(second=0, microsecond=0)
        # The minute's rows are read and replaced under the write lock
        # (SQLite's IMMEDIATE transactions, PostgreSQL's row locks): a
        # second caller that chose the same minute finds it empty.
        minute = TaskUsage.objects.filter(averaged=False, at__gte=start, at__lt=start + timedelta(minutes=1))
        with transaction.atomic():
            rows = list(minute.select_for_update())
            by_attempt: dict[int, list[TaskUsage]] = defaultdict(list)
            for row in rows:
                by_attempt[row.attempt_id].append(row)
            TaskUsage.objects.bulk_create([_average(group, start) for group in by_attempt.values()])
            minute.delete()
        folded += len(rows)
    TaskUsage.objects.filter(averaged=True, at__lt=now - timedelta(days=settings.USAGE_MINUTES_DAYS)).delete()
    return folded


# ---------------------------------------------------------------- idle GPUs


def idle_since(series: Sequence[tuple[datetime, Sequence[float]]], *, threshold: float,
               max_gap: timedelta) -> datetime | None:
    """Since when every GPU in the series has stayed under `threshold`
    percent, read back from its newest sample; None if the newest sample is
    busy or has no GPU figures. `series` is (time, GPU utilisations) oldest
    first. A gap longer than `max_gap` between samples (the agent was away)
    ends the run there: nothing is known of the time in between."""
    since = None
    newer: datetime | None = None
    for at, utils in reversed(series):
        if not utils or any(u >= threshold for u in utils):
            break
        if newer is not None and newer - at > max_gap:
            break
        since, newer = at, at
    return since


def _gpu_series(attempt_ids: Iterable[int], since: datetime) -> dict[int, list[tuple[datetime, list[float]]]]:
    found: dict[int, list[tuple[datetime, list[float]]]] = defaultdict(list)
    rows = TaskUsage.objects.filter(attempt_id__in=list(attempt_ids), at__gte=since).order_by("attempt_id", "at")
    for attempt_id, at, gpus in rows.values_list("attempt_id", "at", "gpus"):
        found[attempt_id].append((at, [float(g["utilPercent"]) for g in gpus or []]))
    return found


def idle_gpus_check(*, node_id: int, now: datetime | None = None) -> list[int]:
    """Flag the node's running tasks whose GPUs have been idle for
    IDLE_GPU_MINUTES, unflag those busy again; returns the flagged ids.
    Only tasks with GPU figures can be flagged: simulated GPUs report none."""
    now = now or db_clock.now()
    window = timedelta(minutes=settings.IDLE_GPU_MINUTES)
    max_gap = timedelta(seconds=max(3 * settings.USAGE_SAMPLE_SECONDS, 90))  # averaged rows are a minute apart
    running = [pk for pk, gpus in TaskAttempt.objects.filter(node_id=node_id, state=TaskState.RUNNING)
               .values_list("id", "gpus") if gpus]
    series = _gpu_series(running, now - window - max_gap)
    idle: dict[int, datetime] = {}
    for attempt_id in running:
        samples = series.get(attempt_id, [])
        since = idle_since(samples, threshold=settings.IDLE_GPU_PERCENT, max_gap=max_gap)
        fresh = bool(samples) and now - samples[-1][0] <= max_gap
        if since is not None and fresh and now - since >= window:
            idle[attempt_id] = since
    IdleGpus.objects.filter(attempt__node_id=node_id).exclude(attempt_id__in=list(idle)).delete()
    known = set(IdleGpus.objects.filter(attempt_id__in=list(idle)).values_list("attempt_id", flat=True))
    new = [IdleGpus(attempt_id=pk, since=since, flagged_at=now) for pk, since in idle.items() if pk not in known]
    IdleGpus.objects.bulk_create(new, ignore_conflicts=True)
    if settings.IDLE_GPU_POLICY in ("notify", "stop"):
        _notify_idle(now)
    if settings.IDLE_GPU_POLICY == "stop":
        _reclaim_idle(list(idle), now)
    return sorted(idle)


def _stop_grace() -> timedelta:
    return timedelta(minutes=settings.IDLE_GPU_STOP_GRACE_MINUTES)


def stop_deadline(flag: IdleGpus) -> datetime | None:
    """When IDLE_GPU_POLICY=stop stops the flagged task's job if its GPUs
    stay idle: the grace period after its owner was told (after the flag
    until the notice is out, which the same check sends). None under the
    other policies. A flag told under "notify" before a switch to "stop"
    counts as told: its deadline may be due at the first check."""
    if settings.IDLE_GPU_POLICY != "stop":
        return None
    return (flag.notified_at or flag.flagged_at) + _stop_grace()


def _notify_idle(now: datetime) -> None:
    stop_at = now + _stop_grace() if settings.IDLE_GPU_POLICY == "stop" else None
    # Running tasks only: any agent's check tells every flag, but only the
    # task's own node removes it, so a task that ended on a lost node keeps
    # a flag (made under IDLE_GPU_POLICY=flag) nobody must be told about.
    untold = IdleGpus.objects.filter(notified_at__isnull=True, attempt__state=TaskState.RUNNING)
    for flag in untold.select_related("attempt__task", "attempt__job__owner"):
        # Claimed first: two agents never tell the owner twice. The claim's
        # time is the one stop_deadline counts from, so the notice and the
        # pages give the same moment.
        if untold.filter(pk=flag.pk).update(notified_at=now) == 1:
            notifications.idle_gpus_notify(attempt=flag.attempt, since=flag.since, stop_at=stop_at)


def _reclaim_idle(idle: list[int], now: datetime) -> list[int]:
    """Stop the jobs of tasks this check found still idle whose owner was
    told at least the grace period ago; returns the jobs this call stopped.
    Only tasks idle in this round: one busy again has lost its flag above.
    The stop is claimed by a conditional UPDATE of the job, so two checks
    (two agents of a gang job's nodes, or a repeated check) stop it once."""
    due = (IdleGpus.objects.filter(attempt_id__in=idle, notified_at__lte=now - _stop_grace())
           .values_list("attempt__job_id", "attempt__number").distinct())
    stopped = []
    for job_id, number in sorted(set(due)):
        if lifecycle.job_reclaim_idle_gpus(job_id=job_id, number=number):
            log.info("job %s stopped: its GPUs stayed idle past IDLE_GPU_STOP_GRACE_MINUTES", job_id)
            stopped.append(job_id)
    return stopped


# ------------------------------------------------------------------ reading


def sample_json(row: TaskUsage) -> dict[str, Any]:
    """A sample as the REST API gives it."""
    return {
        "time": formatting.utc_millis(row.at),
        "cpuPercent": row.cpu_percent, "memoryBytes": row.memory_bytes,
        "networkRxBytes": row.network_rx_bytes, "networkTxBytes": row.network_tx_bytes,
        "blockReadBytes": row.block_read_bytes, "blockWriteBytes": row.block_write_bytes,
        "gpus": row.gpus or [],
    }


MAX_SAMPLES = 5000
# What one answer for a whole job (GET /api/v2/jobs/.../metrics) holds at
# most, over all its tasks: 1,000 tasks at MAX_SAMPLES each would be five
# million samples for one worker to hold. A job of up to four tasks still
# gets MAX_SAMPLES a task.
MAX_JOB_SAMPLES = 20000


def samples_per_task(tasks: int) -> int:
    """How many samples each of a job's `tasks` tasks gives in one answer."""
    return max(1, min(MAX_SAMPLES, MAX_JOB_SAMPLES // max(1, tasks)))


def task_samples(attempt_id: int, *, since: datetime | None = None, limit: int = MAX_SAMPLES) -> list[TaskUsage]:
    """A task attempt's samples, oldest first, at most `limit` of them (a
    month of averages is 43,200 rows; a graph needs far fewer): without
    `since` the newest; with it the oldest after it, so that passing the
    last one's time pages on through every sample.

    "After" counts in milliseconds, as sample_json writes times: a sample
    stored at 10:00:00.123456 is given as .123, and `since=...123` must not
    give it again."""
    return tasks_samples([attempt_id], since=since, limit=limit)[attempt_id]


# Attempts whose samples one query reads: two parameters each, under the
# 999 an SQLite build may allow a statement.
SAMPLES_QUERY_ATTEMPTS = 400


def tasks_samples(attempt_ids: Sequence[int], *, since: datetime | None = None,
                  limit: int = MAX_SAMPLES) -> dict[int, list[TaskUsage]]:
    """`task_samples` of many task attempts, by attempt id, in two queries
    per SAMPLES_QUERY_ATTEMPTS attempts (the job page's graphs poll a job of
    up to 1,000 tasks; one query per task was most of the answer's time).

    The first finds, per attempt, the time of the last sample it gives (the
    `limit`-th along the index); the second reads each attempt's samples up
    to that time along the index too, never the older ones a task keeps for
    a month."""
    found: dict[int, list[TaskUsage]] = {pk: [] for pk in attempt_ids}
    if since is not None:
        try:
            since = since.replace(microsecond=since.microsecond // 1000 * 1000) + timedelta(milliseconds=1)
        except OverflowError:  # since is in the last millisecond of the year 9999: nothing comes after it
            return found
    ids = list(found)
    for start in range(0, len(ids), SAMPLES_QUERY_ATTEMPTS):
        for attempt_id, rows in _samples_of(ids[start:start + SAMPLES_QUERY_ATTEMPTS], since, limit).items():
            found[attempt_id] = rows
    return found


def _samples_of(attempt_ids: list[int], after: datetime | None, limit: int) -> dict[int, list[TaskUsage]]:
    """Samples at or after `after` (the oldest `limit` of them) or, without
    it, the newest `limit`, oldest first."""
    rows = TaskUsage.objects.all() if after is None else TaskUsage.objects.filter(at__gte=after)
    order = "-at" if after is None else "at"
    edge = rows.filter(attempt_id=OuterRef("pk")).order_by(order).values("at")[limit - 1:limit]
    edges = TaskAttempt.objects.filter(pk__in=attempt_ids).annotate(edge=Subquery(edge)).values_list("pk", "edge")
    wanted = [Q(attempt_id=attempt_id) if at is None else Q(attempt_id=attempt_id, at__gte=at) if after is None
              else Q(attempt_id=attempt_id, at__lte=at) for attempt_id, at in edges]
    if not wanted:
        return {}
    by_attempt: dict[int, list[TaskUsage]] = defaultdict(list)
    for row in rows.filter(Q(*wanted, _connector=Q.OR)).order_by("attempt_id", "at", "id"):
        by_attempt[row.attempt_id].append(row)
    # Samples at the same moment as the edge may be more than `limit`.
    return {pk: found[-limit:] if after is None else found[:limit] for pk, found in by_attempt.items()}


def idle_job_ids(job_ids: Iterable[int]) -> dict[int, datetime | None]:
    """Which of these jobs have a task flagged for idle GPUs (the job list's
    badge), each with when IDLE_GPU_POLICY=stop will stop it (its earliest
    task's deadline; None under the other policies)."""
    flags = IdleGpus.objects.filter(attempt__job_id__in=list(job_ids), attempt__state=TaskState.RUNNING)
    found: dict[int, datetime | None] = {}
    for job_id, flagged_at, notified_at in flags.values_list("attempt__job_id", "flagged_at", "notified_at"):
        deadline = stop_deadline(IdleGpus(flagged_at=flagged_at, notified_at=notified_at))
        earlier = found.get(job_id)
        if job_id not in found or (deadline and earlier and deadline < earlier):
            found[job_id] = deadline
    return found


@dataclass(frozen=True)
class IdleTask:
    """A flagged task as the job page shows it."""

    attempt: TaskAttempt
    since: datetime
    stop_at: datetime | None  # IDLE_GPU_POLICY=stop: when its job will be stopped


def idle_tasks_of(job: Job) -> list[IdleTask]:
    flags = (IdleGpus.objects.filter(attempt__job=job, attempt__state=TaskState.RUNNING)
             .select_related("attempt__task").order_by("since"))
    return [IdleTask(flag.attempt, flag.since, stop_deadline(flag)) for flag in flags]


# A job page shows a notice per flagged task up to this many; past it, one
# notice for them all: a 1,000-task job whose GPUs all idle would otherwise
# open its Usage panel with 1,000 paragraphs.
IDLE_NOTICES_MAX = 5
IDLE_NAMES_SHOWN = 20


@dataclass(frozen=True)
class IdleSummary:
    """The flagged tasks of a job past IDLE_NOTICES_MAX, as one notice."""

    count: int
    since: datetime  # the earliest flag's
    stop_at: datetime | None  # the earliest deadline: the job stops at the first
    names: list[str]  # the first IDLE_NAMES_SHOWN, <role>-<index> in task order

    @property
    def more(self) -> int:
        return self.count - len(self.names)


def idle_summary(idle: list[IdleTask]) -> IdleSummary | None:
    if len(idle) <= IDLE_NOTICES_MAX:
        return None
    deadlines = [flag.stop_at for flag in idle if flag.stop_at is not None]
    tasks = sorted((flag.attempt.task for flag in idle), key=lambda task: (task.role, task.index))
    return IdleSummary(len(idle), min(flag.since for flag in idle), min(deadlines, default=None),
                       [str(task) for task in tasks[:IDLE_NAMES_SHOWN]])


def idle_attempt_ids(attempt_ids: Iterable[int]) -> set[int]:
    flags = IdleGpus.objects.filter(attempt_id__in=list(attempt_ids), attempt__state=TaskState.RUNNING)
    return set(flags.values_list("attempt_id", flat=True))


def sample_seconds() -> float:
    return float(settings.USAGE_SAMPLE_SECONDS)


def stalled_seconds() -> float:
    """How much older than the newest of its neighbours a running task's
    newest sample may be before it counts as having no recent samples (its
    node's sampler is away): ten sample periods, at least two minutes."""
    return max(120.0, 10 * max(2.0, sample_seconds()))


def newest_sample_times(attempt_ids: Iterable[int]) -> dict[int, datetime]:
    """Each task attempt's newest sample time; those with none are left out.
    One query, one step along the (attempt, at) index per attempt: a
    GROUP BY would read a task's day of detailed samples."""
    newest = TaskUsage.objects.filter(attempt_id=OuterRef("pk")).order_by("-at").values("at")[:1]
    rows = TaskAttempt.objects.filter(pk__in=list(attempt_ids)).annotate(newest=Subquery(newest))
    return {pk: at for pk, at in rows.values_list("pk", "newest") if at is not None}


def stalled_attempt_ids(running_ids: Sequence[int]) -> set[int]:
    """Which of these running task attempts have no recent samples: none at
    all, or their newest more than stalled_seconds() older than the newest
    of them all. Measured against each other, not the portal's clock: nodes
    sample on their own clocks."""
    newest = newest_sample_times(running_ids)
    latest = max(newest.values(), default=None)
    return {pk for pk in running_ids
            if pk not in newest or (latest - newest[pk]).total_seconds() > stalled_seconds()}


# A job of more tasks than this gets job-wide graphs on its page (sums,
# means and the least and most busy task) and one task's graphs picked from
# a menu, instead of three graphs per task: a 1,000-task job would hold
# 3,000 canvases, 400,000 px tall on a phone.
JOB_WIDE_TASKS = 8


def job_wide_graphs(tasks: int) -> bool:
    return tasks > JOB_WIDE_TASKS
