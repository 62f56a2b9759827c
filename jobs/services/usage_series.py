"""A job's usage as a whole, over time: the job page's job-wide graphs of a
job of more than usage.JOB_WIDE_TASKS tasks, and the REST API's
`jobs/{user}~{name}/metrics/summary`.

They were added up in the browser from the per-task samples of one v2
metrics answer, which holds at most usage.MAX_JOB_SAMPLES over all tasks:
a 1,000-task job's graphs reached back 20 samples (100 s). Here the
database adds them up, so an answer's depth does not shrink with the task
count and its size does not grow with it.

Time is cut into buckets `width` seconds wide, aligned to the epoch (so a
poll that asks for the buckets after the last one it has gets the same
edges), wide enough that a window gives at most MAX_POINTS of them and
that every task sampled steadily has a sample in each (twice the sample
period; a minute where one-minute averages are read, or where the window's
raw samples are over the budget, below). Within a bucket narrower than a
minute each task counts once, as the mean of its samples there (a task
sampled twice in a bucket must not count twice in a sum); each GPU
likewise. Then, over the tasks: how many were sampled, CPU cores in use
(cpu_percent / 100) and memory summed, CPU per task and GPU utilisation as
mean, least and most busy.

A bucket of a minute or more is made of whole minutes, each added up as
above (a one-minute bucket is exactly that), then over its minutes:
`tasks` and `gpus` the most sampled in one minute; cores and memory the
mean, over its minutes with samples, of the minutes' sums; CPU per task
and GPU utilisation the mean over every task (GPU) minute, the least and
most busy task (GPU) in any one minute. For tasks sampled steadily through
the bucket the sums and means are what its samples give when each task
counts once in the bucket; the least and most busy are those of single
minutes, so they spread at least as wide.

Cost: reading raw samples is the cost (a 1,000-task job's hour is 720,000
of them, about 3 s on SQLite), so a summary reads at most
USAGE_SUMMARY_MAX_SAMPLES of them (`samples_read` estimates a window's
from the attempt's task count). Whole minutes come from the roll-up
(jobs/services/usage_rollup.py: a row per job attempt and minute, and a
mark on every minute whose samples changed since its row was written).
Raw samples are read for buckets narrower than a minute when the window's
fit the budget, and for the minutes from the oldest marked one on, if that
is within the newest budget's worth of minutes (normally the last one or
two, not rolled up yet). A minute marked before that (a sample that came
very late, or a roll-up far behind) gives its row as it stands until the
roll-up catches up, about a minute later.

Aggregates are computed in SQL, in queries whose count does not grow with
the tasks; only the bucket and JSON expressions differ between SQLite and
PostgreSQL. Only whole buckets are given: one still being sampled (or
whose samples a node has not written yet, see `settle_seconds`) would dip
and then be given again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Min, QuerySet
from django.utils import timezone

from jobs.models import JobUsageMinute, TaskAttempt, TaskUsage, UsageMinuteMark
from jobs.services.sql_time import epoch_seconds_sql

# At most this many buckets in one answer: a graph a few hundred pixels wide
# shows no more, and an hour of a job sampled every 5 s is 360 of 10 s.
MAX_POINTS = 360
# Bucket widths to choose from (seconds): round ones, so edges fall on whole
# minutes and hours.
WIDTHS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
DEFAULT_WINDOW = 3600
# GPUs of one task counted at most (a node has 8 or 16).
MAX_GPUS = 32
MIN_WINDOW = 60
MINUTE = 60


@dataclass(frozen=True)
class Spread:
    mean: float
    least: float
    most: float


@dataclass(frozen=True)
class Bucket:
    start: datetime
    tasks: int  # tasks with a sample in the bucket (the most in one minute of a wide one)
    cpu_cores: float  # summed over them, 1.0 = one core busy
    cpu_percent: Spread  # per task
    memory_bytes: int  # summed
    gpus: int  # GPUs with figures (none for simulated GPUs)
    gpu_percent: Spread | None


@dataclass(frozen=True)
class JobSeries:
    width: int  # seconds
    start: datetime  # of the window asked for, a bucket edge
    end: datetime  # buckets end at or before it: the newest whole one's end
    buckets: list[Bucket]


@dataclass(frozen=True)
class Figures:
    """The tasks of a bucket of raw samples (or of one minute, as
    JobUsageMinute keeps it) added up, each task once as the mean of its
    samples there and each of its GPUs likewise: sums and counts, so that
    buckets add up into wider ones."""

    tasks: int
    cpu_sum: float  # CPU percent, summed over the tasks
    cpu_min: float
    cpu_max: float
    memory_sum: float  # bytes
    gpus: int  # GPUs with figures
    gpu_sum: float  # their utilisation percent, summed
    gpu_min: float | None
    gpu_max: float | None


def max_window_seconds() -> int:
    """As far back as samples are kept (one-minute averages): the longest
    window any job may ask for, whatever its task count."""
    return int(settings.USAGE_MINUTES_DAYS * 86400)


def samples_read(*, tasks: int, window_seconds: float) -> int:
    """The most raw samples a window of `tasks` tasks holds: one per task
    every sample period within USAGE_DETAIL_HOURS, one a minute before.
    Cheap (no query) and never under the count for tasks sampled steadily."""
    detail = min(window_seconds, settings.USAGE_DETAIL_HOURS * 3600)
    per_task = detail / settings.USAGE_SAMPLE_SECONDS + (window_seconds - detail) / 60
    return math.ceil(tasks * per_task)


def longest_raw_window(*, tasks: int) -> int:
    """The longest window (seconds) whose samples_read fits the budget, at
    most max_window_seconds(); under a minute for a job too big for any."""
    budget = settings.USAGE_SUMMARY_MAX_SAMPLES / max(1, tasks)  # samples per task
    detail = settings.USAGE_DETAIL_HOURS * 3600
    if budget * settings.USAGE_SAMPLE_SECONDS <= detail:
        longest = budget * settings.USAGE_SAMPLE_SECONDS
    else:
        longest = detail + (budget - detail / settings.USAGE_SAMPLE_SECONDS) * 60
    return min(max_window_seconds(), math.floor(longest))


def bucket_width(window_seconds: int, *, tasks: int = 0) -> int:
    """The narrowest round width that cuts `window_seconds` into at most
    MAX_POINTS buckets and that each steadily sampled task has a sample in:
    two sample periods, or a minute once the window reaches back to the
    one-minute averages (older than USAGE_DETAIL_HOURS) or once its raw
    samples of `tasks` tasks would be over the budget (then whole minutes
    come from the roll-up)."""
    least = 2 * settings.USAGE_SAMPLE_SECONDS
    if (window_seconds > settings.USAGE_DETAIL_HOURS * 3600
            or samples_read(tasks=tasks, window_seconds=window_seconds) > settings.USAGE_SUMMARY_MAX_SAMPLES):
        least = max(least, MINUTE)
    least = max(least, window_seconds / MAX_POINTS)
    return next((w for w in WIDTHS if w >= least), WIDTHS[-1] * math.ceil(least / WIDTHS[-1]))


def settle_seconds() -> float:
    """How long after a bucket's end its samples are taken to be in: a node
    writes a round a moment after it samples, and its clock may run a little
    behind the others'. The roll-up rolls a minute up only after it too."""
    return max(5.0, 2 * settings.USAGE_SAMPLE_SECONDS)


def job_series(*, job_id: int, number: int, window_seconds: int = DEFAULT_WINDOW, since: datetime | None = None,
               now: datetime | None = None, tasks: int | None = None) -> JobSeries:
    """The whole buckets of the job's attempt `number` over the last
    `window_seconds`, oldest first, only those starting after `since` if
    given (a poll passes the start of the newest bucket it has). Buckets no
    task has a sample in are left out. `tasks`: the attempt's task count,
    if the caller has it."""
    now = now or timezone.now()
    attempts = TaskAttempt.objects.filter(job_id=job_id, number=number)
    tasks = attempts.count() if tasks is None else tasks
    width = bucket_width(window_seconds, tasks=tasks)
    first = _epoch(now - timedelta(seconds=window_seconds)) // width
    if since is not None:
        first = max(first, _epoch(since) // width + 1)
    stop = int((_epoch(now) - settle_seconds()) // width)  # the first bucket not yet whole
    if first >= stop:  # nothing whole after `since` (which may be in the year 9999)
        return JobSeries(width, _time(stop * width), _time(stop * width), [])
    start, end = _time(first * width), _time(stop * width)
    if width < MINUTE:
        gpus = gpu_positions(attempts)
        sums = {b: _Sum.of(figures_of(row, gpus)) for b, *row in _raw(_Where(job_id, number, start, end), width, gpus)}
    else:
        sums = _minute_sums(_Where(job_id, number, start, end), width=width, tasks=tasks, attempts=attempts)
    return JobSeries(width, start, end, [sums[b].bucket(_time(b * width)) for b in sorted(sums)])


def _epoch(at: datetime) -> int:
    return math.floor(at.timestamp())


def _time(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def gpu_positions(attempts: QuerySet[TaskAttempt]) -> int:
    """The most GPUs one of these task attempts holds: as many GPU columns
    in the queries."""
    return min(MAX_GPUS, max((len(held or []) for held in attempts.values_list("gpus", flat=True).distinct()),
                             default=0))


# ------------------------------------------------------------- raw samples


def bucket_sql(column: str) -> str:
    """The bucket number of a time column: whole seconds since the epoch,
    divided by the width (the query's first parameter; integers divide to
    an integer)."""
    return f"({epoch_seconds_sql(column, connection.vendor)} / %s)"


def _gpu_sql(column: int, gpus: int) -> str:
    """The utilisation in a sample of its task's `column`-th GPU, as its task
    attempt holds them (`a.gpus`, node GPU indexes), NULL if the sample has
    no figure for it. Matched on the GPU's `index`, not on its place in the
    sample's list: the sampler skips a GPU NVML cannot read, which moves
    the next ones up, and a task's GPUs must not be averaged with each
    other within a bucket. It looks first where the sampler writes it (in
    the task's order), so a steady task costs one comparison per GPU."""
    places = [column, *(p for p in range(gpus) if p != column)]
    if connection.vendor == "postgresql":
        held = f"(a.gpus -> {column:d})"
        whens = [f"WHEN u.gpus -> {p:d} -> 'index' = {held} "
                 f"THEN CAST(u.gpus -> {p:d} ->> 'utilPercent' AS DOUBLE PRECISION)" for p in places]
    else:
        held = f"json_extract(a.gpus, '$[{column:d}]')"
        whens = [f"WHEN json_extract(u.gpus, '$[{p:d}].index') = {held} "
                 f"THEN json_extract(u.gpus, '$[{p:d}].utilPercent')" for p in places]
    return f"CASE {' '.join(whens)} END"


def per_task_sql(where: str, gpus: int, *, bucket: bool) -> str:
    """A query of one row per task attempt (and bucket, if `bucket`: the
    width is then its first parameter) of the samples `where` (SQL over
    the samples' table called `u`): its mean CPU, memory and each GPU's
    utilisation, column i the task's i-th GPU as its attempt holds them
    (`_gpu_sql`). Fixed columns cost nothing next to reading the rows,
    where expanding each list into rows (json_each, jsonb_array_elements)
    took longer than all the rest (bench/big_job_page.py)."""
    table = connection.ops.quote_name(TaskUsage._meta.db_table)
    held = connection.ops.quote_name(TaskAttempt._meta.db_table)
    gpu_columns = "".join(f", AVG({_gpu_sql(i, gpus)}) AS g{i}" for i in range(gpus))
    key = f", {bucket_sql('u.at')} AS b" if bucket else ""
    join = f"JOIN {held} a ON a.id = u.attempt_id " if gpus else ""
    return (f"SELECT u.attempt_id{key}, AVG(u.cpu_percent) AS cpu, AVG(u.memory_bytes) AS memory{gpu_columns} "
            f"FROM {table} u {join}WHERE {where} GROUP BY u.attempt_id{', b' if bucket else ''}")


def figures_sql(gpus: int) -> str:
    """The columns that add up rows of per_task_sql (figures_of reads them)."""
    by_position = "".join(f", COUNT(g{i}), SUM(g{i}), MIN(g{i}), MAX(g{i})" for i in range(gpus))
    return f"COUNT(*), SUM(cpu), MIN(cpu), MAX(cpu), SUM(memory){by_position}"


def figures_of(row: Sequence, gpus: int) -> Figures:
    tasks, cpu_sum, cpu_min, cpu_max, memory, *by_position = row
    positions = [by_position[4 * i:4 * i + 4] for i in range(gpus)]
    held = [(count, total, low, high) for count, total, low, high in positions if count]
    return Figures(tasks, cpu_sum, cpu_min, cpu_max, float(memory), sum(count for count, *_ in held),
                   sum(total for _, total, _, _ in held),
                   min((low for _, _, low, _ in held), default=None), max((high for *_, high in held), default=None))


def _raw(samples: _Where, width: int, gpus: int) -> Sequence[tuple]:
    """Per bucket of raw samples, oldest first: its number, then figures_sql.
    The inner query makes each task one row per bucket (its means there),
    the outer one adds the tasks up."""
    where, params = samples.sql()
    sql = (f"SELECT b, {figures_sql(gpus)} FROM ({per_task_sql(where, gpus, bucket=True)}) per_task "
           f"GROUP BY b ORDER BY b")
    with connection.cursor() as cursor:
        cursor.execute(sql, [width, *params])
        return cursor.fetchall()


@dataclass(frozen=True)
class _Where:
    """The samples of a job attempt's tasks in [start, end), as SQL over the
    samples' table called `u`: along its (attempt, at) index."""

    job_id: int
    number: int
    start: datetime
    end: datetime

    def sql(self) -> tuple[str, list]:
        quote = connection.ops.quote_name
        adapt = connection.ops.adapt_datetimefield_value
        return (f"u.attempt_id IN (SELECT id FROM {quote(TaskAttempt._meta.db_table)} WHERE job_id = %s "
                f"AND number = %s) AND u.at >= %s AND u.at < %s",
                [self.job_id, self.number, adapt(self.start), adapt(self.end)])


# ---------------------------------------------------------- whole minutes


@dataclass
class _Sum:
    """Minutes (or one bucket of raw samples) added up into a bucket; see
    the module's docstring for what a wide bucket's figures mean."""

    minutes: int
    tasks: int  # the most in one minute
    task_minutes: int
    cpu_sum: float
    cpu_min: float
    cpu_max: float
    memory_sum: float
    gpus: int  # the most in one minute
    gpu_minutes: int
    gpu_sum: float
    gpu_min: float | None
    gpu_max: float | None

    @classmethod
    def of(cls, f: Figures) -> _Sum:
        return cls(1, f.tasks, f.tasks, f.cpu_sum, f.cpu_min, f.cpu_max, f.memory_sum, f.gpus, f.gpus, f.gpu_sum,
                   f.gpu_min, f.gpu_max)

    def add(self, other: _Sum) -> None:
        self.minutes += other.minutes
        self.tasks = max(self.tasks, other.tasks)
        self.task_minutes += other.task_minutes
        self.cpu_sum += other.cpu_sum
        self.cpu_min, self.cpu_max = min(self.cpu_min, other.cpu_min), max(self.cpu_max, other.cpu_max)
        self.memory_sum += other.memory_sum
        self.gpus = max(self.gpus, other.gpus)
        self.gpu_minutes += other.gpu_minutes
        self.gpu_sum += other.gpu_sum
        self.gpu_min = min((x for x in (self.gpu_min, other.gpu_min) if x is not None), default=None)
        self.gpu_max = max((x for x in (self.gpu_max, other.gpu_max) if x is not None), default=None)

    def bucket(self, start: datetime) -> Bucket:
        gpu = None
        if self.gpu_minutes:
            gpu = Spread(self.gpu_sum / self.gpu_minutes, self.gpu_min, self.gpu_max)
        return Bucket(start, self.tasks, self.cpu_sum / self.minutes / 100,
                      Spread(self.cpu_sum / self.task_minutes, self.cpu_min, self.cpu_max),
                      int(self.memory_sum / self.minutes), self.gpus, gpu)


def _minute_sums(samples: _Where, *, width: int, tasks: int, attempts: QuerySet[TaskAttempt]) -> dict[int, _Sum]:
    """Buckets of whole minutes (`width` a multiple of one): raw samples
    from the oldest marked minute on, if within the newest budget's worth
    of minutes; the roll-up's rows before that. The marks are read before
    the rows: a roll-up between the two reads leaves a minute's mark or its
    new row, never neither."""
    first, end = _epoch(samples.start) // MINUTE, _epoch(samples.end) // MINUTE
    budget = longest_raw_window(tasks=tasks) // MINUTE
    marked = UsageMinuteMark.objects.filter(job_id=samples.job_id, number=samples.number,
                                            minute__gte=max(first, end - budget), minute__lt=end)
    split = marked.aggregate(oldest=Min("minute"))["oldest"]
    split = end if split is None else split
    sums = _rolled_up(samples.job_id, samples.number, first, split, width) if split > first else {}
    if split < end:
        gpus = gpu_positions(attempts)
        raw = _Where(samples.job_id, samples.number, _time(split * MINUTE), samples.end)
        for minute, *row in _raw(raw, MINUTE, gpus):
            part = _Sum.of(figures_of(row, gpus))
            b = minute * MINUTE // width
            if b in sums:
                sums[b].add(part)
            else:
                sums[b] = part
    return sums


def _rolled_up(job_id: int, number: int, first: int, end: int, width: int) -> dict[int, _Sum]:
    """The job attempt's rolled-up minutes in [first, end) (minutes since
    the epoch) added up per bucket, in SQL: a row per bucket, not per minute."""
    table = connection.ops.quote_name(JobUsageMinute._meta.db_table)
    sql = (f"SELECT (m.minute * {MINUTE:d}) / %s AS b, COUNT(*), MAX(m.tasks), SUM(m.tasks), SUM(m.cpu_sum), "
           f"MIN(m.cpu_min), MAX(m.cpu_max), SUM(m.memory_sum), MAX(m.gpus), SUM(m.gpus), SUM(m.gpu_sum), "
           f"MIN(m.gpu_min), MAX(m.gpu_max) FROM {table} m "
           f"WHERE m.job_id = %s AND m.number = %s AND m.minute >= %s AND m.minute < %s GROUP BY b")
    with connection.cursor() as cursor:
        cursor.execute(sql, [width, job_id, number, first, end])
        return {b: _Sum(*row) for b, *row in cursor.fetchall()}
