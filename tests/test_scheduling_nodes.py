"""Scheduling passes and what admins do to nodes meanwhile: a drain while a
pass is deciding, and deleting a node whose tasks still run. Through the
real services and the test database, on a node of the test's own that no
agent serves (tests/test_lifecycle.py's `node`; the test plays its agent)."""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connection
from django.test import Client

from jobs.models import ACTIVE_TASK_STATES, ExitType, GpuAllocation, Node, TaskAttempt
from jobs.services import nodes as node_services
from jobs.services import scheduling
from tests.helpers import admin_delete, role
from tests.test_lifecycle import exit_, gpu_job, node, start  # noqa: F401  (node: a fixture)

pytestmark = pytest.mark.services


def test_a_drain_during_a_pass_leaves_no_task_of_that_pass_running_on_the_node(alice, admin_user, node, monkeypatch):
    """On PostgreSQL a pass reads the nodes under its own lock, which a drain
    did not wait for: tasks it placed after the drain's stops had looked ran
    on the drained node. (On SQLite the pass reads again under the write lock.)"""
    job = gpu_job(alice, node)
    read = scheduling._read
    drains: list[threading.Thread] = []

    def read_then_drain() -> scheduling._Inputs:
        inputs = read()
        if not drains:  # the drain on a connection of its own, as an admin's request would be
            def drain() -> None:
                try:
                    node_services.node_drain(node=node, by=admin_user, mode="stop")
                finally:
                    connection.close()
            drains.append(threading.Thread(target=drain))
            drains[0].start()
            drains[0].join(timeout=2)  # done, unless it waits for this pass
        return inputs

    monkeypatch.setattr(scheduling, "_read", read_then_drain)
    scheduling.schedule_pass()
    drains[0].join()
    left = TaskAttempt.objects.filter(job=job, node=node, state__in=ACTIVE_TASK_STATES)
    assert all(a.stop_reason == ExitType.NODE_DRAINED for a in left), [(a.pk, a.stop_reason) for a in left]


@pytest.mark.parametrize("how", ["delete page", "bulk action"])
def test_the_django_admin_keeps_a_node_whose_tasks_still_run(alice, admin_user, node, how):
    """The cascade would drop the GPU and port allocations of its running
    tasks; its agent registers the node again at its next heartbeat, and
    the next pass would hand the same GPUs and ports out a second time."""
    task = start(gpu_job(alice, node))["main-0"]
    client = Client()
    client.force_login(admin_user)
    response = admin_delete(client, "jobs/node", node.pk, how)
    assert response.status_code == 200, response.status_code
    assert Node.objects.filter(pk=node.pk).exists()
    assert GpuAllocation.objects.filter(node=node).count() == 1
    assert exit_(task, 0)  # nothing runs there now: the delete goes through
    assert client.post(f"/admin/jobs/node/{node.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Node.objects.filter(pk=node.pk).exists()


def test_a_share_typed_to_a_hundredth_of_a_percent_holds_whole_gpus():
    """Three virtual clusters of 33.33% on three GPUs: each held 0.9999 of
    a GPU, so a one-GPU job could never fit ("needs 1 GPUs but ... holds 1.0")."""
    from jobs import scheduler
    from jobs.services.scheduling import _quotas

    node = scheduler.NodeState(id=1, name="n", address="10.9.0.1", cpus=3, memory_mb=3000,
                               gpus={0: "K80", 1: "K80", 2: "K80"}, port_start=30000, port_end=30100)
    quotas = _quotas([node], {}, [("default", 0.0), ("a", 33.33), ("b", 33.33), ("c", 33.34)], [])
    assert [quotas[name].gpus["K80"] for name in ("a", "b", "c")] == [1.0, 1.0, 1.0]
    assert [quotas[name].cpus for name in ("a", "b", "c")] == [1.0, 1.0, 1.0]
    assert quotas["a"].memory_mb == pytest.approx(999.9)  # MB are no whole units to round to
    request = scheduler.JobRequest(id=7, vc="a", gpu_type="K80", roles=(
        scheduler.RoleRequest(name="main", task_number=1, cpus=1, memory_mb=500, gpus=1),))
    assert scheduler.never_fits(request, [node], quotas["a"]) is None
    # A share that is not close to a whole unit stays as it is.
    assert _quotas([node], {}, [("default", 0.0), ("a", 50.0)], [])["a"].gpus["K80"] == 1.5


def away_node(node: Node) -> Node:
    """A schedulable node with 12 GPUs of `node`'s type whose agent missed
    its heartbeats five minutes ago: not ready, but registered."""
    from datetime import timedelta

    from django.utils import timezone

    return Node.objects.create(
        name=f"{node.name}-away", address=f"away-{node.address}", docker_host="unix:///nonexistent", cpus=16,
        memory_mb=16000, gpus=[{"index": i, "type": node.gpus[0]["type"]} for i in range(12)], gpus_simulated=True,
        port_start=40000, port_end=40099, last_heartbeat=timezone.now() - timedelta(minutes=5), agent_pid=1)


def test_a_job_that_fits_only_a_node_briefly_down_waits_for_it_and_starts_when_it_is_back(alice, node):  # noqa: F811
    """Judged against the ready nodes alone, a job too big for them but not
    for a node that had missed a few heartbeats "can never fit", and its
    page told its owner to stop it. It waits for that node instead."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import Job, State
    from jobs.services import cluster
    from tests.helpers import config, submit

    gpu_type = node.gpus[0]["type"]  # the ready node has 8 of them, the away one 12
    away = away_node(node)
    try:
        job = submit(alice, config("needs-12", role(gpus=12), gpuType=gpu_type))
        scheduling.schedule_pass()
        job = Job.objects.get(pk=job.pk)
        assert job.state == State.WAITING
        assert job.waiting_reason.startswith("waiting for "), job.waiting_reason
        assert "not ready now to come back; without them it cannot fit: " in job.waiting_reason
        assert cluster.never_fits_reason(job) is None
        client = Client()
        client.force_login(alice)
        page = client.get(f"/jobs/{job.pk}/").content.decode()
        assert "can never start" not in page and "not ready now to come back" in page

        Node.objects.filter(pk=away.pk).update(status=Node.Status.READY,
                                               last_heartbeat=timezone.now() + timedelta(hours=1))
        scheduling.schedule_pass()
        job = Job.objects.get(pk=job.pk)
        assert job.state == State.RUNNING, job.waiting_reason
        assert set(TaskAttempt.objects.filter(job=job).values_list("node_id", flat=True)) == {away.pk}
    finally:
        Node.objects.filter(pk=away.pk).update(schedulable=False)
        for attempt in TaskAttempt.objects.filter(node=away, state__in=ACTIVE_TASK_STATES):
            assert exit_(attempt, 0)


def test_a_job_too_big_for_every_node_ready_or_not_can_never_fit(alice, node):  # noqa: F811
    from jobs.models import Job
    from jobs.services import cluster
    from tests.helpers import config, submit

    gpu_type = node.gpus[0]["type"]
    away = away_node(node)
    try:
        job = submit(alice, config("needs-13", role(gpus=13), gpuType=gpu_type))
        scheduling.schedule_pass()
        job = Job.objects.get(pk=job.pk)
        assert job.waiting_reason.startswith("can never fit: no node has"), job.waiting_reason
        assert cluster.never_fits_reason(job).startswith("can never fit")
    finally:
        Node.objects.filter(pk=away.pk).update(schedulable=False)


def test_a_node_registered_again_at_a_new_address_takes_its_tasks_ports_along(alice, node):  # noqa: F811
    """Ports are booked by address. A task's stayed booked under its node's
    old address after the agent registered the node at a new one: the next
    pass gave the same port on the same machine to a second task, the old
    address kept it booked for whoever came there next, and the job page
    showed the old address."""
    from jobs.models import Job, PortAllocation, State
    from jobs.services import NodeInfo, node_register

    fixed = role(gpus=1, portList=[{"label": "web", "beginAt": node.port_start + 5, "portNumber": 1}])
    first = start(gpu_job(alice, node, fixed))["main-0"]
    old, new = node.address, f"new-{node.address}"
    node_register(NodeInfo(name=node.name, address=new, docker_host=node.docker_host, engine_id="",
                           cpus=node.cpus, memory_mb=node.memory_mb, gpus=node.gpus, gpus_simulated=True,
                           port_start=node.port_start, port_end=node.port_end, agent_pid=os.getpid()))
    held = PortAllocation.objects.filter(attempt=first)
    assert held.exists() and set(held.values_list("address", flat=True)) == {new}
    assert not PortAllocation.objects.filter(address=old).exists()
    first.refresh_from_db()
    assert first.host_ip == new
    client = Client()
    client.force_login(alice)
    page = client.get(f"/jobs/{first.job_id}/").content.decode()
    assert new in page

    second = gpu_job(alice, node, fixed)  # the same fixed port, on the only node of its GPU type
    scheduling.schedule_pass()
    second = Job.objects.get(pk=second.pk)
    assert second.state == State.WAITING, "the port was booked twice"
    assert exit_(first, 0)
    scheduling.schedule_pass()
    assert Job.objects.get(pk=second.pk).state == State.RUNNING
