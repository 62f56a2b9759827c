"""The roll-up of usage samples per job attempt and minute
(jobs/services/usage_rollup.py) and the job-wide summary's minute buckets
over it (jobs/services/usage_series.py), on a real database.

Samples are written through usage.samples_record, the node agents' path,
which marks their minutes. Every figure is checked against one computed
here from the samples themselves (`by_hand`), so a test does not depend on
whether a node agent of the test cluster rolls the same minutes up
meanwhile: rolling up is only ever re-computing from the samples. Times
are a few minutes back from now, whole minutes the roll-up takes."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs.models import Job, JobUsageMinute, Node, TaskAttempt, TaskUsage, UsageMinuteMark
from jobs.services import usage, usage_rollup, usage_series
from tests.test_big_job_queries import api_client, big_job, idle_node

node = pytest.fixture(idle_node, name="node")


def minutes_back(n: int) -> datetime:
    """The start of the minute `n` minutes before this one."""
    return timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=n)


def round_of(attempts: list[TaskAttempt], when: datetime, *, cpu: float, gpus: bool = True) -> list[usage.Sample]:
    """One sample of each task: task i at cpu + 10 i %, (i + 1) GiB, its GPU (the node's GPU it holds, as
    the sampler writes it) at cpu / 2 + i %."""
    return [usage.Sample(attempt_id=a.pk, at=when, cpu_percent=cpu + 10 * i, memory_bytes=(i + 1) * 2**30,
                         gpus=[{"index": a.gpus[0], "utilPercent": cpu / 2 + i, "memoryUsedBytes": 1}] if gpus else [])
            for i, a in enumerate(attempts)]


def by_hand(job: Job, minute: datetime) -> usage_series.Figures | None:
    """A one-minute bucket of the job's current attempt from its samples,
    computed in Python: each task once, as the mean of its samples; each
    GPU likewise."""
    rows = TaskUsage.objects.filter(attempt__job=job, attempt__number=job.attempt_number, at__gte=minute,
                                    at__lt=minute + timedelta(minutes=1))
    per_task: dict[int, list[TaskUsage]] = defaultdict(list)
    for row in rows:
        per_task[row.attempt_id].append(row)
    if not per_task:
        return None
    cpus = [sum(r.cpu_percent for r in found) / len(found) for found in per_task.values()]
    memory = [sum(r.memory_bytes for r in found) / len(found) for found in per_task.values()]
    gpus = []
    for found in per_task.values():
        at_position: dict[int, list[float]] = defaultdict(list)
        for row in found:
            for position, gpu in enumerate(row.gpus or []):
                at_position[position].append(gpu["utilPercent"])
        gpus += [sum(u) / len(u) for u in at_position.values()]
    return usage_series.Figures(len(cpus), sum(cpus), min(cpus), max(cpus), sum(memory), len(gpus), sum(gpus),
                                min(gpus, default=None), max(gpus, default=None))


def rolled(job: Job, minute: datetime) -> usage_series.Figures | None:
    row = JobUsageMinute.objects.filter(job=job, number=job.attempt_number,
                                        minute=usage_rollup.minute_of(minute)).first()
    if row is None:
        return None
    return usage_series.Figures(row.tasks, row.cpu_sum, row.cpu_min, row.cpu_max, row.memory_sum, row.gpus,
                                row.gpu_sum, row.gpu_min, row.gpu_max)


def assert_same(found: usage_series.Figures | None, expected: usage_series.Figures | None) -> None:
    if expected is None:
        assert found is None
        return
    assert found is not None
    for name in ("tasks", "gpus"):
        assert getattr(found, name) == getattr(expected, name), name
    for name in ("cpu_sum", "cpu_min", "cpu_max", "memory_sum", "gpu_sum", "gpu_min", "gpu_max"):
        assert getattr(found, name) == pytest.approx(getattr(expected, name)), name


def minute_bucket(job: Job, minute: datetime) -> usage_series.Bucket | None:
    """The summary's one-minute bucket starting at `minute` (a 6-hour window
    has one-minute buckets), whether it comes from the roll-up or raw."""
    series = usage_series.job_series(job_id=job.pk, number=job.attempt_number, window_seconds=6 * 3600)
    assert series.width == 60
    return next((bucket for bucket in series.buckets if bucket.start == minute), None)


def bucket_of(figures: usage_series.Figures) -> tuple:
    return (figures.tasks, pytest.approx(figures.cpu_sum / 100), pytest.approx(figures.cpu_sum / figures.tasks),
            pytest.approx(figures.cpu_min), pytest.approx(figures.cpu_max), int(figures.memory_sum), figures.gpus)


def as_tuple(bucket: usage_series.Bucket) -> tuple:
    return (bucket.tasks, bucket.cpu_cores, bucket.cpu_percent.mean, bucket.cpu_percent.least,
            bucket.cpu_percent.most, bucket.memory_bytes, bucket.gpus)


@pytest.fixture
def gpu_job(alice, node):
    Node.objects.filter(pk=node.pk).update(gpus_simulated=False)
    job = big_job(alice, node, tasks=3, attempts=2, samples=0)
    return job, list(TaskAttempt.objects.filter(job=job, number=2).order_by("task__index"))


# ------------------------------------------------------------------ marking


def test_storing_samples_marks_their_job_attempts_minutes_in_the_same_write(gpu_job):
    job, attempts = gpu_job
    old = TaskAttempt.objects.get(job=job, number=1, task__index=0)
    minute = minutes_back(-5)  # a node whose clock runs ahead: not whole yet, no roll-up takes its mark
    usage.samples_record([*round_of(attempts, minute + timedelta(seconds=59.999), cpu=10.0),
                          *round_of([old], minute + timedelta(minutes=1), cpu=1.0)])
    newest = TaskUsage.objects.filter(attempt__job=job).order_by("-pk").values_list("pk", flat=True).first()
    marks = set(UsageMinuteMark.objects.filter(job=job).values_list("number", "minute", "stamp"))
    assert marks == {(2, usage_rollup.minute_of(minute), newest), (1, usage_rollup.minute_of(minute) + 1, newest)}
    # A later write into the minute replaces the stamp: no two writes share one.
    usage.samples_record(round_of(attempts[:1], minute + timedelta(seconds=1), cpu=10.0))
    (stamp,) = UsageMinuteMark.objects.filter(job=job, number=2).values_list("stamp", flat=True)
    assert stamp > newest


# ------------------------------------------------------------ rolling up


def test_a_rolled_minute_is_what_the_raw_samples_add_up_to(gpu_job):
    """Three tasks over three minutes, one task without GPU figures, one
    sampled twice as often; then the summary's minute buckets from the
    roll-up, from raw samples, and as computed by hand are one."""
    job, attempts = gpu_job
    first = minutes_back(8)
    for k in range(36):  # every 5 s for 3 minutes
        when = first + timedelta(seconds=5 * k)
        usage.samples_record(round_of(attempts[:2], when, cpu=10.0 + k) + round_of(attempts[2:], when, cpu=3.0 * k,
                                                                                 gpus=False))
        usage.samples_record(round_of(attempts[:1], when + timedelta(seconds=2.5), cpu=99.0))
    minutes = [first + timedelta(minutes=i) for i in range(3)]
    raw = [minute_bucket(job, minute) for minute in minutes]  # marked, so read raw (unless rolled meanwhile)
    usage_rollup.usage_rollup()
    assert not UsageMinuteMark.objects.filter(job=job).exists()
    for minute, before in zip(minutes, raw):
        expected = by_hand(job, minute)
        assert_same(rolled(job, minute), expected)
        assert as_tuple(minute_bucket(job, minute)) == bucket_of(expected) == as_tuple(before)
        assert minute_bucket(job, minute).gpu_percent == pytest.approx(before.gpu_percent)
    # Rolling up again (every minute marked anew) gives the same rows.
    rows = list(JobUsageMinute.objects.filter(job=job).order_by("minute").values())
    usage_rollup.minutes_mark([(attempts[0].pk, minute) for minute in minutes], stamp=0)
    usage_rollup.usage_rollup()
    assert list(JobUsageMinute.objects.filter(job=job).order_by("minute").values()) == rows


def test_a_late_sample_in_a_minute_already_rolled_up_counts_after_the_next_roll_up(gpu_job):
    job, attempts = gpu_job
    minute = minutes_back(4)
    usage.samples_record(round_of(attempts[:2], minute + timedelta(seconds=10), cpu=20.0))
    usage_rollup.usage_rollup()
    assert rolled(job, minute).tasks == 2
    # The third task's sample of that minute comes now (its agent was away).
    usage.samples_record(round_of(attempts, minute + timedelta(seconds=50), cpu=40.0)[2:])
    # The summary reads the marked minute raw meanwhile: it counts it already.
    assert minute_bucket(job, minute).tasks == 3
    usage_rollup.usage_rollup()
    assert_same(rolled(job, minute), by_hand(job, minute))
    assert rolled(job, minute).tasks == 3 and rolled(job, minute).cpu_sum == pytest.approx(20 + 30 + 60)
    assert not UsageMinuteMark.objects.filter(job=job).exists()


def test_a_node_whose_clock_runs_behind_is_counted_in_its_minutes(alice, node):
    """Two nodes' tasks sampled each round; the second node's clock is 90 s
    behind, so each of its samples lands in a minute the roll-up has
    already written by the time it is stored."""
    job = big_job(alice, node, tasks=4, attempts=1, samples=0)
    attempts = list(TaskAttempt.objects.filter(job=job).order_by("task__index"))
    ours, behind = attempts[:2], attempts[2:]
    start = minutes_back(6)
    for k in range(0, 4 * 60, 10):
        when = start + timedelta(seconds=k)
        usage.samples_record(round_of(ours, when, cpu=50.0) + round_of(behind, when - timedelta(seconds=90), cpu=5.0))
        if k % 60 == 0:
            usage_rollup.usage_rollup(now=when + timedelta(seconds=1))  # the agents roll up as time goes
    usage_rollup.usage_rollup()
    for minute in (start + timedelta(minutes=i) for i in range(-2, 4)):
        assert_same(rolled(job, minute), by_hand(job, minute))
    assert rolled(job, start + timedelta(minutes=1)).tasks == 4


def test_two_rollers_at_once_count_each_sample_once(alice, node):
    """Three threads roll up over and over while a fourth stores rounds
    into the last few minutes (late ones too), on the real database; then
    every minute's row is what its samples add up to."""
    job = big_job(alice, node, tasks=20, attempts=1, samples=0)
    attempts = list(TaskAttempt.objects.filter(job=job).order_by("task__index"))
    start = minutes_back(6)
    when = [start + timedelta(seconds=(37 * k) % 300) for k in range(60)]  # in 5 minutes, out of order
    barrier = threading.Barrier(4)
    writing = threading.Event()
    writing.set()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            barrier.wait()
            for k, at in enumerate(when):
                usage.samples_record(round_of(attempts, at, cpu=float(k)))
        except BaseException as exc:  # noqa: BLE001  (reported below)
            failures.append(exc)
        finally:
            writing.clear()
            connection.close()

    def roll() -> None:
        try:
            barrier.wait()
            while writing.is_set():
                usage_rollup.usage_rollup()
            usage_rollup.usage_rollup()
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write), *(threading.Thread(target=roll) for _ in range(3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    usage_rollup.usage_rollup()
    assert not UsageMinuteMark.objects.filter(job=job).exists()
    for i in range(5):
        minute = start + timedelta(minutes=i)
        assert_same(rolled(job, minute), by_hand(job, minute))
    assert sum(rolled(job, start + timedelta(minutes=i)).tasks for i in range(5)) == 5 * 20


def test_a_compacted_minute_rolls_up_as_its_samples_did(gpu_job):
    """Compaction replaces a minute's samples by each task's average there:
    marked again (a late sample of another task), it adds up the same."""
    job, attempts = gpu_job
    # Older than USAGE_DETAIL_HOURS (24), and than other tests' samples:
    # compaction folds the oldest minutes first.
    minute = minutes_back(2 * 24 * 60)
    for k in range(12):
        usage.samples_record(round_of(attempts[:2], minute + timedelta(seconds=5 * k), cpu=float(10 * k)))
    usage_rollup.usage_rollup(max_minutes=10**6)  # newest first: past any other test's marks
    before = rolled(job, minute)
    usage.usage_compact(max_minutes=60)
    assert set(TaskUsage.objects.filter(attempt__job=job).values_list("averaged", flat=True)) == {True}
    usage.samples_record(round_of(attempts, minute + timedelta(seconds=30), cpu=7.0)[2:])
    usage_rollup.usage_rollup(max_minutes=10**6)
    after = rolled(job, minute)
    assert after.tasks == 3 and after.cpu_sum == pytest.approx(before.cpu_sum + 27.0)
    assert (before.cpu_min, before.cpu_max) == (55.0, 65.0)  # the two tasks' means, 0-110 % and 10-120 %
    assert (after.cpu_min, after.cpu_max) == (27.0, 65.0)
    # Folded too, as the next compaction would: no detailed sample this old
    # is left for other tests' compactions to find first.
    usage.usage_compact(max_minutes=60)
    assert set(TaskUsage.objects.filter(attempt__job=job).values_list("averaged", flat=True)) == {True}


# ----------------------------------------------------------- the summary


def test_a_wide_bucket_adds_its_minutes_up_as_documented(gpu_job):
    """A day's window: 5-minute buckets of whole minutes. Two tasks sampled
    in all five minutes, a third in two: tasks the most in one minute,
    cores and memory the mean of the minutes' sums, CPU per task the mean
    over task minutes, least and most busy of any one minute."""
    job, attempts = gpu_job
    bucket = timezone.now().replace(second=0, microsecond=0)
    bucket -= timedelta(minutes=bucket.minute % 5 + 10)  # a whole 5-minute bucket, 10-14 minutes back
    for i in range(5):
        minute = bucket + timedelta(minutes=i)
        present = attempts if i < 2 else attempts[:2]
        usage.samples_record(round_of(present, minute + timedelta(seconds=20), cpu=10.0 * (i + 1)))
    usage_rollup.usage_rollup()
    series = usage_series.job_series(job_id=job.pk, number=2, window_seconds=86400)
    assert series.width == 300
    (found,) = [b for b in series.buckets if b.start == bucket]
    minutes = [by_hand(job, bucket + timedelta(minutes=i)) for i in range(5)]
    assert found.tasks == 3 and found.gpus == 3
    assert found.cpu_cores == pytest.approx(sum(f.cpu_sum for f in minutes) / 5 / 100)
    assert found.memory_bytes == int(sum(f.memory_sum for f in minutes) / 5)
    assert found.cpu_percent.mean == pytest.approx(sum(f.cpu_sum for f in minutes) / sum(f.tasks for f in minutes))
    assert (found.cpu_percent.least, found.cpu_percent.most) == (10.0, 50.0 + 10.0)
    assert found.gpu_percent.least == 5.0 and found.gpu_percent.most == pytest.approx(25.0 + 1)


def test_an_hour_of_a_big_job_comes_from_the_roll_up_and_equals_its_raw_samples(alice, node, settings):
    """A job whose hour is over the budget: minute buckets. Read while its
    minutes are marked (raw) and after the roll-up, the answer is one."""
    settings.USAGE_SUMMARY_MAX_SAMPLES = 10_000
    job = big_job(alice, node, tasks=30, attempts=1, samples=0)
    attempts = list(TaskAttempt.objects.filter(job=job).order_by("task__index"))
    start = minutes_back(5)
    for k in range(0, 240, 5):
        usage.samples_record(round_of(attempts, start + timedelta(seconds=k), cpu=float(k % 70)))
    client = api_client(alice)
    path = f"/api/v2/jobs/{alice.username}~{job.name}/metrics/summary"
    before = client.get(path).json()
    assert before["bucketSeconds"] == 60  # 30 tasks: 1,666 s of raw samples, under the hour
    usage_rollup.usage_rollup()
    after = client.get(path).json()
    at = {b["time"]: b for b in after["buckets"]}
    assert len(before["buckets"]) == 4 and all(at[b["time"]] == b for b in before["buckets"])


# ------------------------------------------------------------- retention


def test_rows_and_marks_go_with_their_job_and_after_the_retention(gpu_job, settings):
    job, attempts = gpu_job
    minute = minutes_back(3)
    usage.samples_record(round_of(attempts, minute, cpu=10.0))
    usage_rollup.usage_rollup()
    usage.samples_record(round_of(attempts, minutes_back(-3), cpu=10.0))  # a mark no roll-up takes yet
    assert JobUsageMinute.objects.filter(job=job).exists() and UsageMinuteMark.objects.filter(job=job).exists()
    # Older than USAGE_MINUTES_DAYS: deleted, as compaction deletes the samples' averages.
    old = usage_rollup.minute_of(timezone.now() - timedelta(days=settings.USAGE_MINUTES_DAYS, minutes=5))
    JobUsageMinute.objects.create(job=job, number=2, minute=old, tasks=1, cpu_sum=1, cpu_min=1, cpu_max=1,
                                  memory_sum=1)
    UsageMinuteMark.objects.create(job=job, number=1, minute=old, stamp=0)
    usage_rollup.usage_rollup()
    assert not JobUsageMinute.objects.filter(job=job, minute=old).exists()
    assert not UsageMinuteMark.objects.filter(job=job, minute=old).exists()
    Job.objects.filter(pk=job.pk).delete()
    assert not JobUsageMinute.objects.filter(job_id=job.pk).exists()
    assert not UsageMinuteMark.objects.filter(job_id=job.pk).exists()


def test_a_minute_whose_samples_are_gone_loses_its_row(gpu_job):
    job, attempts = gpu_job
    minute = minutes_back(3)
    usage.samples_record(round_of(attempts, minute, cpu=10.0))
    usage_rollup.usage_rollup()
    assert rolled(job, minute) is not None
    TaskUsage.objects.filter(attempt__job=job).delete()
    usage_rollup.minutes_mark([(attempts[0].pk, minute)], stamp=0)
    usage_rollup.usage_rollup()
    assert rolled(job, minute) is None
