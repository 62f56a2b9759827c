"""The roll-up of usage samples into a row per job attempt and minute
(JobUsageMinute), so a job-wide summary (usage_series.py) reads a row a
minute whatever its task count: a 1,000-task job's day is 1,440 rows, not
17 million samples.

Marks, not a cursor: the transaction that stores samples also marks each
(job attempt, minute) it wrote into (UsageMinuteMark, `minutes_mark`: one
upsert per minute of the write, normally one). `usage_rollup` re-computes
each marked minute that is whole (usage_series.settle_seconds() after its
end) from the raw samples, and in one short transaction deletes the mark
only if its stamp is still the one it read and, if it did, writes the
minute's row. So:

- A sample written late (a node whose clock runs behind, a slow batch, an
  agent back after a while) marks its minute again, rolled up or not, and
  the next roll-up counts it.
- A minute is computed from all its samples each time, never added to:
  rolling up twice gives the same rows, and two rollers (two agents, two
  processes) never count a sample twice. Of two that read the same mark
  only the first deletes it and writes; one that read a mark replaced
  since deletes nothing and writes nothing (the new mark's roll-up will),
  so an older computation never overwrites a newer one.
- A stamp is the newest sample id of the write that set it: no two writes
  share one, so a mark deleted and set again between a roller's read and
  its delete is not taken for the one it read.
- The samples are read after the mark, so they hold every sample of the
  write that set it; a sample stored later replaces the stamp, and the
  delete then misses.

Compaction (usage.usage_compact) replaces a minute's detailed samples by
one averaged row per task, the mean of its samples there, in one
transaction: the minute adds up the same from either, so it marks nothing.
A late sample of a minute already compacted is counted beside that
minute's averaged row, as the summary of raw samples counts it.

Rows and marks are deleted with their job (foreign keys, as its samples
through its task attempts) and once older than USAGE_MINUTES_DAYS, when
compaction deletes the samples' averages. Node agents call `usage_rollup`
once a minute, just before compaction (jobs/node/usage.py); the Redis lock
they take only saves doing the same work twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q

from jobs.models import JobUsageMinute, TaskAttempt, UsageMinuteMark
from jobs.services import db_clock, usage_series

log = logging.getLogger(__name__)

# The summary's minute: its minute buckets are this roll-up's rows.
MINUTE = usage_series.MINUTE
# Task attempts (or jobs) named in one statement: under the 999 parameters
# an SQLite build may allow.
CHUNK = 500


def minute_of(at: datetime) -> int:
    """Whole minutes since 1970-01-01 UTC."""
    return int(at.timestamp()) // MINUTE


def _time(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * MINUTE, UTC)


# ------------------------------------------------------------------ marking


def minutes_mark(written: Iterable[tuple[int, datetime]], *, stamp: int) -> None:
    """Mark the job attempts' minutes of samples just written, given as
    (task attempt id, time) pairs; `stamp` is the newest of their sample
    ids. Call it in the transaction that wrote them. One statement per
    minute, the job attempts in order: two writers lock a minute's marks in
    the same order, so they wait for each other but never deadlock."""
    by_minute: dict[int, set[int]] = {}
    for attempt_id, at in written:
        by_minute.setdefault(minute_of(at), set()).add(attempt_id)
    quote = connection.ops.quote_name
    marks, attempts = quote(UsageMinuteMark._meta.db_table), quote(TaskAttempt._meta.db_table)
    with connection.cursor() as cursor:
        for minute in sorted(by_minute):
            ids = sorted(by_minute[minute])
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start:start + CHUNK]
                # WHERE comes before ON CONFLICT: SQLite reads "ON" after a
                # bare FROM as a join's.
                cursor.execute(
                    f"INSERT INTO {marks} (job_id, number, minute, stamp) SELECT DISTINCT job_id, number, %s, %s "
                    f"FROM {attempts} WHERE id IN ({', '.join(['%s'] * len(chunk))}) ORDER BY job_id, number "
                    f"ON CONFLICT (job_id, number, minute) DO UPDATE SET stamp = excluded.stamp",
                    [minute, stamp, *chunk])


# ---------------------------------------------------------------- rolling up


def usage_rollup(*, now: datetime | None = None, max_minutes: int = 60) -> int:
    """Roll up the marked minutes that are whole, newest first (the last
    hour's graphs matter most), at most `max_minutes` of them; delete rows
    and marks older than USAGE_MINUTES_DAYS. Returns the job attempts'
    minutes this call wrote (or found empty and deleted)."""
    now = now or db_clock.now()
    stop = minute_of(now - timedelta(seconds=usage_series.settle_seconds()))  # the first minute not yet whole
    minutes = (UsageMinuteMark.objects.filter(minute__lt=stop).order_by("-minute")
               .values_list("minute", flat=True).distinct()[:max_minutes])
    rolled = sum(_minute_rollup(minute) for minute in list(minutes))
    oldest = minute_of(now - timedelta(days=settings.USAGE_MINUTES_DAYS))
    JobUsageMinute.objects.filter(minute__lt=oldest).delete()
    UsageMinuteMark.objects.filter(minute__lt=oldest).delete()
    return rolled


def _minute_rollup(minute: int) -> int:
    """Re-compute the job attempts marked in `minute` and write those whose
    mark is unchanged; returns how many. Each in a transaction of its own:
    it holds one mark's lock at a time."""
    marks = list(UsageMinuteMark.objects.filter(minute=minute).order_by("job_id", "number")
                 .values_list("job_id", "number", "stamp"))
    figures = minute_figures(minute, {(job_id, number) for job_id, number, _ in marks})
    written = 0
    for job_id, number, stamp in marks:
        try:
            with transaction.atomic():
                key = {"job_id": job_id, "number": number, "minute": minute}
                if not UsageMinuteMark.objects.filter(**key, stamp=stamp).delete()[0]:
                    continue  # set again since it was read (its roll-up will count it), or rolled up by another
                _row_write(key, figures.get((job_id, number)))
        except IntegrityError:  # the job was deleted meanwhile, and its marks with it
            log.info("job %s deleted while its minute %s was rolled up", job_id, minute)
            continue
        written += 1
    return written


def _row_write(key: dict[str, int], figures: usage_series.Figures | None) -> None:
    if figures is None:  # its samples are gone (or it never had any): no row
        JobUsageMinute.objects.filter(**key).delete()
        return
    fields = ["tasks", "cpu_sum", "cpu_min", "cpu_max", "memory_sum", "gpus", "gpu_sum", "gpu_min", "gpu_max"]
    JobUsageMinute.objects.bulk_create(
        [JobUsageMinute(**key, **{name: getattr(figures, name) for name in fields})],
        update_conflicts=True, unique_fields=["job", "number", "minute"], update_fields=fields)


def minute_figures(minute: int, job_attempts: set[tuple[int, int]]) -> dict[tuple[int, int], usage_series.Figures]:
    """Each of these job attempts' tasks added up over the minute, as
    usage_series adds up a one-minute bucket: one query per CHUNK jobs (and
    one for the most GPUs a task of them holds), along the samples'
    (attempt, at) index."""
    found: dict[tuple[int, int], usage_series.Figures] = {}
    pairs = sorted(job_attempts)
    for start in range(0, len(pairs), CHUNK):
        chunk = pairs[start:start + CHUNK]
        attempts = TaskAttempt.objects.filter(Q(*[Q(job_id=j, number=n) for j, n in chunk], _connector=Q.OR))
        gpus = usage_series.gpu_positions(attempts)
        for job_id, number, *row in _added_up(minute, sorted({j for j, _ in chunk}), gpus):
            if (job_id, number) in job_attempts:
                found[(job_id, number)] = usage_series.figures_of(row, gpus)
    return found


def _added_up(minute: int, job_ids: list[int], gpus: int) -> list[tuple]:
    adapt = connection.ops.adapt_datetimefield_value
    attempts = connection.ops.quote_name(TaskAttempt._meta.db_table)
    where = (f"u.attempt_id IN (SELECT id FROM {attempts} WHERE job_id IN ({', '.join(['%s'] * len(job_ids))})) "
             f"AND u.at >= %s AND u.at < %s")
    per_task = usage_series.per_task_sql(where, gpus, bucket=False)
    sql = (f"SELECT a.job_id, a.number, {usage_series.figures_sql(gpus)} FROM ({per_task}) per_task "
           f"JOIN {attempts} a ON a.id = per_task.attempt_id GROUP BY a.job_id, a.number")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*job_ids, adapt(_time(minute)), adapt(_time(minute + 1))])
        return cursor.fetchall()
