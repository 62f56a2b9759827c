"""A job's usage added up per time bucket (jobs/services/usage_series.py)
and the API that gives it (v2 `jobs/{user}~{name}/metrics/summary`), over
samples written into a real database. Jobs are rows only
(tests/test_big_job_queries.py big_job). Users: alice owns the jobs, bob is
another user, admin an admin."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from jobs.models import JobUsageMinute, Node, TaskAttempt, TaskUsage
from jobs.services import usage_rollup, usage_series
from tests.test_big_job_queries import api_client, big_job, idle_node, queries_of

node = pytest.fixture(idle_node, name="node")


def summary_url(job) -> str:
    return f"/api/v2/jobs/{job.owner.username}~{job.name}/metrics/summary"


def at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def sample(attempt: TaskAttempt, when: datetime, *, cpu: float, memory: int, gpus: list[float] = (),
           indexes: list[int] | None = None) -> TaskUsage:
    """GPU figures `gpus` of the node's GPUs `indexes` (0, 1, ... unless given)."""
    return TaskUsage(attempt=attempt, at=when, cpu_percent=cpu, memory_bytes=memory,
                     gpus=[{"index": i, "utilPercent": u, "memoryUsedBytes": 1}
                           for i, u in zip(indexes if indexes is not None else range(len(gpus)), gpus)])


def store(rows: list[TaskUsage]) -> None:
    """Samples written as usage.samples_record writes them: their minutes
    marked for the roll-up in the same transaction."""
    with transaction.atomic():
        rows = TaskUsage.objects.bulk_create(rows)
        usage_rollup.minutes_mark(((row.attempt_id, row.at) for row in rows), stamp=max(row.pk for row in rows))


def test_bucket_widths_keep_an_answer_to_a_few_hundred_points(settings):
    settings.USAGE_SAMPLE_SECONDS = 5.0
    settings.USAGE_DETAIL_HOURS = 24.0
    assert usage_series.bucket_width(600) == 10  # two sample periods: every task has a sample in each
    assert usage_series.bucket_width(3600) == 10
    assert usage_series.bucket_width(6 * 3600) == 60
    assert usage_series.bucket_width(24 * 3600) == 300
    assert usage_series.bucket_width(30 * 86400) == 7200
    # Past the detailed samples, one-minute averages: a bucket holds a minute.
    settings.USAGE_DETAIL_HOURS = 0.5
    assert usage_series.bucket_width(3600) == 60
    for window in (60, 3600, 7 * 86400, 30 * 86400):
        assert window / usage_series.bucket_width(window) <= usage_series.MAX_POINTS


def test_it_adds_up_each_bucket_as_computed_by_hand(alice, node):
    """Three tasks, 10 s buckets. Samples on a bucket's first microsecond
    count in it, one a microsecond before its end in it too, the next
    microsecond in the next. A task sampled twice in a bucket counts once,
    as its mean; each GPU likewise."""
    Node.objects.filter(pk=node.pk).update(gpus_simulated=False)
    job = big_job(alice, node, tasks=3, attempts=2, samples=0)
    a, b, c = TaskAttempt.objects.filter(job=job, number=2).order_by("task__index")
    old = TaskAttempt.objects.get(job=job, number=1, task__index=0)
    TaskAttempt.objects.filter(pk__in=[a.pk, b.pk]).update(gpus=[0, 1])
    edge = 1_800_000_000  # a multiple of 10 s
    now = at(edge + 45)  # buckets edge, +10 and +20 are whole and settled (10 s); +30 is not yet
    GiB = 2**30
    store([
        # bucket `edge`
        sample(a, at(edge), cpu=100.0, memory=2 * GiB, gpus=[10.0, 90.0]),
        sample(a, at(edge + 10) - timedelta(microseconds=1), cpu=200.0, memory=4 * GiB, gpus=[30.0, 70.0]),
        sample(b, at(edge + 5), cpu=50.0, memory=1 * GiB, gpus=[0.0, 0.0]),
        sample(c, at(edge + 9.5), cpu=400.0, memory=GiB // 2),  # a task without GPU figures
        sample(old, at(edge + 5), cpu=999.0, memory=99 * GiB, gpus=[100.0]),  # an earlier attempt's: not counted
        # bucket edge + 10: only `a`
        sample(a, at(edge + 10), cpu=10.0, memory=GiB, gpus=[50.0, 50.0]),
        # bucket edge + 20: none (left out); edge + 30: not whole yet
        sample(b, at(edge + 30), cpu=1.0, memory=1),
        # before the window
        sample(a, at(edge - 3600 - 1), cpu=1.0, memory=1),
    ])
    series = usage_series.job_series(job_id=job.pk, number=2, window_seconds=3600, now=now)
    assert series.width == 10 and series.end == at(edge + 30)
    assert series.start == at(edge + 40 - 3600)  # the bucket holding now - window
    first, second = series.buckets
    assert first.start == at(edge) and first.tasks == 3
    # a: mean 150 % and 3 GiB; b: 50 %, 1 GiB; c: 400 %, 0.5 GiB
    assert first.cpu_cores == pytest.approx((150 + 50 + 400) / 100)
    assert first.cpu_percent == usage_series.Spread(pytest.approx(200.0), 50.0, 400.0)
    assert first.memory_bytes == 3 * GiB + GiB + GiB // 2
    # GPUs: a's 0 at 20 %, a's 1 at 80 %, b's two at 0 %
    assert first.gpus == 4
    assert first.gpu_percent == usage_series.Spread(pytest.approx(25.0), 0.0, 80.0)
    assert second.start == at(edge + 10) and second.tasks == 1
    assert (second.cpu_cores, second.memory_bytes, second.gpus) == (pytest.approx(0.1), GiB, 2)
    assert second.gpu_percent == usage_series.Spread(50.0, 50.0, 50.0)

    # Polls: only buckets after the newest one had.
    later = usage_series.job_series(job_id=job.pk, number=2, window_seconds=3600, since=first.start, now=now)
    assert [bucket.start for bucket in later.buckets] == [at(edge + 10)]
    assert usage_series.job_series(job_id=job.pk, number=2, since=second.start, now=now).buckets == []
    # The bucket edge + 30 once it is whole (and its samples settled).
    settled = at(edge + 40 + usage_series.settle_seconds())
    newest = usage_series.job_series(job_id=job.pk, number=2, since=second.start, now=settled).buckets
    assert [(bucket.start, bucket.tasks, bucket.gpu_percent) for bucket in newest] == [(at(edge + 30), 1, None)]


def test_the_api_gives_the_buckets_in_the_documented_shape(alice, node):
    Node.objects.filter(pk=node.pk).update(gpus_simulated=False)
    job = big_job(alice, node, tasks=2, attempts=1, samples=0)
    one, two = TaskAttempt.objects.filter(job=job).order_by("task__index")
    edge = (int(time.time()) // 10 - 3) * 10  # whole and settled
    store([sample(one, at(edge + 1), cpu=150.0, memory=3000, gpus=[40.0], indexes=one.gpus),
           sample(two, at(edge + 2), cpu=50.0, memory=1000, gpus=[60.0], indexes=two.gpus)])
    client = Client()
    client.force_login(alice)
    body = client.get(summary_url(job)).json()
    assert (body["job"], body["attempt"], body["taskCount"], body["window"], body["bucketSeconds"]) == (
        f"{alice.username}~{job.name}", 1, 2, 3600, 10)
    assert body["buckets"] == [{
        "time": at(edge).isoformat(timespec="milliseconds").replace("+00:00", "Z"), "tasks": 2, "cpuCores": 2.0,
        "cpuPercent": {"mean": 100.0, "min": 50.0, "max": 150.0}, "memoryBytes": 4000, "gpus": 2,
        "gpuPercent": {"mean": 50.0, "min": 40.0, "max": 60.0}}]
    assert body["from"] < body["buckets"][0]["time"] < body["until"]
    # since: the newest bucket had gives nothing new; one before it gives it.
    assert client.get(summary_url(job), {"since": body["buckets"][0]["time"]}).json()["buckets"] == []
    since = at(edge - 10).isoformat()
    assert len(client.get(summary_url(job), {"since": since}).json()["buckets"]) == 1
    # Another window, wider buckets; the newest is whole only at its end.
    store([sample(one, at(edge - 900), cpu=1.0, memory=1)])
    wide = client.get(summary_url(job), {"window": 86400}).json()
    assert wide["bucketSeconds"] == 300 and wide["until"] <= timezone.now().isoformat()
    assert wide["buckets"][0]["time"] == at((edge - 900) // 300 * 300).isoformat().replace("+00:00", ".000Z")
    assert wide["buckets"][0]["tasks"] == 1


def test_a_tasks_gpus_are_known_by_their_index_not_their_place_in_a_sample(alice, node):
    """A task holds GPUs 5 and 2 of its node. NVML could not read GPU 5 in
    one sample (the sampler skips it, and GPU 2 moves up), and another
    lists them the other way round: each GPU is still averaged with itself
    in the bucket, 5 at 20 %, 2 at 70 %. By place it was 43.3 % and 60 %."""
    Node.objects.filter(pk=node.pk).update(gpus_simulated=False)
    job = big_job(alice, node, tasks=1, attempts=1, samples=0)
    task = TaskAttempt.objects.get(job=job)
    TaskAttempt.objects.filter(pk=task.pk).update(gpus=[5, 2])
    edge = 1_800_000_000
    store([
        sample(task, at(edge + 1), cpu=1.0, memory=1, gpus=[10.0, 90.0], indexes=[5, 2]),
        sample(task, at(edge + 3), cpu=1.0, memory=1, gpus=[70.0], indexes=[2]),
        sample(task, at(edge + 5), cpu=1.0, memory=1, gpus=[50.0, 30.0], indexes=[2, 5]),
        sample(task, at(edge + 7), cpu=1.0, memory=1, gpus=[99.0], indexes=[7]),  # not the task's: not counted
    ])
    bucket, = usage_series.job_series(job_id=job.pk, number=1, window_seconds=600, now=at(edge + 30)).buckets
    assert (bucket.tasks, bucket.gpus) == (1, 2)
    assert bucket.gpu_percent == usage_series.Spread(pytest.approx(45.0), pytest.approx(20.0), pytest.approx(70.0))
    # The roll-up's minute (wider buckets) knows them so too.
    minute = usage_rollup.minute_figures(edge // 60, {(job.pk, 1)})[(job.pk, 1)]
    assert (minute.gpus, minute.gpu_min, minute.gpu_max) == (2, pytest.approx(20.0), pytest.approx(70.0))


@pytest.mark.parametrize(("name", "value"), [
    ("since", "yesterday"), ("since", "2026-13-01T00:00:00Z"), ("since", "9999-12-31T23:59:59-01:00"),
    ("window", "abc"), ("window", "0"), ("window", "59"), ("window", "-3600"), ("window", "1e3"),
    ("window", str(10**12)), ("window", "3600.5"), ("attempt", "0"),
])
def test_a_bad_since_or_window_is_a_400_naming_it(alice, node, name, value):
    job = big_job(alice, node, tasks=1, attempts=1, samples=1)
    answer = api_client(alice).get(summary_url(job), {name: value})
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "InvalidParametersError" and name in answer.json()["message"]


@pytest.mark.parametrize("since", ["9999-12-31T23:59:59.999Z", "0001-01-01T00:00:00Z", "2026-05-04T10:11:12+05:00"])
def test_a_since_far_off_is_answered(alice, node, since):
    job = big_job(alice, node, tasks=1, attempts=1, samples=1)
    answer = api_client(alice).get(summary_url(job), {"since": since})
    assert answer.status_code == 200, answer.content


def test_it_answers_the_owner_and_admins_and_refuses_others(alice, bob, admin_user, node):
    job = big_job(alice, node, tasks=2, attempts=1, samples=3)
    assert api_client(alice).get(summary_url(job)).status_code == 200
    assert api_client(admin_user).get(summary_url(job)).status_code == 200
    stranger = api_client(bob).get(summary_url(job))
    assert stranger.status_code == 404 and stranger.json()["code"] == "NoJobError"
    assert Client().get(summary_url(job)).status_code == 401
    assert Client().get("/rest-server" + summary_url(job)).status_code == 401


# ----------------------------------------------------- the samples budget


@pytest.mark.parametrize("detail_hours", [24.0, 0.5])
@pytest.mark.parametrize("tasks", [1, 12, 100, 1000])
def test_the_longest_raw_window_is_the_last_whose_samples_fit_the_budget(settings, tasks, detail_hours):
    settings.USAGE_SAMPLE_SECONDS, settings.USAGE_DETAIL_HOURS = 5.0, detail_hours
    settings.USAGE_SUMMARY_MAX_SAMPLES = 200_000
    longest = usage_series.longest_raw_window(tasks=tasks)
    assert usage_series.samples_read(tasks=tasks, window_seconds=longest) <= 200_000
    if longest < usage_series.max_window_seconds():
        assert usage_series.samples_read(tasks=tasks, window_seconds=longest + 1) > 200_000
    # 1,000 tasks every 5 s: 1,000 s of samples.
    assert usage_series.longest_raw_window(tasks=1000) == 1000


def test_the_estimate_is_never_under_the_samples_a_window_holds(alice, node, settings):
    settings.USAGE_SAMPLE_SECONDS = 5.0
    job = big_job(alice, node, tasks=7, samples=0)
    hour_of_samples(job)
    held = TaskUsage.objects.filter(attempt__job=job).count()
    assert held == 7 * 720 and usage_series.samples_read(tasks=7, window_seconds=3600) == held


def test_a_window_whose_samples_are_over_the_budget_comes_in_minutes_for_any_task_count(alice, bob, node, settings):
    """100 tasks at a budget of 10,000 samples: 500 s of raw samples. An
    hour is allowed and comes in one-minute buckets from the roll-up; so
    does any window up to USAGE_MINUTES_DAYS."""
    settings.USAGE_SAMPLE_SECONDS = 5.0
    settings.USAGE_SUMMARY_MAX_SAMPLES = 10_000
    job = big_job(alice, node, tasks=100, attempts=1, samples=0)
    hour_of_samples(job)
    client = api_client(alice)
    usage_rollup.usage_rollup(max_minutes=120)
    hour = client.get(summary_url(job), {"window": 3600}).json()
    assert (hour["window"], hour["bucketSeconds"], hour["maxWindow"]) == (3600, 60, usage_series.max_window_seconds())
    assert len(hour["buckets"]) >= 58 and {b["tasks"] for b in hour["buckets"]} == {100}
    # The longest window kept, whatever the task count; one past it is a 400.
    longest = usage_series.max_window_seconds()
    assert client.get(summary_url(job), {"window": longest}).status_code == 200
    refused = client.get(summary_url(job), {"window": longest + 1})
    assert refused.status_code == 400 and "window" in refused.json()["message"]
    # Within the budget: raw samples, 10 s buckets.
    assert client.get(summary_url(job), {"window": 300}).json()["bucketSeconds"] == 10
    # Others are refused as before, whatever the window.
    for window in (60, 3600, 86400):
        assert api_client(bob).get(summary_url(job), {"window": window}).status_code == 404
        assert Client().get(summary_url(job), {"window": window}).status_code == 401


def test_a_job_page_offers_windows_up_to_the_retention_whatever_its_task_count(alice, node, settings):
    settings.USAGE_SUMMARY_MAX_SAMPLES = 10_000
    job = big_job(alice, node, tasks=12, attempts=1, samples=0)
    client = Client()
    client.force_login(alice)
    longest = usage_series.max_window_seconds()
    assert f'data-max-window="{longest}"' in client.get(f"/jobs/{job.pk}/").content.decode()


def hour_of_samples(job, *, every: int = 5) -> datetime:
    """An hour of samples of each of the job's tasks, every `every` seconds,
    written by one INSERT ... SELECT (a million rows through bulk_create
    took minutes). Returns the newest sample's time."""
    newest = timezone.now().replace(microsecond=0) - timedelta(seconds=30)
    attempts = TaskAttempt.objects.filter(job=job, number=job.attempt_number)
    steps = 3600 // every
    table, attempt_table = TaskUsage._meta.db_table, TaskAttempt._meta.db_table
    # Each task's figures of the GPU it holds, as its node's sampler writes them.
    if connection.vendor == "postgresql":
        time_sql = "%s - make_interval(secs => s.k * %s)"
        gpus_sql = "jsonb_build_array(jsonb_build_object('index', a.gpus -> 0, 'utilPercent', 80.0, 'memoryUsedBytes', 1))"
    else:
        time_sql = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s, '-' || (s.k * %s) || ' seconds')"
        gpus_sql = "json_array(json_object('index', json_extract(a.gpus, '$[0]'), 'utilPercent', 80.0, 'memoryUsedBytes', 1))"
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE s(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM s WHERE k + 1 < %s) "
            f"INSERT INTO {table} (attempt_id, at, averaged, cpu_percent, memory_bytes, network_rx_bytes, "
            f"network_tx_bytes, block_read_bytes, block_write_bytes, gpus) "
            f"SELECT a.id, {time_sql}, %s, 50.0 + (a.id %% 50), 1073741824, 0, 0, 0, 0, {gpus_sql} "
            f"FROM {attempt_table} a, s WHERE a.id IN ({','.join('%s' for _ in attempts)})",
            [steps, connection.ops.adapt_datetimefield_value(newest), every, False,
             *attempts.values_list("pk", flat=True)])
        cursor.execute(f"SELECT MAX(id) FROM {table}")
        (stamp,) = cursor.fetchone()
    # Marked for the roll-up, as usage.samples_record does.
    minutes = {(newest - timedelta(seconds=every * k)).replace(second=0) for k in range(steps)}
    usage_rollup.minutes_mark(((pk, when) for pk in attempts.values_list("pk", flat=True) for when in minutes),
                              stamp=stamp)
    return newest


def test_a_1000_task_job_gets_an_hour_of_points_in_queries_that_do_not_grow_with_its_tasks(alice, node):
    """The hour's 720,000 samples are over the budget: one-minute buckets
    from the roll-up, as the node agents fill it; the raw samples of the
    rolled-up minutes are not read (deleted here, the answer is the same)."""
    client = api_client(alice)
    small = big_job(alice, node, tasks=10, samples=0)
    big = big_job(alice, node, tasks=1000, samples=0)
    for job in (small, big):
        newest = hour_of_samples(job)
    # Rolled up past the newest sample (no more come): no minute of either
    # job is left to read raw, so both answers take the same queries.
    usage_rollup.usage_rollup(now=newest + timedelta(minutes=2), max_minutes=120)
    started = time.perf_counter()
    body = client.get(summary_url(big)).json()
    print(f"\n1,000 tasks, an hour at 5 s: {time.perf_counter() - started:.2f} s, {len(body['buckets'])} buckets")
    assert body["bucketSeconds"] == 60 and body["taskCount"] == 1000 and body["window"] == 3600
    buckets = body["buckets"]
    times = [datetime.fromisoformat(bucket["time"]) for bucket in buckets]
    assert all(later - earlier == timedelta(seconds=60) for earlier, later in zip(times, times[1:]))
    # Up to the newest samples' minute (or the one before, if it was not
    # whole yet when asked), however long filling the hour took.
    assert times[-1] - times[0] >= timedelta(minutes=58) and newest - times[-1] < timedelta(seconds=120)
    assert {bucket["tasks"] for bucket in buckets[1:]} == {1000}
    assert buckets[-1]["cpuCores"] == pytest.approx(sum(50 + pk % 50 for pk in TaskAttempt.objects.filter(
        job=big, number=big.attempt_number).values_list("pk", flat=True)) / 100)
    assert buckets[-1]["gpuPercent"] == {"mean": 80.0, "min": 80.0, "max": 80.0}
    # Every minute of the hour is rolled up (an agent of the test cluster
    # rolling too changes nothing): its samples are not read.
    TaskUsage.objects.filter(attempt__job=big).delete()
    again = {bucket["time"]: bucket for bucket in client.get(summary_url(big)).json()["buckets"]}
    same = [bucket for bucket in buckets if bucket["time"] in again]  # the window may have moved on a minute
    assert len(same) >= len(buckets) - 1 and all(again[bucket["time"]] == bucket for bucket in same)
    since = buckets[-3]["time"]
    after = [b["time"] for b in client.get(summary_url(big), {"since": since}).json()["buckets"]]
    # The newest minute may have become whole since the first answer: one more.
    assert after[:2] == [b["time"] for b in buckets[-2:]] and len(after) <= 3, after
    assert JobUsageMinute.objects.filter(job=big).count() >= 60
    for query in ("?window=86400", f"?window=86400&since={since}"):
        counts = [queries_of(client, summary_url(job) + query) for job in (small, big)]
        assert counts[0] == counts[1], counts
