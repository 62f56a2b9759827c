"""Scheduling passes and what admins do to nodes meanwhile: a drain while a
pass is deciding, and deleting a node whose tasks still run. Through the
real services and the test database, on a node of the test's own that no
agent serves (tests/test_lifecycle.py's `node`; the test plays its agent)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

from jobs.models import ACTIVE_TASK_STATES, ExitType, GpuAllocation, Node, TaskAttempt
from jobs.services import nodes as node_services
from jobs.services import scheduling
from tests.helpers import admin_delete
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
