"""A job's config is parsed once, at submission; from then on every reader
(the scheduling pass, each task's launch, running and exit, the job page,
the REST status) gets the typed spec from the stored config through the
Job.spec memo, without parsing text again.

The job is driven in this process through the services a node agent would
call, on a node row of the test's own that no agent serves. Its gpuType
exists only on that node, so no node of a test cluster running in the same
session can take it.
"""

from __future__ import annotations

import html
from urllib.parse import unquote

import functools
import os
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs import jsonc, services, spec
from jobs.models import Job, Node, State, TaskAttempt, TaskState, _spec_memo
from jobs.services import scheduling
from jobs.spec import JobSpec
from tests.helpers import config, role, submit

pytestmark = pytest.mark.services

PARSERS = (spec.parse_job_config, spec.parse_job_value, jsonc.loads)


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """Where each call of the config parsers (or the JSONC decoder under
    them) came from. Patched wherever a `jobs` module holds one, so that
    `from jobs.spec import parse_job_config` copies count too."""
    import jobs.urls  # noqa: F401  (every view module, and what they import, is loaded: nothing escapes the patch)
    import portal.urls  # noqa: F401

    calls: list[str] = []

    def counting(parser: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(parser)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(f"{parser.__module__}.{parser.__qualname__} called from:\n"
                         + "".join(traceback.format_stack(limit=12)[:-1]))
            return parser(*args, **kwargs)
        return wrapper

    wrapped = {parser: counting(parser) for parser in PARSERS}
    for name, module in list(sys.modules.items()):
        if name != "jobs" and not name.startswith("jobs."):
            continue
        for attr, value in list(vars(module).items()):
            for parser, wrapper in wrapped.items():
                if value is parser:
                    monkeypatch.setattr(module, attr, wrapper)
    return calls


@pytest.fixture
def specs_built(monkeypatch) -> Callable[[str], int]:
    """How many times a spec was built from a stored config, by job name."""
    built: dict[str, int] = {}
    original = JobSpec.from_config

    def counting(cls: type[JobSpec], stored: dict[str, Any]) -> JobSpec:
        built[stored["jobName"]] = built.get(stored["jobName"], 0) + 1
        return original(stored)

    monkeypatch.setattr(JobSpec, "from_config", classmethod(counting))
    return lambda name: built.get(name, 0)


def forget_specs() -> None:
    """As if this process had never seen a job: the next reader builds the
    spec from the stored config (the path other processes take)."""
    _spec_memo._specs.clear()
    scheduling._roles_cache.clear()


@pytest.fixture
def own_node() -> Iterator[Callable[[str], Node]]:
    """A ready node that no agent serves, with four GPUs of `gpu_type`; it
    takes no more work after the test."""
    made: list[Node] = []

    def make(gpu_type: str) -> Node:
        node = Node.objects.create(
            name=f"t-once-{gpu_type.lower()}", address="127.0.0.7", docker_host="unix:///nonexistent", cpus=3,
            memory_mb=3000, gpus=[{"index": i, "type": gpu_type} for i in range(4)], gpus_simulated=True,
            port_start=33200, port_end=33215, last_heartbeat=timezone.now(), agent_pid=os.getpid(),
        )
        made.append(node)
        return node

    yield make
    Node.objects.filter(pk__in=[n.pk for n in made]).update(schedulable=False)


def two_role_config(name: str, gpu_type: str) -> dict[str, Any]:
    return config(
        name,
        role("ps", "jupyter lab --NotebookApp.token=secret-token", gpus=1, memory=512,
             portList=[{"label": "jupyter", "beginAt": 0, "portNumber": 1}]),
        role("worker", "python train.py", tasks=2, gpus=1, memory=512, minFailedTaskCount=None),
        gpuType=gpu_type, jobEnvs={"isDebug": False},
    )


def place(job: Job, node: Node) -> list[TaskAttempt]:
    services.schedule_pass()
    job.refresh_from_db()
    assert job.state == State.RUNNING, job.waiting_reason
    attempts = list(TaskAttempt.objects.filter(job=job).order_by("pk"))
    assert [a.node_id for a in attempts] == [node.pk] * 3
    return attempts


def render_job(client: Client, job: Job) -> None:
    """The job page, its live part and the REST status."""
    assert client.get(reverse("jobs:detail", args=[job.pk])).status_code == 200
    assert client.get(reverse("jobs:detail_live", args=[job.pk])).status_code == 200
    status = client.get(f"/api/v1/user/{job.owner.username}/jobs/{job.name}")
    assert status.status_code == 200
    assert list(status.json()["taskRoles"]) == ["ps", "worker"]


def test_it_parses_a_config_once_at_submission_and_never_per_task_event(alice, redis_server, own_node, parses,
                                                                         specs_built):
    name = f"once_{uuid.uuid4().hex[:8]}"
    gpu_type = f"ONCE{uuid.uuid4().hex[:6].upper()}"
    job = submit(alice, two_role_config(name, gpu_type))
    assert len(parses) >= 1  # the submission itself: the counters see the parser
    parses.clear()
    forget_specs()
    client = Client()
    client.force_login(alice)

    # One transaction from the node's creation to the placement: a scheduling
    # pass in another process (a test cluster's agent) cannot see the node
    # before this process has placed the job on it.
    with transaction.atomic():
        attempts = place(job, own_node(gpu_type))
    for attempt in attempts:
        assert services.attempt_claim_launch(attempt.pk)
        assert services.attempt_mark_running(attempt.pk, container_id=f"fake-{attempt.pk}")
    render_job(client, job)  # running: the page's Jupyter link reads the ps role's command
    page = client.get(reverse("jobs:detail_live", args=[job.pk])).content.decode()
    # The link goes through the web-port proxy, with Jupyter's path and token encoded in it.
    assert "token=secret-token" in unquote(html.unescape(page))
    for attempt in attempts:
        assert services.attempt_record_exit(attempt.pk, services.ContainerExit(exit_code=0))
    job.refresh_from_db()
    assert job.state == State.SUCCEEDED, job.exit_reason
    assert TaskAttempt.objects.filter(job=job, state=TaskState.SUCCEEDED).count() == 3
    assert parses == [], parses[0]
    assert specs_built(name) == 1  # built from the stored config once, then the memo's

    forget_specs()
    render_job(client, job)
    assert parses == [], parses[0]
    assert specs_built(name) == 2
