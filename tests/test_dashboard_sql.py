"""The dashboard's figures counted in the database (jobs/services/dashboard.py):
the same as reading every interval and sample into Python, as the dashboard
did before (`reference` below), at the edges of buckets, windows and time
zones, on SQLite and PostgreSQL alike; and the page's cache of them, for
admins only."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.cache import cache
from django.db import connection
from django.db.models import Q, Sum
from django.db.models.functions import TruncMinute
from django.test import Client, override_settings
from django.utils import timezone

from jobs.models import Job, JobAttempt, Task, TaskAttempt, TaskUsage, VirtualCluster
from jobs.services import dashboard

# Long before any other test's rows (they are made at the test's own time,
# or hours before it): each window here sees only this file's intervals,
# and the reference reads the same rows anyway.
NOW = datetime(2025, 3, 9, 13, 7, 21, 654321, tzinfo=dt_timezone.utc)
MICRO = timedelta(microseconds=1)


def reference(hours: int, now: datetime, vc_gpus: dict[str, int] | None = None) -> dict[str, Any]:
    """The figures as the dashboard counted them before the database did:
    every interval and every minute's samples read into Python. The minutes
    are added in order (before, in the order the database grouped them:
    sorted on SQLite, hash order on PostgreSQL, whose last digit could vary).
    All but gpusTotal (see `counted`)."""
    buckets = dashboard.buckets_for(hours, now)
    end = buckets.start + buckets.count * buckets.step
    overlapping = Q(finished_at__isnull=True) | Q(finished_at__gte=buckets.start)
    waiting, running = [], []
    for vc, created, started, finished in (JobAttempt.objects.filter(overlapping, created_at__lt=end).values_list(
            "job__virtual_cluster__name", "created_at", "started_at", "finished_at")):
        waiting.append((vc, created, started or finished, 1))
        if started is not None:
            running.append((vc, started, finished, 1))
    by_vc, by_user = [], []
    for vc, user, assigned, finished, gpus in (TaskAttempt.objects.filter(overlapping, assigned_at__lt=end)
                                               .exclude(gpus=[]).values_list("job__virtual_cluster__name",
                                                                             "job__owner__username", "assigned_at",
                                                                             "finished_at", "gpus")):
        by_vc.append((vc, assigned, finished, len(gpus)))
        by_user.append((user, assigned, finished, len(gpus)))
    users = dashboard._count_intervals(buckets, by_user)
    top = sorted(users, key=lambda u: -max(users[u]))[:dashboard.TOP_USERS]
    gpus_vc = dashboard._count_intervals(buckets, by_vc)
    tasks = dashboard._count_intervals(buckets, (("tasks", started, finished, 1) for started, finished in (
        TaskAttempt.objects.filter(overlapping, started_at__lt=end).values_list("started_at", "finished_at"))))
    cores, memory = _reference_samples(buckets, end, now)
    figures = {"times": buckets.times(),
               "gpusByVc": gpus_vc, "gpusByUser": {user: users[user] for user in sorted(top)},
               "waitingByVc": dashboard._count_intervals(buckets, waiting),
               "runningByVc": dashboard._count_intervals(buckets, running),
               "tasksRunning": tasks.get("tasks", [0] * buckets.count), "cpuCores": cores, "memoryGiB": memory}
    return dashboard._with_free(figures, vc_gpus)


def _reference_samples(buckets: dashboard.Buckets, end: datetime, now: datetime) -> tuple[list[float], list[float]]:
    from django.conf import settings

    cores, memory = [0.0] * buckets.count, [0.0] * buckets.count
    spans = dashboard._bucket_seconds(buckets, now)
    for averaged in (False, True):
        rows = (TaskUsage.objects.filter(averaged=averaged, at__gte=buckets.start, at__lt=end)
                .annotate(minute=TruncMinute("at")).values_list("minute")
                .annotate(cpu=Sum("cpu_percent"), mem=Sum("memory_bytes")).order_by("minute"))
        seconds = 60.0 if averaged else settings.USAGE_SAMPLE_SECONDS
        for minute, cpu, mem in rows:
            i = min(buckets.count - 1, int((minute - buckets.start) / buckets.step))
            cores[i] += (cpu or 0.0) / 100.0 * seconds / spans[i]
            memory[i] += (mem or 0) / 2**30 * seconds / spans[i]
    return [round(c, 2) for c in cores], [round(m, 3) for m in memory]


def _vc() -> VirtualCluster:
    return VirtualCluster.objects.create(name=f"dsql_{uuid.uuid4().hex[:8]}", open_to_all=True)


def _interval(owner, vc: VirtualCluster, begin: datetime, end: datetime | None, *, gpus: int = 1,
              waited: timedelta = timedelta(0)) -> TaskAttempt:
    """A job of one task that waited `waited`, then held `gpus` GPUs from
    `begin` until `end` (None: still holds them)."""
    job = Job.objects.create(owner=owner, name=f"dsql-{uuid.uuid4().hex[:10]}", virtual_cluster=vc,
                             state="SUCCEEDED" if end else "RUNNING", config_raw="{}", config={},
                             submitted_at=begin - waited, started_at=begin, finished_at=end)
    attempt = JobAttempt.objects.create(job=job, number=1, state=job.state, created_at=begin - waited,
                                        started_at=begin, finished_at=end)
    task = Task.objects.create(job=job, role="main", index=0)
    return TaskAttempt.objects.create(task=task, job_attempt=attempt, job=job, number=1, state=job.state,
                                      gpus=list(range(gpus)), assigned_at=begin, started_at=begin, finished_at=end)


@pytest.fixture
def edges(make_user) -> Iterator[dict[str, VirtualCluster]]:
    """An interval at each edge of NOW's 6-hour window (5-minute buckets),
    each in a virtual cluster of its own."""
    owner = make_user("dsql")
    buckets = dashboard.buckets_for(6, NOW)
    at = lambda i, extra=timedelta(0): buckets.start + i * buckets.step + extra  # noqa: E731
    cases: dict[str, Callable[[VirtualCluster], Any]] = {
        "from before the window": lambda vc: _interval(owner, vc, at(0, -timedelta(hours=3)), at(3), gpus=2),
        "still open": lambda vc: _interval(owner, vc, at(10), None, gpus=4, waited=timedelta(minutes=7)),
        "open since before the window": lambda vc: _interval(owner, vc, at(0, -timedelta(days=1)), None),
        "ends at a bucket's start": lambda vc: _interval(owner, vc, at(5), at(8)),
        "a microsecond after starts": lambda vc: _interval(owner, vc, at(12, MICRO), at(15, MICRO)),
        "a microsecond before starts": lambda vc: _interval(owner, vc, at(20, -MICRO), at(22, -MICRO)),
        "between two starts": lambda vc: _interval(owner, vc, at(30, timedelta(seconds=1)), at(30, timedelta(seconds=299))),
        "ends before it begins": lambda vc: _interval(owner, vc, at(40), at(35)),
        "ends as it begins": lambda vc: _interval(owner, vc, at(41), at(41)),
        "ends at the window's start": lambda vc: _interval(owner, vc, at(0, -timedelta(hours=1)), at(0)),
        "after now, in the last bucket": lambda vc: _interval(owner, vc, NOW + timedelta(seconds=30), None),
    }
    made = {}
    for name, make in cases.items():
        made[name] = vc = _vc()
        attempt = make(vc)
        # Samples at a bucket's start, a microsecond before it, and in the last (open) bucket.
        TaskUsage.objects.bulk_create([
            TaskUsage(attempt=attempt, at=at(44), cpu_percent=150.0, memory_bytes=3 * 2**30),
            TaskUsage(attempt=attempt, at=at(44, -MICRO), cpu_percent=70.5, memory_bytes=2**29),
            TaskUsage(attempt=attempt, at=at(2, timedelta(seconds=59, microseconds=999999)), averaged=True,
                      cpu_percent=33.3, memory_bytes=2**28 + 1),
            TaskUsage(attempt=attempt, at=at(buckets.count - 1, timedelta(seconds=5)), cpu_percent=400.0,
                      memory_bytes=2**32),
        ])
    # Users tied at their most GPUs, more than are shown: the first to hold them come first.
    made["ties"] = tied = _vc()
    for _ in range(dashboard.TOP_USERS + 2):
        _interval(make_user("dtie"), tied, at(50), at(60))
    yield made
    # Open intervals would hold GPUs in every later test's window.
    Job.objects.filter(virtual_cluster__in=made.values()).delete()
    VirtualCluster.objects.filter(pk__in=[vc.pk for vc in made.values()]).delete()


def counted(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures counted over the window. Not gpusTotal, the READY nodes'
    GPUs now, by one query both ways: the nodes are the live test
    cluster's, whose agents mark a node left behind by an earlier test lost
    whenever its heartbeat runs out, between two reads as well (CI 114:
    162 GPUs, then 158)."""
    return {name: value for name, value in figures.items() if name != "gpusTotal"}


def test_it_counts_every_edge_as_counting_each_interval_did(edges):
    buckets = dashboard.buckets_for(6, NOW)
    figures = dashboard.cluster_over_time(hours=6, now=NOW)
    assert counted(figures) == reference(6, NOW)
    gpus = figures["gpusByVc"]
    covered = lambda name: [i for i, n in enumerate(gpus.get(edges[name].name, [])) if n]  # noqa: E731
    assert covered("from before the window") == [0, 1, 2] and gpus[edges["from before the window"].name][0] == 2
    assert covered("still open") == list(range(10, buckets.count))
    assert covered("open since before the window") == list(range(buckets.count))
    assert covered("ends at a bucket's start") == [5, 6, 7]
    assert covered("a microsecond after starts") == [13, 14, 15]
    assert covered("a microsecond before starts") == [20, 21]
    for name in ("between two starts", "ends before it begins", "ends as it begins", "ends at the window's start",
                 "after now, in the last bucket"):
        assert edges[name].name not in gpus, name
    waited = figures["waitingByVc"][edges["still open"].name]
    assert [i for i, n in enumerate(waited) if n] == [9]  # created at 9's start + 3 min, waited until 10's start
    tied = list(TaskAttempt.objects.filter(job__virtual_cluster=edges["ties"]).order_by("id")
                .values_list("job__owner__username", flat=True))
    shown = set(figures["gpusByUser"]) - set(tied)
    assert len(shown) == 1 and set(figures["gpusByUser"]) == shown | set(tied[:dashboard.TOP_USERS - 1])
    assert figures["cpuCores"][44] > 0 and figures["cpuCores"][43] > 0 and figures["cpuCores"][-1] > 0


@pytest.mark.parametrize("hours", list(dashboard.WINDOWS))
@pytest.mark.parametrize("zone", ["UTC", "Asia/Kathmandu", "America/St_Johns"])
def test_every_window_in_any_time_zone_gives_the_figures_of_before(edges, hours, zone):
    # Buckets start at midnight where `now` is: for 2-hour buckets at
    # +05:45 that is a quarter past an odd hour, in UTC. Newfoundland moved
    # its clocks that morning: the window is wall-clock, its buckets' count
    # elapsed time (Buckets.index), an hour apart at its end.
    now = NOW.astimezone(ZoneInfo(zone))
    shares = {edges["still open"].name: 6, edges["from before the window"].name: 1}
    figures = dashboard.cluster_over_time(hours=hours, vc_gpus=shares, now=now)
    expected = reference(hours, now, shares)
    assert counted(figures) == expected
    assert list(figures["gpusByVc"]) == list(expected["gpusByVc"])


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kathmandu"])
def test_samples_at_each_windows_edges_are_summed_as_before(make_user, zone):
    # The minutes are grouped by their text on SQLite (MinuteOf): each sample
    # must land in the same minute, bucket and window as counted before.
    now = NOW.astimezone(ZoneInfo(zone))
    vc = _vc()
    attempt = _interval(make_user("dsql"), vc, NOW - timedelta(days=9), None)
    try:
        for hours in dashboard.WINDOWS:
            buckets = dashboard.buckets_for(hours, now)
            end = buckets.start + buckets.count * buckets.step
            middle = buckets.start + buckets.count // 2 * buckets.step
            edges = [buckets.start - MICRO, buckets.start, buckets.start + timedelta(seconds=59, microseconds=999999),
                     buckets.start + timedelta(minutes=1), middle - MICRO, middle, end - MICRO, end]
            TaskUsage.objects.bulk_create([
                TaskUsage(attempt=attempt, at=at, averaged=averaged, cpu_percent=12.34 + n,
                          memory_bytes=2**27 * (n + 1)) for n, at in enumerate(edges) for averaged in (False, True)])
        for hours in dashboard.WINDOWS:
            assert counted(dashboard.cluster_over_time(hours=hours, now=now)) == reference(hours, now), hours
    finally:
        Job.objects.filter(virtual_cluster=vc).delete()
        vc.delete()


def test_it_refuses_buckets_of_part_seconds():
    buckets = dashboard.Buckets(start=NOW, step=timedelta(minutes=5), count=3)
    with pytest.raises(ValueError):
        dashboard._window_seconds(buckets)


def _figures_on_page(client: Client, hours: str = "6") -> dict[str, Any]:
    response = client.get("/dashboard/", {"hours": hours})
    assert response.status_code == 200
    return response.context["series"]


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _recent_gpus(owner) -> VirtualCluster:
    """A finished job that held a GPU for the last three hours, in a virtual
    cluster of its own: long enough to cover a bucket's start in every
    window, the week's two-hour buckets included, whatever the time of day
    (a figure counts what covers each bucket's start)."""
    vc = _vc()
    now = timezone.now()
    _interval(owner, vc, now - timedelta(hours=3), now - timedelta(minutes=5))
    return vc


@override_settings(DASHBOARD_CACHE_SECONDS=300)
def test_it_keeps_a_windows_figures_for_every_admin_a_while(make_user):
    first, second = make_user("dadmin", admin=True), make_user("dadmin", admin=True)
    for hours in dashboard.WINDOWS:
        cache.delete(dashboard.cache_key(hours))
    before = _figures_on_page(_logged_in(first))
    vc = _recent_gpus(first)
    kept = _figures_on_page(_logged_in(second))
    assert kept["times"] == before["times"] and vc.name not in kept["gpusByVc"]
    # Another window is computed apart, and an unknown one is the day's.
    assert vc.name in _figures_on_page(_logged_in(second), "168")["gpusByVc"]
    day = _figures_on_page(_logged_in(second), "24")
    assert _figures_on_page(_logged_in(first), "5000") == day
    with override_settings(DASHBOARD_CACHE_SECONDS=0):
        cache.delete(dashboard.cache_key(6))
        assert vc.name in _figures_on_page(_logged_in(second))["gpusByVc"]
        _recent_gpus(first)
        assert cache.get(dashboard.cache_key(6)) is None


@override_settings(DASHBOARD_CACHE_SECONDS=300)
def test_kept_figures_are_still_for_admins_only(make_user, alice):
    admin = make_user("dadmin", admin=True)
    vc = _recent_gpus(admin)
    cache.delete(dashboard.cache_key(24))
    assert vc.name in _figures_on_page(_logged_in(admin), "24")["gpusByVc"]
    refused = _logged_in(alice).get("/dashboard/", {"hours": "24"})
    assert refused.status_code == 403 and vc.name not in refused.content.decode()
    anonymous = Client().get("/dashboard/", {"hours": "24"})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert vc.name not in anonymous.content.decode()


# Each table a window reads, and the index that keeps the read to the window.
WINDOW_INDEXES = {"jobs_jobattempt": "job_attempt_finished_idx", "jobs_taskattempt": "task_attempt_finished_idx",
                  "jobs_taskusage": "task_usage_kind_at_idx"}


def _plan(sql: str, params: tuple) -> str:
    """`sql`'s plan as text. As the portal runs: no ANALYZE on SQLite (it
    never runs one), and on PostgreSQL, which scans tables as small as the
    tests' whatever their indexes, with scans made dear."""
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            return " | ".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute(f"EXPLAIN {sql}", params)
            return " | ".join(str(row[0]) for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")


@pytest.mark.parametrize("hours", list(dashboard.WINDOWS))
def test_a_window_reads_its_attempts_and_samples_along_their_indexes(hours):
    # Migration 0023: months of history hold millions of attempts and 30
    # days of minute averages; a window must read those that ended within
    # it or still run, and its samples, not every row.
    executed: list[tuple[str, tuple]] = []

    def record(execute, sql, params, many, context):
        executed.append((sql, tuple(params or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        dashboard.cluster_over_time(hours=hours, now=timezone.now())
    read = {table: [_plan(sql, params) for sql, params in executed if f'FROM "{table}"' in sql]
            for table in WINDOW_INDEXES}
    assert [len(plans) for plans in read.values()] == [2, 2, 2], read
    for table, index in WINDOW_INDEXES.items():
        for plan in read[table]:
            assert index in plan, plan
            if connection.vendor == "sqlite":
                assert f"SCAN {table}" not in plan, plan
            else:
                assert f"Seq Scan on {table}" not in plan, plan
