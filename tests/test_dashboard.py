"""The admin dashboard (jobs/views/dashboard.py, jobs/services/dashboard.py):
who may see it, and the figures it builds from job rows and usage samples."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone as dt_timezone

from django.test import Client
from django.utils import timezone

from jobs.models import IdleGpus, JobAttempt, TaskAttempt, VirtualCluster
from jobs.services import dashboard, usage
from tests.helpers import config, role, submit
from tests.test_usage import node, running_tasks  # noqa: F401  (fixture)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_it_answers_admins_only(alice, admin_user):
    assert logged_in(admin_user).get("/dashboard/").status_code == 200
    assert logged_in(alice).get("/dashboard/").status_code == 403
    anonymous = Client().get("/dashboard/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_it_shows_the_window_asked_for_and_falls_back_to_a_day(admin_user):
    client = logged_in(admin_user)
    assert "last 6 hours" in client.get("/dashboard/", {"hours": "6"}).content.decode()
    assert "last 24 hours" in client.get("/dashboard/", {"hours": "5000"}).content.decode()


T0 = datetime(2026, 5, 4, 10, 0, tzinfo=dt_timezone.utc)


def test_buckets_count_each_interval_at_the_start_of_every_bucket_it_covers():
    buckets = dashboard.Buckets(start=T0, step=timedelta(minutes=10), count=6)
    at = lambda minutes: T0 + timedelta(minutes=minutes)  # noqa: E731
    series = dashboard._count_intervals(buckets, [
        ("a", at(-30), at(25), 1),  # covers 0, 10, 20
        ("a", at(10), None, 2),  # still running: 10 .. 50
        ("b", at(3), at(9), 1),  # between two bucket starts: never seen
    ])
    assert series["a"] == [1, 3, 3, 2, 2, 2]
    assert "b" not in series


def test_the_buckets_end_with_the_one_holding_now():
    now = datetime(2026, 5, 4, 10, 7, tzinfo=dt_timezone.utc)
    buckets = dashboard.buckets_for(24, now)
    assert buckets.step == timedelta(minutes=15) and buckets.count == 97
    last = buckets.start + (buckets.count - 1) * buckets.step
    assert last == datetime(2026, 5, 4, 10, 0, tzinfo=dt_timezone.utc)


def test_it_counts_waiting_and_running_jobs_and_gpus_per_virtual_cluster_and_user(alice, admin_user, node):
    vc = VirtualCluster.objects.create(name=f"dash_{uuid.uuid4().hex[:8]}", open_to_all=True)
    attempts = running_tasks(alice, node, 2)
    job = attempts[0].job
    now = timezone.now()
    JobAttempt.objects.filter(job=job).update(created_at=now - timedelta(hours=3), started_at=now - timedelta(hours=2))
    TaskAttempt.objects.filter(job=job).update(assigned_at=now - timedelta(hours=2), started_at=now - timedelta(hours=2))
    type(job).objects.filter(pk=job.pk).update(virtual_cluster=vc)
    waiting = submit(alice, config(f"dash-wait-{uuid.uuid4().hex[:6]}", role(gpus=64), virtualCluster=vc.name))
    JobAttempt.objects.filter(job=waiting).update(created_at=now - timedelta(hours=1))
    # A minute of samples inside one 5-minute bucket (they start at midnight):
    # a minute straddling two buckets would be shared between them.
    bucket = now.replace(second=0, microsecond=0) - timedelta(minutes=30 + now.minute % 5)
    usage.samples_record([usage.Sample(a.pk, bucket + timedelta(minutes=2, seconds=s), cpu_percent=200,
                                       memory_bytes=2**30) for a in attempts for s in range(0, 60, 5)])

    figures = dashboard.cluster_over_time(hours=6, vc_gpus={vc.name: 10}, now=now)
    running, queued = figures["runningByVc"][vc.name], figures["waitingByVc"][vc.name]
    times = figures["times"]
    at = lambda hours_ago: max(i for i, t in enumerate(times) if t <= (now - timedelta(hours=hours_ago)).timestamp())  # noqa: E731
    assert (queued[at(2.5)], running[at(2.5)]) == (1, 0)  # created, not started yet
    assert (queued[at(1.5)], running[at(1.5)]) == (0, 1)
    assert (queued[at(0)], running[at(0)]) == (1, 1)  # the second job waits since an hour ago
    assert figures["gpusByVc"][vc.name][at(0)] == 2 and figures["gpusByVc"][vc.name][at(2.5)] == 0
    assert figures["gpusByUser"][alice.username][at(0)] == 2
    assert figures["gpusFreeByVc"][vc.name][at(0)] == 8 and figures["gpusFreeByVc"][vc.name][at(2.5)] == 10
    assert figures["tasksRunning"][at(0)] >= 2  # other tests' tasks may run too
    assert max(figures["cpuCores"]) >= 4 * 12 * 5 / 300 * 0.99  # 2 tasks x 2 cores for a minute of a 5-min bucket
    assert figures["gpusTotal"] >= 4


def test_it_lists_tasks_flagged_for_idle_gpus(alice, admin_user, node):
    (attempt,) = running_tasks(alice, node, 1)
    IdleGpus.objects.create(attempt=attempt, since=timezone.now() - timedelta(hours=1))
    page = logged_in(admin_user).get("/dashboard/").content.decode()
    assert f'data-idle-task="{attempt.pk}"' in page and attempt.job.name in page
