"""Review findings on the scheduler."""

from __future__ import annotations

from jobs.scheduler import Quota, never_fits, schedule
from tests.test_scheduler import job, r
from tests.test_scheduler import node as pure_node


def test_a_gang_no_idle_cluster_can_hold_is_called_hopeless_and_blocks_nobody():
    # Two tasks of 8 GPUs each: each fits the one 8-GPU node, never both at once.
    nodes = [pure_node(1, "big", gpus={i: "V100" for i in range(8)}),
             pure_node(2, "s1", gpus={i: "V100" for i in range(4)}), pure_node(3, "s2", gpus={i: "V100" for i in range(4)})]
    quotas = {"default": Quota(cpus=1e6, memory_mb=1e9, gpus={"V100": 16})}
    hopeless = job(1, r(tasks=2, gpus=8), gpu_type="V100", overtaken=3)
    assert never_fits(hopeless, nodes, quotas["default"]) is not None
    decision = schedule([hopeless, job(2, r(gpus=1))], nodes, quotas, max_overtakes=3)
    assert 1 in decision.never_fits and 2 in decision.placed


# ------------------------------------------------ a drain while a pass runs

import threading  # noqa: E402

import pytest  # noqa: E402
from django.db import connection  # noqa: E402

from jobs.models import ACTIVE_TASK_STATES, ExitType, TaskAttempt  # noqa: E402
from jobs.services import nodes as node_services  # noqa: E402
from jobs.services import scheduling  # noqa: E402
from tests.test_lifecycle import gpu_job, node  # noqa: E402,F401  (node: a fixture)


@pytest.mark.services
def test_a_drain_during_a_pass_leaves_no_task_of_that_pass_running_on_the_node(alice, admin_user, node, monkeypatch):
    job = gpu_job(alice, node)
    read = scheduling._read
    drains: list[threading.Thread] = []

    def read_then_drain() -> scheduling._Inputs:
        inputs = read()
        if not drains:  # the drain's own connection, as an admin's request would have
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


# ------------------------------------------- deleting a node whose tasks run

from django.test import Client  # noqa: E402

from jobs.models import GpuAllocation, Node  # noqa: E402
from tests.test_lifecycle import exit_, start  # noqa: E402


@pytest.mark.services
@pytest.mark.parametrize("how", ["delete page", "bulk action"])
def test_the_django_admin_keeps_a_node_whose_tasks_still_run(alice, admin_user, node, how):
    """The cascade would drop the GPU and port allocations of its running
    tasks; its agent registers the node again at its next heartbeat, and
    the next pass would hand the same GPUs and ports out a second time."""
    task = start(gpu_job(alice, node))["main-0"]
    client = Client()
    client.force_login(admin_user)
    if how == "delete page":
        response = client.post(f"/admin/jobs/node/{node.pk}/delete/", {"post": "yes"})
    else:
        response = client.post("/admin/jobs/node/", {"action": "delete_selected", "_selected_action": [node.pk],
                                                      "post": "yes"})
    assert response.status_code == 200, response.status_code
    assert Node.objects.filter(pk=node.pk).exists()
    assert GpuAllocation.objects.filter(node=node).count() == 1
    assert exit_(task, 0)  # nothing runs there now: the delete goes through
    assert client.post(f"/admin/jobs/node/{node.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Node.objects.filter(pk=node.pk).exists()
