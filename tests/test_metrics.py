"""/metrics: who may read it, what it says, and what a scrape costs.

Through Django's test client against the session's real database and Redis.
The numbers checked belong to rows the test made itself (a virtual cluster,
nodes and a notify queue of its own), so other tests' jobs never change them.
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Max
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs import queues, services
from jobs.models import (
    GpuAllocation,
    Job,
    JobAttempt,
    LogLine,
    Node,
    Stream,
    Task,
    TaskAttempt,
    TaskUsage,
    VirtualCluster,
)
from jobs.services import tokens
from tests.helpers import config, role, submit

METRICS_TOKEN = "m" * 40


def scrape(client: Client | None = None, **headers: str):
    return (client or Client()).get("/metrics", **headers)


def samples(response) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value}."""
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=")
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def value(found, name: str, **labels: str) -> float:
    return found[name, tuple(sorted(labels.items()))]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def bearer(user) -> str:
    return "Bearer " + tokens.token_create(user=user, lifetime=timedelta(hours=1), label="metrics").key


@pytest.fixture
def vc() -> VirtualCluster:
    return VirtualCluster.objects.create(name=f"metrics_{uuid.uuid4().hex[:8]}", capacity=0, open_to_all=True)


def make_node(name: str, *, gpus: list[str], ready: bool = True, **fields) -> Node:
    """A node nothing can be placed on (1 MB of memory), ready or not."""
    now = timezone.now()
    values = dict(address=f"{name}.invalid", docker_host="unix:///nonexistent", cpus=1, memory_mb=1,
                  gpus=[{"index": i, "type": kind} for i, kind in enumerate(gpus)], gpus_simulated=True,
                  last_heartbeat=now - timedelta(seconds=2), agent_pid=os.getpid() if ready else None)
    values.update(fields)
    return Node.objects.create(name=name, **values)


@pytest.fixture
def nodes():
    made: list[Node] = []

    def make(name: str, **kwargs) -> Node:
        made.append(make_node(f"{name}-{uuid.uuid4().hex[:6]}", **kwargs))
        return made[-1]

    yield make
    Node.objects.filter(pk__in=[node.pk for node in made]).delete()


# --------------------------------------------------------------------- access


def test_it_refuses_anonymous_clients_and_users_who_are_not_admins(alice):
    anonymous = scrape()
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "UnauthorizedUserError"
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    assert scrape(logged_in(alice)).status_code == 403
    assert scrape(HTTP_AUTHORIZATION=bearer(alice)).status_code == 403
    assert scrape(HTTP_AUTHORIZATION="Bearer pai_not-a-token").status_code == 401


def test_it_answers_admins_by_session_or_token(admin_user):
    assert scrape(logged_in(admin_user)).status_code == 200
    assert scrape(HTTP_AUTHORIZATION=bearer(admin_user)).status_code == 200


def test_it_answers_a_scraper_with_metrics_token_and_only_that(alice, settings):
    assert scrape(HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}").status_code == 401  # none set: admins only
    settings.METRICS_TOKEN = METRICS_TOKEN
    assert scrape(HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}").status_code == 200
    assert scrape(HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN[:-1]}x").status_code == 401
    assert scrape(HTTP_AUTHORIZATION=f"Basic {METRICS_TOKEN}").status_code == 401
    assert scrape(HTTP_AUTHORIZATION="Bearer \u00e9t\u00e9").status_code == 401  # not ASCII: was a 500
    assert scrape(logged_in(alice)).status_code == 403
    assert Client().post("/metrics", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}").status_code == 405


# ------------------------------------------------------------------- contents


def test_it_counts_jobs_by_state_and_virtual_cluster(alice, admin_user, vc):
    waiting = [submit(alice, config(f"mw{i}_{uuid.uuid4().hex[:6]}", role(gpus=64), virtualCluster=vc.name))
               for i in range(3)]
    services.job_stop(job=waiting[0], by=alice)
    last_job, last_line = Job.objects.aggregate(n=Max("id"))["n"], LogLine.objects.aggregate(n=Max("id"))["n"] or 0
    found = samples(scrape(logged_in(admin_user)))
    assert value(found, "portal_jobs", state="WAITING", virtual_cluster=vc.name) == 2
    assert value(found, "portal_jobs", state="STOPPED", virtual_cluster=vc.name) == 1
    assert value(found, "portal_jobs", state="RUNNING", virtual_cluster=vc.name) == 0
    assert value(found, "portal_jobs_waiting", virtual_cluster=vc.name) == 2
    assert ("portal_jobs_waiting", (("virtual_cluster", "default"),)) in found
    # Node agents of a test cluster may write log rows meanwhile: at least what was there.
    assert value(found, "portal_jobs_submitted_total") == last_job
    assert value(found, "portal_log_lines_written_total") >= last_line


def test_it_reports_each_nodes_state_heartbeat_and_gpus_by_type(admin_user, nodes, alice):
    busy = nodes("m-busy", gpus=["V100", "V100", "V100", "K80"])
    lost = nodes("m-lost", gpus=["V100"], status=Node.Status.LOST, last_heartbeat=timezone.now() - timedelta(hours=1))
    idle = nodes("m-idle", gpus=[], schedulable=False)
    # Two of the busy node's V100s held by a task (rows as a placement leaves them).
    job = submit(alice, config(f"mg_{uuid.uuid4().hex[:6]}", role(gpus=64)))
    attempt = TaskAttempt.objects.create(task=job.tasks.get(), job_attempt=job.attempts.get(), job=job, number=1,
                                         node=busy, node_name=busy.name, state="RUNNING", gpus=[0, 2], gpu_type="V100")
    GpuAllocation.objects.bulk_create([GpuAllocation(node=busy, index=i, attempt=attempt) for i in (0, 2)])
    try:
        found = samples(scrape(logged_in(admin_user)))
    finally:
        attempt.delete()
    assert value(found, "portal_node_gpus_used", node=busy.name, gpu_type="V100") == 2
    assert value(found, "portal_node_gpus_free", node=busy.name, gpu_type="V100") == 1
    assert value(found, "portal_node_gpus_free", node=busy.name, gpu_type="K80") == 1
    assert value(found, "portal_node_gpus_used", node=busy.name, gpu_type="K80") == 0
    assert value(found, "portal_node_gpus_free", node=lost.name, gpu_type="V100") == 1
    assert (value(found, "portal_node_up", node=busy.name), value(found, "portal_node_ready", node=busy.name)) == (1, 1)
    assert (value(found, "portal_node_up", node=lost.name), value(found, "portal_node_ready", node=lost.name)) == (0, 0)
    assert (value(found, "portal_node_up", node=idle.name), value(found, "portal_node_ready", node=idle.name)) == (1, 0)
    assert 2 <= value(found, "portal_node_heartbeat_age_seconds", node=busy.name) < 60
    assert value(found, "portal_node_heartbeat_age_seconds", node=lost.name) >= 3600
    assert not any(name == "portal_node_gpus_free" and dict(labels)["node"] == idle.name for name, labels in found)
    assert value(found, "portal_task_attempts", state="RUNNING") >= 1


def test_it_shows_scheduling_pass_durations_and_queue_depths(own_instance, admin_user):
    client = logged_in(admin_user)
    before = samples(scrape(client))
    assert value(before, "portal_schedule_pass_duration_seconds_count") == 0
    assert value(before, "portal_redis_up") == 1
    services.schedule_pass()  # a real pass, timed by schedule_pass itself
    queues.record_pass_duration(0.03)
    queues.record_pass_duration(42.0)
    queues.enqueue_delivery(123456789)  # a notification waiting for a worker

    found = samples(scrape(client))
    assert value(found, "portal_schedule_pass_duration_seconds_count") == 3
    assert value(found, "portal_schedule_pass_duration_seconds_bucket", le="0.025") <= 1
    assert value(found, "portal_schedule_pass_duration_seconds_bucket", le="0.05") >= 1
    assert value(found, "portal_schedule_pass_duration_seconds_bucket", le="30.0") == 2
    assert value(found, "portal_schedule_pass_duration_seconds_bucket", le="+Inf") == 3
    assert 42.03 < value(found, "portal_schedule_pass_duration_seconds_sum") < 60
    assert value(found, "portal_rq_queue_depth", queue=f"{own_instance}.notify") == 1
    assert value(found, "portal_rq_queue_depth", queue=f"{own_instance}.scheduler") == 0


def test_a_scrape_takes_the_same_few_queries_however_big_the_cluster(admin_user, nodes):
    client = logged_in(admin_user)
    scrape(client)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert scrape(client).status_code == 200
        return len(captured)

    first = queries()
    for i in range(20):
        nodes(f"m-q{i}", gpus=["V100"] * 4)
    assert queries() == first <= 10


def test_the_exposition_parses_with_every_family_typed(admin_user, nodes, redis_server):
    """The text is written by hand (jobs/metrics.py): prometheus_client's own
    parser reads every family back with its declared type, and label values
    with quotes, backslashes and newlines come back as they were."""
    odd = 'V100 "sxm"\\2\nb'
    node = nodes("m-odd", gpus=[odd, odd])
    text = scrape(logged_in(admin_user)).content.decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert {name: families[name].type for name in (
        "portal_jobs", "portal_jobs_waiting", "portal_jobs_submitted", "portal_log_lines_written",
        "portal_task_attempts", "portal_node_up", "portal_node_ready", "portal_node_heartbeat_age_seconds",
        "portal_node_gpus_free", "portal_node_gpus_used", "portal_redis_up", "portal_rq_queue_depth",
        "portal_schedule_pass_duration_seconds")} == {
        "portal_jobs": "gauge", "portal_jobs_waiting": "gauge", "portal_jobs_submitted": "counter",
        "portal_log_lines_written": "counter", "portal_task_attempts": "gauge", "portal_node_up": "gauge",
        "portal_node_ready": "gauge", "portal_node_heartbeat_age_seconds": "gauge", "portal_node_gpus_free": "gauge",
        "portal_node_gpus_used": "gauge", "portal_redis_up": "gauge", "portal_rq_queue_depth": "gauge",
        "portal_schedule_pass_duration_seconds": "histogram"}
    assert not [family.name for family in families.values() if family.type == "unknown"]
    free = {s.labels["gpu_type"]: s.value for s in families["portal_node_gpus_free"].samples
            if s.labels["node"] == node.name}
    assert free == {odd: 2}
    assert text.endswith("\n") and "\n\n" not in text


def test_each_running_task_shows_its_newest_recent_sample_with_gpu_figures(admin_user, alice, nodes):
    """The newest sample by time, whatever order the rows were written in;
    averaged rows and samples older than three periods never count; a task
    with no recent sample and a task no longer running show nothing."""
    node = nodes("m-use", gpus=["V100", "V100"])
    job = submit(alice, config(f"mu_{uuid.uuid4().hex[:6]}", role(tasks=3, gpus=64)))
    now = timezone.now()
    attempts = [TaskAttempt.objects.create(task=task, job_attempt=job.attempts.get(), job=job, number=1, node=node,
                                           node_name=node.name, state=state, gpus=[i % 2], gpu_type="V100")
                for i, (task, state) in enumerate(zip(job.tasks.order_by("index"), ["RUNNING", "RUNNING",
                                                                                       "SUCCEEDED"]))]
    fresh, stale, ended = attempts
    gpu = [{"index": 1, "utilPercent": 97.5, "memoryUsedBytes": 3 << 30}]
    TaskUsage.objects.bulk_create([
        TaskUsage(attempt=fresh, at=now - timedelta(seconds=1), cpu_percent=150.0, memory_bytes=5 << 30,
                  network_rx_bytes=11, network_tx_bytes=13, gpus=gpu),  # written first, yet the newest
        TaskUsage(attempt=fresh, at=now - timedelta(seconds=6), cpu_percent=10.0, memory_bytes=1, gpus=[]),
        TaskUsage(attempt=fresh, at=now, averaged=True, cpu_percent=99.0, memory_bytes=2, gpus=[]),
        TaskUsage(attempt=stale, at=now - timedelta(hours=1), cpu_percent=20.0, memory_bytes=3, gpus=[]),
        TaskUsage(attempt=ended, at=now, cpu_percent=30.0, memory_bytes=4, gpus=[]),
    ])
    try:
        response = scrape(logged_in(admin_user))
    finally:
        TaskAttempt.objects.filter(pk__in=[a.pk for a in attempts]).delete()
    found = samples(response)
    # Each family's samples under its declared type (a counter's _total samples too, not an untyped family).
    types = {family.name: family.type for family in text_string_to_metric_families(response.content.decode())
             if family.samples}
    assert {name: types[name] for name in (
        "portal_task_cpu_percent", "portal_task_memory_bytes", "portal_task_network_receive_bytes",
        "portal_task_network_transmit_bytes", "portal_task_gpus_idle", "portal_task_gpu_utilization_percent",
        "portal_task_gpu_memory_used_bytes")} == {
        "portal_task_cpu_percent": "gauge", "portal_task_memory_bytes": "gauge",
        "portal_task_network_receive_bytes": "counter", "portal_task_network_transmit_bytes": "counter",
        "portal_task_gpus_idle": "gauge", "portal_task_gpu_utilization_percent": "gauge",
        "portal_task_gpu_memory_used_bytes": "gauge"}
    labels = {"job": f"{alice.username}~{job.name}", "user": alice.username, "task": "main-0", "node": node.name}
    assert value(found, "portal_task_cpu_percent", **labels) == 150.0
    assert value(found, "portal_task_memory_bytes", **labels) == 5 << 30
    assert value(found, "portal_task_network_receive_bytes_total", **labels) == 11
    assert value(found, "portal_task_network_transmit_bytes_total", **labels) == 13
    assert value(found, "portal_task_gpus_idle", **labels) == 0
    assert value(found, "portal_task_gpu_utilization_percent", gpu="1", **labels) == 97.5
    assert value(found, "portal_task_gpu_memory_used_bytes", gpu="1", **labels) == 3 << 30
    mine = [dict(labels) for name, labels in found if name.startswith("portal_task_") and dict(labels).get("job")
            == f"{alice.username}~{job.name}"]
    assert {item["task"] for item in mine} == {"main-0"}


def test_the_submission_and_log_line_counters_never_go_down(alice, admin_user):
    """They are the last ids handed out, not the highest there now: deleting
    the newest job (any user may, once it ended) made both go down, which
    Prometheus takes for a reset (rate() and increase() jump)."""
    job = submit(alice, config(f"counted_{uuid.uuid4().hex[:6]}", role(gpus=64)))
    attempt = TaskAttempt.objects.create(task=Task.objects.create(job=job, role="x", index=0),
                                         job_attempt=JobAttempt.objects.get(job=job, number=1), job=job, number=1)
    LogLine.objects.create(attempt=attempt, stream=Stream.STDOUT, seq=1, text="the newest line")
    services.job_stop(job=job, by=alice)
    before = samples(scrape(logged_in(admin_user)))
    assert value(before, "portal_jobs_submitted_total") >= job.pk
    services.job_delete(job=Job.objects.get(pk=job.pk))
    after = samples(scrape(logged_in(admin_user)))
    for counter in ("portal_jobs_submitted_total", "portal_log_lines_written_total"):
        assert value(after, counter) == value(before, counter), counter
