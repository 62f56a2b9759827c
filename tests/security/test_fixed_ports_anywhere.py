"""Finding 4: a portList entry with beginAt > 0 could bind any port of the
node, such as 8001 beside the portal or Redis's port. Fixed ports must now
lie inside a node's task port range or the admin's FIXED_PORTS_ALLOWED:
otherwise a 400 naming the field, and no node takes the task."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs import scheduler, services
from jobs.models import Job, Node
from jobs.services import tokens
from jobs.spec import PortSpec, SpecError

RANGE = (45000, 45099)


@pytest.fixture
def node():
    made = Node.objects.create(name=f"fixed-{uuid.uuid4().hex[:8]}", address="192.0.2.10", port_start=RANGE[0],
                               port_end=RANGE[1], last_heartbeat=timezone.now())
    yield made
    made.delete()


def _config(name: str, begin_at: int, count: int = 1) -> str:
    return json.dumps({"jobName": name, "image": "busybox", "taskRoles": [{
        "name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 0, "command": "true",
        "portList": [{"label": "http", "beginAt": 0, "portNumber": 1},
                     {"label": "fixed", "beginAt": begin_at, "portNumber": count}]}]})


@pytest.mark.parametrize("begin_at, count", [(8001, 1), (6379, 1), (RANGE[1], 2), (RANGE[0] - 1, 2)])
def test_it_refuses_fixed_ports_outside_every_node_range(alice, node, begin_at, count):
    with pytest.raises(SpecError) as caught:
        services.job_submit(owner=alice, config=_config("outside", begin_at, count))
    problem = caught.value.problems[0]
    assert problem.path == "taskRoles[0].portList[1].beginAt"
    assert f"{RANGE[0]}-{RANGE[1]}" in problem.message
    assert not Job.objects.filter(owner=alice).exists()


def test_it_accepts_fixed_ports_inside_a_node_range_or_allowed_by_the_admin(alice, node, settings):
    services.job_submit(owner=alice, config=_config("inside", RANGE[0] + 5, 3))
    settings.FIXED_PORTS_ALLOWED = frozenset({8001})
    services.job_submit(owner=alice, config=_config("allowed", 8001))
    assert Job.objects.filter(owner=alice).count() == 2


def test_it_answers_the_rest_api_with_a_400_and_refuses_strangers(alice, node):
    key = tokens.token_create(user=alice, lifetime=timedelta(hours=1)).key
    path = f"/api/v1/user/{alice.username}/jobs"
    answer = Client().post(path, data=_config("api", 8001), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 400 and "portList[1].beginAt" in answer.content.decode()
    assert Client().post(path, data=_config("anon", RANGE[0]), content_type="application/json").status_code == 401


def test_the_scheduler_places_fixed_ports_only_where_they_may_be():
    def state(**extra) -> scheduler.NodeState:
        return scheduler.NodeState(id=1, name="n", address="192.0.2.10", cpus=8, memory_mb=8192, gpus={},
                                   port_start=RANGE[0], port_end=RANGE[1], **extra)

    role = scheduler.RoleRequest(name="main", task_number=1, cpus=1, memory_mb=256, gpus=0,
                                 ports=(PortSpec("fixed", 8001, 1),))
    job = scheduler.JobRequest(id=1, vc="default", gpu_type=None, roles=(role,))
    quota = scheduler.Quota(cpus=8, memory_mb=8192, gpus={})
    assert scheduler.place_job(job, [state()], quota) is None
    assert "can never fit" in (scheduler.never_fits(job, [state()], quota) or "")
    placed = scheduler.place_job(job, [state(fixed_ports_allowed=frozenset({8001}))], quota)
    assert placed and placed[0].ports == {"fixed": [8001]}
