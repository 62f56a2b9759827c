"""A job of many tasks and retries on the pages and API answers its owner
keeps open (the job page and its live part, the status calls, the usage
graphs): the queries one answer makes do not grow with the job's tasks or
attempts. A job may have 1,000 tasks, and the page polls every few seconds.

Jobs are database rows only (no scheduler, no container), on a node of the
test's own that nothing is placed on. Users: alice (owner); each test makes
its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import (
    ExitType, Job, JobAttempt, LogLine, Node, State, Stream, Task, TaskAttempt, TaskState, TaskUsage, TerminalSession,
    VirtualCluster,
)
from jobs.services import tokens
from jobs.spec import parse_job_value
from tests.helpers import config, role


@pytest.fixture
def node() -> Iterator[Node]:
    """A node nothing is placed on. Its heartbeat an hour ahead: the test
    cluster's agents, which look for lost nodes, would otherwise give its
    tasks up mid-test."""
    made = Node.objects.create(name=f"big-{uuid.uuid4().hex[:8]}", address="127.0.0.3", docker_host="unix:///nonexistent",
                               cpus=64, memory_mb=512000, gpus=[{"index": i, "type": "BIG"} for i in range(8)],
                               gpus_simulated=True, schedulable=False, last_heartbeat=timezone.now() + timedelta(hours=1))
    yield made
    TaskAttempt.objects.filter(node=made).update(state=TaskState.STOPPED)
    Job.objects.filter(task_attempts__node=made).update(state=State.STOPPED)


def big_job(owner, node: Node, *, tasks: int, attempts: int = 2, samples: int = 3, jupyter: bool = False) -> Job:
    """A running job of `tasks` one-GPU tasks on its attempt `attempts`,
    every attempt placed on `node` with ssh and http ports (and jupyter's);
    the current attempt's tasks have `samples` usage samples each."""
    name = f"big_{uuid.uuid4().hex[:8]}"
    cfg = config(name, role(tasks=tasks, gpus=1, command="sleep 600"), retryCount=attempts - 1)
    stored = parse_job_value(cfg, user_name=owner.username, default_fs_uri=settings.PAI_DEFAULT_FS_URI).normalized
    now = timezone.now()
    job = Job.objects.create(owner=owner, name=name, config_raw=json.dumps(cfg), config=stored,
                             virtual_cluster=VirtualCluster.objects.get(name="default"), state=State.RUNNING,
                             total_tasks=tasks, total_roles=1, total_gpus=tasks, retry_limit=attempts - 1,
                             attempt_number=attempts, started_at=now - timedelta(hours=1))
    JobAttempt.objects.bulk_create([
        JobAttempt(job=job, number=n, state=State.RUNNING if n == attempts else State.FAILED,
                   exit_type="" if n == attempts else ExitType.USER_EXIT, started_at=now - timedelta(hours=1))
        for n in range(1, attempts + 1)])
    Task.objects.bulk_create([Task(job=job, role="main", index=i) for i in range(tasks)])
    rows = []
    for job_attempt in job.attempts.order_by("number"):
        current = job_attempt.number == attempts
        for task in job.tasks.order_by("index"):
            rows.append(TaskAttempt(
                task=task, job_attempt=job_attempt, job=job, number=job_attempt.number, node=node, node_name=node.name,
                host_ip=node.address, ip=f"10.9.{task.index // 250}.{task.index % 250}",
                state=TaskState.RUNNING if current else TaskState.FAILED, exit_code=None if current else 1,
                exit_type="" if current else ExitType.USER_EXIT, container_id=f"c{job_attempt.number}-{task.index}",
                gpus=[task.index % 8], gpu_type="BIG", ports={"ssh": [40000 + task.index], "http": [41000 + task.index],
                                                              **({"jupyter": [42000 + task.index]} if jupyter else {})},
                started_at=now - timedelta(minutes=30), finished_at=None if current else now - timedelta(minutes=40),
                ssh_available=True))
    TaskAttempt.objects.bulk_create(rows)
    current = TaskAttempt.objects.filter(job=job, number=attempts).values_list("pk", flat=True)
    TaskUsage.objects.bulk_create([
        TaskUsage(attempt_id=pk, at=now - timedelta(seconds=5 * k), cpu_percent=50.0, memory_bytes=2**30)
        for pk in current for k in range(samples)])
    return job


def api_client(user) -> Client:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}")
    client.get("/api/v1/jobs?limit=1")  # the token's first use is written once: not counted below
    return client


def queries_of(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
        if response.streaming:
            b"".join(response.streaming_content)
    assert response.status_code == 200, (path, response.status_code)
    return len(queries)


# ----------------------------------------------------------- usage graphs


def test_it_reads_a_jobs_usage_in_queries_that_do_not_grow_with_its_tasks(alice, node):
    client = api_client(alice)
    small, big = big_job(alice, node, tasks=10), big_job(alice, node, tasks=200)
    since = (timezone.now() - timedelta(seconds=7)).isoformat().replace("+00:00", "Z")
    for query in ("", f"?since={since}"):
        counts = [queries_of(client, f"/api/v2/jobs/{alice.username}~{job.name}/metrics{query}") for job in (small, big)]
        assert counts[0] == counts[1], counts
    body = client.get(f"/api/v2/jobs/{alice.username}~{big.name}/metrics").json()
    assert len(body["tasks"]) == 200 and {len(task["samples"]) for task in body["tasks"]} == {3}


# ------------------------------------------------------------ the job page


def test_the_job_page_reads_its_tasks_in_queries_that_do_not_grow_with_them(alice, node):
    client = Client()
    client.force_login(alice)
    small, big = big_job(alice, node, tasks=10), big_job(alice, node, tasks=200)
    for path in ("/jobs/{}/", "/jobs/{}/live/", "/jobs/{}/live/?attempt=1"):
        counts = [queries_of(client, path.format(job.pk)) for job in (small, big)]
        assert counts[0] == counts[1], (path, counts)


def test_jupyter_tasks_tokens_and_terminals_are_read_once_for_all_tasks(alice, node):
    """Each running Jupyter task's link carries the token its server logged,
    and its idleness counts a terminal open in it: read for all the tasks
    of the live part at once, not per task."""
    client = Client()
    client.force_login(alice)
    jobs = [big_job(alice, node, tasks=tasks, jupyter=True) for tasks in (10, 200)]
    for job in jobs:
        current = list(TaskAttempt.objects.filter(job=job, number=job.attempt_number).order_by("pk"))
        LogLine.objects.bulk_create([
            LogLine(attempt=attempt, stream=Stream.STDERR, seq=seq, text=text) for attempt in current
            for seq, text in enumerate([f"http://127.0.0.1:8888/?token={'ab' * 8}{attempt.pk:08x} old",
                                        f"http://127.0.0.1:8888/lab?token={'cd' * 8}{attempt.pk:08x}", "ready"])])
        TerminalSession.objects.create(user=alice, attempt=current[0])
    counts = [queries_of(client, f"/jobs/{job.pk}/live/") for job in jobs]
    assert counts[0] == counts[1], counts
    html = client.get(f"/jobs/{jobs[1].pk}/live/").content.decode()
    current = TaskAttempt.objects.filter(job=jobs[1], number=jobs[1].attempt_number)
    assert html.count('class="button jupyter-link"') == 200
    for attempt in current:
        assert f"%3Ftoken%3D{'cd' * 8}{attempt.pk:08x}\"" in html


# ------------------------------------------------------------ job status


def test_the_status_calls_read_and_link_tasks_at_a_cost_that_does_not_grow_with_them(alice, node, monkeypatch):
    """Queries, and the URLs built from the routes (each task container's
    log link: a reverse() per container was a third of a v2 status)."""
    from jobs.api import http

    reversed_urls: list[str] = []

    def counted(*args, **kwargs) -> str:
        reversed_urls.append(args[0])
        return reverse(*args, **kwargs)

    reverse = http.reverse
    monkeypatch.setattr(http, "reverse", counted)
    client = api_client(alice)
    jobs = [big_job(alice, node, tasks=tasks, attempts=3) for tasks in (10, 200)]
    for path in ("/api/v1/user/{}/jobs/{}", "/api/v2/jobs/{}~{}", "/api/v2/jobs/{}~{}/job-attempts"):
        counts = []
        for job in jobs:
            reversed_urls.clear()
            counts.append((queries_of(client, path.format(alice.username, job.name)), len(reversed_urls)))
        assert counts[0] == counts[1], (path, counts)
    status = client.get(f"/api/v2/jobs/{alice.username}~{jobs[1].name}").json()
    first = status["jobAttempts"][0]["taskRoles"]["main"]["taskStatuses"][7]
    assert first["containerLog"] == f"http://testserver/api/v2/jobs/{alice.username}~{jobs[1].name}/tasks/main/7/log?attempt=1"
    assert status["taskRoles"]["main"]["taskStatuses"][199]["containerLog"] == (
        f"http://testserver/api/v2/jobs/{alice.username}~{jobs[1].name}/tasks/main/199/log")
