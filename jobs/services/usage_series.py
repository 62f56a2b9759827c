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
period; a minute where one-minute averages are read). Within a bucket each
task counts once, as the mean of its samples there (a task sampled twice
in a bucket must not count twice in a sum); each GPU likewise. Then, over
the tasks: how many were sampled, CPU cores in use (cpu_percent / 100)
and memory summed, CPU per task and GPU utilisation as mean, least and
most busy.

Both levels are aggregated in SQL, in one query whatever the task count
(and one for the most GPUs a task holds); only its bucket and JSON
expressions differ between SQLite and PostgreSQL. Only whole
buckets are given: one still being sampled (or whose samples a node has not
written yet, see `settle_seconds`) would dip and then be given again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from jobs.models import TaskAttempt, TaskUsage
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


@dataclass(frozen=True)
class Spread:
    mean: float
    least: float
    most: float


@dataclass(frozen=True)
class Bucket:
    start: datetime
    tasks: int  # tasks with a sample in the bucket
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


def max_window_seconds() -> int:
    """As far back as samples are kept (one-minute averages)."""
    return int(settings.USAGE_MINUTES_DAYS * 86400)


def samples_read(*, tasks: int, window_seconds: int) -> int:
    """The most samples a window of `tasks` tasks holds: one per task every
    sample period within USAGE_DETAIL_HOURS, one a minute before. Cheap
    (no query) and never under the count for tasks sampled steadily."""
    detail = min(window_seconds, settings.USAGE_DETAIL_HOURS * 3600)
    per_task = detail / settings.USAGE_SAMPLE_SECONDS + (window_seconds - detail) / 60
    return math.ceil(tasks * per_task)


def longest_window(*, tasks: int) -> int:
    """The longest window (seconds) whose samples_read fits the budget, at
    most max_window_seconds(). Under MIN_WINDOW for a job too big for any."""
    budget = settings.USAGE_SUMMARY_MAX_SAMPLES / max(1, tasks)  # samples per task
    detail = settings.USAGE_DETAIL_HOURS * 3600
    if budget * settings.USAGE_SAMPLE_SECONDS <= detail:
        longest = budget * settings.USAGE_SAMPLE_SECONDS
    else:
        longest = detail + (budget - detail / settings.USAGE_SAMPLE_SECONDS) * 60
    return min(max_window_seconds(), math.floor(longest))


def bucket_width(window_seconds: int) -> int:
    """The narrowest round width that cuts `window_seconds` into at most
    MAX_POINTS buckets and that each steadily sampled task has a sample in:
    two sample periods, or a minute once the window reaches back to the
    one-minute averages (older than USAGE_DETAIL_HOURS)."""
    least = 2 * settings.USAGE_SAMPLE_SECONDS
    if window_seconds > settings.USAGE_DETAIL_HOURS * 3600:
        least = max(least, 60)
    least = max(least, window_seconds / MAX_POINTS)
    return next((w for w in WIDTHS if w >= least), WIDTHS[-1] * math.ceil(least / WIDTHS[-1]))


def settle_seconds() -> float:
    """How long after a bucket's end its samples are taken to be in: a node
    writes a round a moment after it samples, and its clock may run a little
    behind the others'."""
    return max(5.0, 2 * settings.USAGE_SAMPLE_SECONDS)


def job_series(*, job_id: int, number: int, window_seconds: int = DEFAULT_WINDOW, since: datetime | None = None,
               now: datetime | None = None) -> JobSeries:
    """The whole buckets of the job's attempt `number` over the last
    `window_seconds`, oldest first, only those starting after `since` if
    given (a poll passes the start of the newest bucket it has). Buckets no
    task has a sample in are left out."""
    now = now or timezone.now()
    width = bucket_width(window_seconds)
    first = _epoch(now - timedelta(seconds=window_seconds)) // width
    if since is not None:
        first = max(first, _epoch(since) // width + 1)
    stop = int((_epoch(now) - settle_seconds()) // width)  # the first bucket not yet whole
    if first >= stop:  # nothing whole after `since` (which may be in the year 9999)
        return JobSeries(width, _time(stop * width), _time(stop * width), [])
    start, end = _time(first * width), _time(stop * width)
    attempts = TaskAttempt.objects.filter(job_id=job_id, number=number)
    # The most GPUs a task holds: as many GPU columns in the query.
    gpus = min(MAX_GPUS, max((len(held or []) for held in attempts.values_list("gpus", flat=True).distinct()),
                             default=0))
    return JobSeries(width, start, end, [_bucket(row, width, gpus)
                                         for row in _buckets(_Where(job_id, number, start, end), width, gpus)])


def _epoch(at: datetime) -> int:
    return math.floor(at.timestamp())


def _time(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _bucket_sql(column: str) -> str:
    """The bucket number of a sample's time: whole seconds since the epoch,
    divided by the width (the query's first parameter; integers divide to
    an integer)."""
    return f"({epoch_seconds_sql(column, connection.vendor)} / %s)"


def _gpu_sql(position: int) -> str:
    """The utilisation of a sample's GPU at `position` in its list, NULL if
    it has none there."""
    if connection.vendor == "postgresql":
        return f"CAST(u.gpus -> {position:d} ->> 'utilPercent' AS DOUBLE PRECISION)"
    return f"json_extract(u.gpus, '$[{position:d}].utilPercent')"


def _buckets(samples: _Where, width: int, gpus: int) -> Sequence[tuple]:
    """Per bucket, oldest first: the tasks sampled; their CPU % summed, mean,
    least, most; their memory summed; then for each GPU position the GPUs
    there with figures, their utilisation summed, least, most.

    The inner query makes each task one row per bucket (its means there),
    the outer one adds the tasks up. A GPU is known by its position in a
    sample's list (the sampler writes a task's GPUs in its order): fixed
    columns cost nothing next to reading the rows, where expanding each
    list into rows (json_each, jsonb_array_elements) took longer than all
    the rest (bench/big_job_page.py)."""
    table = connection.ops.quote_name(TaskUsage._meta.db_table)
    where, params = samples.sql()
    inner = ", ".join(f"AVG({_gpu_sql(i)}) AS g{i}" for i in range(gpus))
    outer = ", ".join(f"COUNT(g{i}), SUM(g{i}), MIN(g{i}), MAX(g{i})" for i in range(gpus))
    sql = (f"SELECT b, COUNT(*), SUM(cpu), AVG(cpu), MIN(cpu), MAX(cpu), SUM(memory){', ' + outer if gpus else ''} "
           f"FROM (SELECT u.attempt_id, {_bucket_sql('u.at')} AS b, AVG(u.cpu_percent) AS cpu, "
           f"AVG(u.memory_bytes) AS memory{', ' + inner if gpus else ''} FROM {table} u WHERE {where} "
           f"GROUP BY u.attempt_id, b) per_task GROUP BY b ORDER BY b")
    with connection.cursor() as cursor:
        cursor.execute(sql, [width, *params])
        return cursor.fetchall()


def _bucket(row: tuple, width: int, gpus: int) -> Bucket:
    b, tasks, cores, mean, least, most, memory, *by_position = row
    positions = [by_position[4 * i:4 * i + 4] for i in range(gpus)]
    counted = sum(count for count, *_ in positions)
    gpu = None
    if counted:
        gpu = Spread(sum(total for count, total, *_ in positions if count) / counted,
                     min(low for count, _, low, _ in positions if count),
                     max(high for count, _, _, high in positions if count))
    return Bucket(_time(b * width), tasks, cores / 100, Spread(mean, least, most), int(memory), counted, gpu)


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
