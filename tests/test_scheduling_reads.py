"""A scheduling pass reads the cluster with SQL of its own
(jobs/services/scheduling.py, `_read_sql`); it must read exactly what the
ORM querysets it replaced read. Compared on a cluster with nodes of every
kind a pass must leave out, tasks holding CPUs, GPUs and ports in two
virtual clusters, tasks that ended, and waiting jobs; both reads in one
snapshot (the test cluster's agents write meanwhile). On SQLite and
PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Count, Sum, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from jobs import services
from jobs.models import (
    ACTIVE_TASK_STATES, ExitType, GpuAllocation, Job, Node, PortAllocation, State, TaskAttempt, VirtualCluster,
)
from jobs.services import scheduling
from jobs.services.lifecycle import ContainerExit
from tests.helpers import config, role, submit

pytestmark = pytest.mark.services


def _node(name: str, gpu_type: str, **changes) -> Node:
    values = dict(
        name=name, address=f"{name}.invalid", docker_host="unix:///nonexistent", cpus=16, memory_mb=16000,
        gpus=[{"index": i, "type": gpu_type} for i in range(16)], gpus_simulated=True, port_start=41000,
        port_end=41099, last_heartbeat=timezone.now() + timedelta(hours=1), agent_pid=os.getpid(),
    )
    return Node.objects.create(**{**values, **changes})


@pytest.fixture
def nodes(make_user, redis_server) -> Iterator[tuple[str, list[Node]]]:
    """A ready node of a GPU type of the test's own, and four nodes a pass
    must not place on: lost, cordoned, silent too long, no agent."""
    gpu_type = f"RD{uuid.uuid4().hex[:8].upper()}"
    tag = gpu_type.lower()
    made = [
        _node(f"t-read-{tag}", gpu_type),
        _node(f"t-read-{tag}-lost", gpu_type, status=Node.Status.LOST),
        _node(f"t-read-{tag}-cordoned", gpu_type, schedulable=False),
        _node(f"t-read-{tag}-silent", gpu_type, last_heartbeat=timezone.now() - timedelta(hours=1)),
        _node(f"t-read-{tag}-no-agent", gpu_type, agent_pid=None),
    ]
    yield gpu_type, made
    for attempt_id in TaskAttempt.objects.filter(node__in=made, state__in=ACTIVE_TASK_STATES).values_list("pk", flat=True):
        services.attempt_record_exit(attempt_id, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="the test ended"))
    Node.objects.filter(pk__in=[n.pk for n in made]).update(schedulable=False, last_heartbeat=timezone.now())


def _start(job: Job) -> None:
    services.schedule_pass()
    job.refresh_from_db()
    assert job.state == State.RUNNING, job.waiting_reason
    for attempt in TaskAttempt.objects.filter(job=job, number=job.attempt_number):
        assert services.attempt_claim_launch(attempt.pk)
        assert services.attempt_mark_running(attempt.pk, container_id=f"fake-{attempt.pk}")


def _orm_inputs() -> dict[str, list]:
    """The querysets the pass's reads replaced, as they were."""
    return {
        "nodes": list(scheduling.ready_nodes_queryset().annotate(stored_gpus=Cast("gpus", TextField())).values_list(
            "id", "name", "address", "cpus", "memory_mb", "stored_gpus", "port_start", "port_end")),
        "usage": list(TaskAttempt.objects.filter(state__in=ACTIVE_TASK_STATES).values_list(
            "node_id", "job__virtual_cluster__name").annotate(cpus=Sum("cpus"), memory=Sum("memory_mb"))),
        "gpus": list(GpuAllocation.objects.values_list("node_id", "index")),
        "ports": list(PortAllocation.objects.values_list("address", "port")),
        "vcs": list(VirtualCluster.objects.values_list("name", "capacity")),
        "vc_gpus": list(GpuAllocation.objects.values_list("attempt__job__virtual_cluster__name", "attempt__gpu_type")
                        .annotate(n=Count("id"))),
        "waiting": list(Job.objects.filter(state=State.WAITING).order_by("id").values_list(
            "id", "virtual_cluster__name", "gpu_type", "overtaken", "waiting_reason", "owner_id")),
    }


def _both_reads() -> tuple[scheduling._Inputs, dict[str, list]]:
    with transaction.atomic():  # SQLite: BEGIN IMMEDIATE holds every writer off
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return scheduling._read(), _orm_inputs()


def _rows(rows: list) -> Counter[tuple]:
    """Rows in any order (a node removed leaves its tasks' node id NULL: no sorting)."""
    return Counter(tuple(row) for row in rows)


@pytest.fixture
def small_vc(alice) -> Iterator[VirtualCluster]:
    """A virtual cluster of 10% (enough for one task of a GPU); back to 0%
    afterwards, so the default one has its whole share again (its jobs keep
    it from being deleted)."""
    vc = VirtualCluster.objects.create(name=f"reads_{uuid.uuid4().hex[:8]}", capacity=10.0)
    vc.users.add(alice)
    yield vc
    VirtualCluster.objects.filter(pk=vc.pk).update(capacity=0.0)


def test_a_pass_reads_what_the_querysets_it_replaced_read(alice, nodes, small_vc):
    gpu_type, made = nodes
    vc = small_vc
    _start(submit(alice, config("rd-default", role(tasks=2, gpus=1), gpuType=gpu_type)))
    _start(submit(alice, config("rd-vc", role(gpus=1), gpuType=gpu_type, virtualCluster=vc.name)))
    ended = submit(alice, config("rd-ended", role(gpus=1), gpuType=gpu_type))
    _start(ended)
    services.job_stop(job=ended, by=alice)
    for attempt_id in TaskAttempt.objects.filter(job=ended).values_list("pk", flat=True):
        services.attempt_record_exit(attempt_id, ContainerExit(137))
    waiting = submit(alice, config("rd-waiting", role(gpus=32), gpuType=gpu_type))  # more than any node has
    # A node removed while its task runs: the task holds its share with no node (NULL).
    gone = _node(f"{made[0].name}-removed", gpu_type + "X")
    orphan = submit(alice, config("rd-orphan", role(gpus=1), gpuType=gpu_type + "X"))
    _start(orphan)
    gone.delete()

    try:
        read, orm = _both_reads()
    finally:
        for attempt_id in TaskAttempt.objects.filter(job=orphan).values_list("pk", flat=True):
            services.attempt_record_exit(attempt_id, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="gone"))

    assert read.nodes == orm["nodes"]  # in name order
    assert made[0].pk in [row[0] for row in read.nodes]
    assert not {n.pk for n in made[1:]} & {row[0] for row in read.nodes}
    assert _rows(read.usage) == _rows(orm["usage"])
    assert (made[0].pk, vc.name, 1, 256) in read.usage
    assert any(row[0] is None for row in read.usage)
    assert _rows(read.gpus) == _rows(orm["gpus"])
    assert _rows(read.ports) == _rows(orm["ports"])
    assert read.vcs == orm["vcs"]  # by name
    assert _rows(read.vc_gpus) == _rows(orm["vc_gpus"])
    assert ("default", gpu_type, 2) in read.vc_gpus and (vc.name, gpu_type, 1) in read.vc_gpus
    assert [tuple(job) for job in read.waiting] == orm["waiting"]  # in submission order
    assert waiting.pk in [job.id for job in read.waiting] and ended.pk not in [job.id for job in read.waiting]


def test_when_more_wait_than_a_pass_looks_at_each_owner_brings_their_oldest(make_user, redis_server, monkeypatch):
    # The read behind the pass's fairness among users (MAX_JOBS_PER_PASS):
    # one owner's many waiting jobs leave room for every other owner's.
    monkeypatch.setattr(scheduling, "MAX_JOBS_PER_PASS", 6)
    many, few = make_user("many"), make_user("few")
    never = dict(gpuType="NO-SUCH-GPU")
    for job in Job.objects.filter(state=State.WAITING):  # another test's leftovers would change the shares
        services.job_stop(job=job, by=job.owner)
    mine = [submit(many, config(f"many-{i}", role(gpus=1), **never)).pk for i in range(10)]
    theirs = [submit(few, config(f"few-{i}", role(gpus=1), **never)).pk for i in range(2)]
    with transaction.atomic():
        read = [w.id for w in scheduling._read().waiting]
    assert read == sorted(mine[:3] + theirs[:2])  # a share of 6 // 2 each, in submission order
