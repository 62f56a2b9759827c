"""Concurrent submissions never double-allocate.

Fifty jobs are submitted at once from many threads while scheduling passes
run at the same time in those threads and in the node agents (through the
real Redis queue). They all want a node of limited capacity: a node row of
this test's own, kept alive by the test's heartbeat and served by no agent,
so what lands on it stays allocated while the test checks every allocation.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.utils import timezone

from jobs import services
from jobs.models import ACTIVE_TASK_STATES, GpuAllocation, Job, Node, PortAllocation, State, TaskAttempt
from tests.cluster import wait_for
from tests.helpers import submit_in_one_batch

pytestmark = pytest.mark.services


@pytest.fixture
def limited_node(cluster):
    gpu_type = f"FAKE{uuid.uuid4().hex[:6]}"
    node = Node.objects.create(
        name=f"t-fake-{gpu_type.lower()}", address="127.0.0.9", docker_host="unix:///nonexistent", cpus=6,
        memory_mb=6000, gpus=[{"index": i, "type": gpu_type} for i in range(4)], gpus_simulated=True,
        port_start=33000, port_end=33011, last_heartbeat=timezone.now(),
        agent_pid=os.getpid(),  # this process beats for the node, as its agent would
    )
    beating = threading.Event()

    def beat() -> None:
        while not beating.wait(0.5):
            Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
        connection.close()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield node, gpu_type
    beating.set()
    thread.join()
    Node.objects.filter(pk=node.pk).update(schedulable=False)


def _config(name: str, gpu_type: str, gpus: int, cpus: int) -> str:
    return json.dumps({
        "jobName": name, "image": "pai-local/busybox:latest", "gpuType": gpu_type,
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": cpus, "memoryMB": 1000, "gpuNumber": gpus,
                       "command": "true"}],
    })


def test_it_never_double_allocates_under_fifty_concurrent_submissions(alice, limited_node):
    node, gpu_type = limited_node
    shapes = [(1, 1), (2, 2), (1, 3)]  # (gpus, cpus): mixed sizes stress every sum

    def submit_and_schedule(i: int) -> None:
        try:
            gpus, cpus = shapes[i % len(shapes)]
            services.job_submit(owner=alice, config=_config(f"burst-{i}", gpu_type, gpus, cpus))
            services.schedule_pass()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(submit_and_schedule, range(50)))
    services.schedule_pass()

    jobs = Job.objects.filter(owner=alice, name__startswith="burst-")
    assert jobs.count() == 50
    wait_for(lambda: not jobs.filter(waiting_reason="waiting for the scheduler").exists(), what="every job to be considered")

    active = list(TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES))
    assert active, "nothing was placed on the limited node"
    assert sum(a.cpus for a in active) <= node.cpus
    assert sum(a.memory_mb for a in active) <= node.memory_mb
    gpu_indices = [index for a in active for index in a.gpus]
    assert len(gpu_indices) == len(set(gpu_indices)) and set(gpu_indices) <= {0, 1, 2, 3}
    ports = [port for a in active for ports in a.ports.values() for port in ports]
    assert len(ports) == len(set(ports)) and all(33000 <= p <= 33011 for p in ports)
    # The allocation rows agree with the task rows, one row per device and port.
    assert Counter(GpuAllocation.objects.filter(node=node).values_list("index", flat=True)) == Counter(gpu_indices)
    assert sorted(PortAllocation.objects.filter(node=node).values_list("port", flat=True)) == sorted(ports)
    # Each job placed is placed whole, once; the rest wait with a reason.
    running = jobs.filter(state=State.RUNNING)
    assert running.count() == len(active)
    assert all(j.waiting_reason for j in jobs.filter(state=State.WAITING))


def test_it_stores_submissions_that_queue_together_in_one_transaction(alice, redis_server):
    # A write is under way (the flag is held by this test): five submissions
    # queue up behind it, one with a name alice already has and two with the
    # same new name. When the lead is handed over, one write stores them:
    # the taken and the repeated name are refused, the rest stored whole.
    from jobs.services import job_store

    services.job_submit(owner=alice, config=_plain("taken"))
    names = ["taken", "twice", "twice", "sweep-1", "sweep-2"]
    inserts: list[int] = []
    real_insert = job_store._insert

    def counting_insert(batch):
        inserts.append(len(batch))
        real_insert(batch)

    job_store._insert = counting_insert
    try:
        results = submit_in_one_batch(alice, [_plain(name) for name in names])
    finally:
        job_store._insert = real_insert
    assert inserts[0] == len(names)  # first tried as one batch, then one by one
    assert sorted(results.values()) == ["ConflictJobError", "ConflictJobError", "stored", "stored", "stored"]
    assert results[0] == "ConflictJobError"
    for name in ("taken", "twice", "sweep-1", "sweep-2"):
        job = Job.objects.get(owner=alice, name=name)
        assert job.attempts.count() == 1 and job.tasks.count() == 2
    assert not job_store._queue.writing and not job_store._queue.waiting


def _plain(name: str) -> str:
    return json.dumps({
        "jobName": name, "image": "pai-local/busybox:latest", "virtualCluster": "default",
        "taskRoles": [{"name": "main", "taskNumber": 2, "cpuNumber": 1, "memoryMB": 100, "gpuNumber": 0,
                       "command": "true"}],
    })
