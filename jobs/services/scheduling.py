"""A scheduling pass: snapshot the cluster, let jobs/scheduler.py decide,
write the placements, and ask node agents to launch.

Passes are serialized: on SQLite every write transaction takes the write
lock at BEGIN (transaction_mode IMMEDIATE); on PostgreSQL the pass locks the
"default" virtual-cluster row. The unique constraints on GPU and port
allocations are the last line of defence against double allocation.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Sum
from django.utils import timezone

from jobs import queues, scheduler
from jobs.environment import platform_port_labels
from jobs.models import (
    ACTIVE_TASK_STATES,
    GpuAllocation,
    Job,
    JobAttempt,
    Node,
    PortAllocation,
    State,
    Task,
    TaskAttempt,
    VirtualCluster,
)
from jobs.services import limits, notifications
from jobs.services.nodes import nodes_mark_lost, placement_cutoff
from jobs.spec import JobSpec, PortSpec

log = logging.getLogger(__name__)

# A pass looks at this many waiting jobs at most; the rest wait their turn.
MAX_JOBS_PER_PASS = 2000


def ready_nodes() -> list[Node]:
    return list(
        Node.objects.filter(status=Node.Status.READY, schedulable=True, last_heartbeat__gte=placement_cutoff(),
                            agent_pid__isnull=False)
        .order_by("name")
    )


def node_states(nodes: list[Node]) -> list[scheduler.NodeState]:
    """The nodes with what their active tasks hold now."""
    usage = {
        row["node_id"]: row
        for row in TaskAttempt.objects.filter(node__in=nodes, state__in=ACTIVE_TASK_STATES)
        .values("node_id").annotate(cpus=Sum("cpus"), memory=Sum("memory_mb"))
    }
    gpus: dict[int, set[int]] = defaultdict(set)
    for node_id, index in GpuAllocation.objects.filter(node__in=nodes).values_list("node_id", "index"):
        gpus[node_id].add(index)
    ports_by_address: dict[str, set[int]] = defaultdict(set)
    for address, port in PortAllocation.objects.values_list("address", "port"):
        ports_by_address[address].add(port)
    return [
        scheduler.NodeState(
            id=node.pk, name=node.name, address=node.address, cpus=node.cpus, memory_mb=node.memory_mb,
            gpus={int(g["index"]): str(g["type"]) for g in node.gpus}, port_start=node.port_start,
            port_end=node.port_end, used_cpus=usage.get(node.pk, {}).get("cpus") or 0,
            used_memory_mb=usage.get(node.pk, {}).get("memory") or 0, used_gpus=gpus[node.pk],
            used_ports=ports_by_address[node.address], fixed_ports_allowed=settings.FIXED_PORTS_ALLOWED,
        )
        for node in nodes
    ]


def quotas(states: list[scheduler.NodeState]) -> dict[str, scheduler.Quota]:
    """Each virtual cluster's share of the ready nodes, and what it holds."""
    total_cpus = sum(n.cpus for n in states)
    total_memory = sum(n.memory_mb for n in states)
    total_gpus: dict[str, int] = defaultdict(int)
    for node in states:
        for kind in node.gpus.values():
            total_gpus[kind] += 1
    vcs = list(VirtualCluster.objects.all())
    others = sum(vc.capacity for vc in vcs if vc.name != VirtualCluster.DEFAULT)
    result: dict[str, scheduler.Quota] = {}
    for vc in vcs:
        share = max(0.0, 100.0 - others) if vc.name == VirtualCluster.DEFAULT else vc.capacity
        share /= 100.0
        result[vc.name] = scheduler.Quota(
            cpus=total_cpus * share, memory_mb=total_memory * share,
            gpus={kind: count * share for kind, count in total_gpus.items()},
        )
    active = TaskAttempt.objects.filter(state__in=ACTIVE_TASK_STATES)
    for row in active.values("job__virtual_cluster__name").annotate(cpus=Sum("cpus"), memory=Sum("memory_mb")):
        quota = result.get(row["job__virtual_cluster__name"])
        if quota:
            quota.used_cpus, quota.used_memory_mb = row["cpus"] or 0, row["memory"] or 0
    gpu_rows = GpuAllocation.objects.values("attempt__job__virtual_cluster__name", "attempt__gpu_type").annotate(n=Count("id"))
    for row in gpu_rows:
        quota = result.get(row["attempt__job__virtual_cluster__name"])
        if quota:
            quota.used_gpus[row["attempt__gpu_type"]] += row["n"]
    return result


def _roles(spec: JobSpec) -> tuple[scheduler.RoleRequest, ...]:
    """What a job's task roles ask for, platform ports (ssh, main) included."""
    roles = []
    for role in spec.task_roles:
        platform = platform_port_labels([p.label for p in role.ports])
        roles.append(scheduler.RoleRequest(
            name=role.name, task_number=role.task_number, cpus=role.cpu_number, memory_mb=role.memory_mb,
            gpus=role.gpu_number, ports=role.ports + tuple(PortSpec(label, 0, 1) for label in platform),
        ))
    return tuple(roles)


def spec_request(spec: JobSpec, *, job_id: int, vc: str, overtaken: int = 0, owner: int = 0) -> scheduler.JobRequest:
    """What a spec asks for: a stored job's, or a draft's (Submit Job's fit check)."""
    return scheduler.JobRequest(id=job_id, vc=vc, gpu_type=spec.gpu_type, roles=_roles(spec), overtaken=overtaken,
                                owner=owner)


def job_request(job: Job) -> scheduler.JobRequest:
    """What a stored job asks for."""
    return spec_request(job.spec, job_id=job.pk, vc=job.virtual_cluster.name, overtaken=job.overtaken,
                        owner=job.owner_id)


# A job's config never changes once stored, so a process builds each waiting
# job's requests once instead of at every pass (a pass may look at thousands
# of waiting jobs, several times a second under a burst). The specs behind
# them come through the Job.spec memo, which the rest of the process shares.
_roles_cache: dict[int, tuple[scheduler.RoleRequest, ...]] = {}
_ROLES_CACHE_MAX = 20_000


@dataclass(frozen=True)
class _Waiting:
    id: int
    vc: str
    gpu_type: str
    overtaken: int
    waiting_reason: str
    owner: int


def _waiting_jobs() -> list[_Waiting]:
    rows = (Job.objects.filter(state=State.WAITING).order_by("id")
            .values_list("id", "virtual_cluster__name", "gpu_type", "overtaken", "waiting_reason",
                         "owner_id")[:MAX_JOBS_PER_PASS])
    return [_Waiting(*row) for row in rows]


def _requests(waiting: list[_Waiting]) -> list[scheduler.JobRequest]:
    missing = [job.id for job in waiting if job.id not in _roles_cache]
    if len(_roles_cache) + len(missing) > _ROLES_CACHE_MAX:
        _roles_cache.clear()
        missing = [job.id for job in waiting]
    for job in Job.objects.filter(pk__in=missing).only("id", "owner_id", "name", "config").iterator(chunk_size=500):
        _roles_cache[job.pk] = _roles(job.spec)
    return [
        scheduler.JobRequest(id=job.id, vc=job.vc, gpu_type=job.gpu_type or None, roles=_roles_cache[job.id],
                             overtaken=job.overtaken, owner=job.owner)
        for job in waiting
    ]


def user_quotas(waiting: list[_Waiting]) -> dict[tuple[str, int], scheduler.UserQuota]:
    """The running-job and GPU limits of each owner of a waiting job, by
    (virtual cluster, owner), with what they hold there now; only where such
    a limit applies. One query when no limit is set, at most three however
    long the queue."""
    table = limits.limit_table()
    if not table:
        return {}
    result: dict[tuple[str, int], scheduler.UserQuota] = {}
    for vc, owner in {(job.vc, job.owner) for job in waiting}:
        found = limits.resolve(table, vc_name=vc, user_id=owner)
        if found.max_running_jobs is not None or found.max_gpus is not None:
            result[vc, owner] = scheduler.UserQuota(max_running_jobs=found.max_running_jobs, max_gpus=found.max_gpus)
    if not result:
        return {}
    # A stopping job counts until it has ended: its tasks still hold their place.
    running = (Job.objects.filter(state__in=(State.RUNNING, State.STOPPING))
               .values_list("virtual_cluster__name", "owner_id").annotate(n=Count("id")))
    for vc, owner, count in running:
        if (vc, owner) in result:
            result[vc, owner].running_jobs = count
    gpus = (GpuAllocation.objects.values_list("attempt__job__virtual_cluster__name", "attempt__job__owner_id")
            .annotate(n=Count("id")))
    for vc, owner, count in gpus:
        if (vc, owner) in result:
            result[vc, owner].used_gpus = count
    return result


def _allocate_subnet(job_attempt: JobAttempt, tasks: int) -> ipaddress.IPv4Network | None:
    """A free subnet big enough for the job's tasks (.1 is the gateway).

    The search starts at a place that moves with each attempt, so a subnet
    just freed is not handed out again at once while a slow engine may still
    be removing its old network.
    """
    pool = ipaddress.ip_network(settings.JOB_SUBNET_POOL)
    prefix = max(pool.prefixlen, min(26, 32 - math.ceil(math.log2(tasks + 3))))
    used = [ipaddress.ip_network(s) for s in JobAttempt.objects.exclude(subnet="").values_list("subnet", flat=True)]
    candidates = list(pool.subnets(new_prefix=prefix))
    start = job_attempt.pk % len(candidates)
    for subnet in candidates[start:] + candidates[:start]:
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    return None


def _apply(job: Job, placements: list[scheduler.Placement], nodes: dict[int, Node]) -> list[tuple[str, int]]:
    """Write one job's placement; returns (node name, attempt id) to launch."""
    job_attempt = JobAttempt.objects.get(job=job, number=job.attempt_number)
    spec = job.spec
    order = {role.name: i for i, role in enumerate(spec.task_roles)}
    placements = sorted(placements, key=lambda p: (order[p.role], p.index))
    subnet = None
    if len(placements) > 1:
        subnet = _allocate_subnet(job_attempt, len(placements))
        if subnet is None:
            Job.objects.filter(pk=job.pk).update(waiting_reason="waiting for a free job network (JOB_SUBNET_POOL is used up)")
            return []
    if Job.objects.filter(pk=job.pk, state=State.WAITING).update(state=State.RUNNING, waiting_reason="") != 1:
        return []
    notifications.job_state_changed(job=job, previous=State.WAITING, state=State.RUNNING)
    JobAttempt.objects.filter(pk=job_attempt.pk).update(state=State.RUNNING, subnet=str(subnet) if subnet else "")
    tasks = {(t.role, t.index): t.pk for t in Task.objects.filter(job=job)}
    shm = {role.name: role.shm_mb for role in spec.task_roles}
    hosts = list(subnet.hosts())[1:] if subnet else []
    now = timezone.now()
    attempts = TaskAttempt.objects.bulk_create([
        TaskAttempt(
            task_id=tasks[(p.role, p.index)], job_attempt=job_attempt, job=job, number=job.attempt_number,
            node=nodes[p.node_id], node_name=nodes[p.node_id].name, host_ip=nodes[p.node_id].address,
            ip=str(hosts[i]) if hosts else "", cpus=p.cpus, memory_mb=p.memory_mb, shm_mb=shm[p.role],
            gpus=list(p.gpus), gpu_type=p.gpu_type, ports=p.ports, assigned_at=now,
        )
        for i, p in enumerate(placements)
    ])
    GpuAllocation.objects.bulk_create(
        GpuAllocation(node_id=p.node_id, index=index, attempt=a) for a, p in zip(attempts, placements) for index in p.gpus
    )
    PortAllocation.objects.bulk_create(
        PortAllocation(address=nodes[p.node_id].address, port=port, node_id=p.node_id, attempt=a)
        for a, p in zip(attempts, placements) for ports in p.ports.values() for port in ports
    )
    return [(a.node_name, a.pk) for a in attempts]


@dataclass
class _Plan:
    nodes: list[Node]
    waiting: list[_Waiting]
    decision: scheduler.Decision


def _plan() -> _Plan:
    nodes = ready_nodes()
    states = node_states(nodes)
    waiting = _waiting_jobs()
    decision = scheduler.schedule(
        _requests(waiting), states, quotas(states), max_overtakes=settings.SCHEDULER_MAX_OVERTAKES,
        user_quotas=user_quotas(waiting),
    )
    return _Plan(nodes, waiting, decision)


def _record_waiting(plan: _Plan) -> None:
    """Store the changed waiting reasons: one UPDATE per distinct reason (a
    queue of alike jobs shares one), only for jobs still waiting."""
    changed: dict[str, list[int]] = defaultdict(list)
    for job in plan.waiting:
        reason = plan.decision.waiting.get(job.id, job.waiting_reason)
        if job.id not in plan.decision.placed and reason != job.waiting_reason:
            changed[reason].append(job.id)
    for reason, ids in changed.items():
        Job.objects.filter(pk__in=ids, state=State.WAITING).update(waiting_reason=reason)


def _place(plan: _Plan) -> list[tuple[str, int]]:
    """Write the plan's placements; (node name, attempt id) to launch."""
    by_id = {node.pk: node for node in plan.nodes}
    launches: list[tuple[str, int]] = []
    for job_id, placements in plan.decision.placed.items():
        launches.extend(_apply(Job.objects.get(pk=job_id), placements, by_id))
        _roles_cache.pop(job_id, None)
    for job_id, count in plan.decision.overtaken.items():
        Job.objects.filter(pk=job_id, state=State.WAITING).update(overtaken=F("overtaken") + count)
    return launches


def schedule_pass() -> int:
    """Start every waiting job that fits now; returns how many started.
    Its duration goes to /metrics (queues.record_pass_duration)."""
    started = time.perf_counter()
    try:
        return _schedule_pass()
    finally:
        _record_duration(time.perf_counter() - started)


def _record_duration(seconds: float) -> None:
    try:
        queues.record_pass_duration(seconds)
    except Exception:  # Redis away: the pass itself went through
        log.warning("could not record the scheduling pass's duration", exc_info=True)


def _schedule_pass() -> int:
    """A first look is taken without the write lock: on SQLite that lock is
    the whole database's, and a pass over thousands of waiting jobs would
    hold up every submission meanwhile. Only when a job can start is the
    pass done again under the lock, so placements see every allocation
    committed before them."""
    queues.schedule_pass_started()
    nodes_mark_lost()
    plan = _plan()
    if not plan.decision.placed:
        # Each reason's UPDATE stands on its own; no transaction, so a pass
        # that changes nothing never takes the write lock at all.
        _record_waiting(plan)
        return 0
    with transaction.atomic():
        list(VirtualCluster.objects.select_for_update().filter(name=VirtualCluster.DEFAULT))
        plan = _plan()
        launches = _place(plan)
        _record_waiting(plan)
        transaction.on_commit(lambda: [queues.enqueue_launch(name, attempt_id) for name, attempt_id in launches])
    return len({attempt_id for _name, attempt_id in launches})
