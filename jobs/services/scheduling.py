"""A scheduling pass: snapshot the cluster, let jobs/scheduler.py decide,
write the placements, and ask node agents to launch.

Passes are serialized: on SQLite every write transaction takes the write
lock at BEGIN (transaction_mode IMMEDIATE); on PostgreSQL the pass locks the
"default" virtual-cluster row. The unique constraints on GPU and port
allocations are the last line of defence against double allocation.
"""

from __future__ import annotations

import functools
import gc
import ipaddress
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, QuerySet, Sum
from django.db.models.expressions import RawSQL

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
from jobs.services import db_clock, limits, notifications
from jobs.services import rows as rows_sql
from jobs.services.nodes import lock_passes as _lock_passes
from jobs.services.nodes import nodes_mark_lost_if_due, placement_cutoff
from jobs.spec import JobSpec, PortSpec

log = logging.getLogger(__name__)

# A pass looks at this many waiting jobs at most; the rest wait their turn.
# bench/scheduler_scale.py measures a pass over this many. When more wait,
# each owner's oldest come in, an even share each (_read), so that one
# user's thousands of jobs that cannot start keep nobody else's out.
MAX_JOBS_PER_PASS = 10_000


def ready_nodes_queryset(now: datetime | None = None) -> QuerySet[Node]:
    """The nodes new tasks may go to now (`now`: the database's clock, if
    the caller read it already), by name."""
    return (Node.objects.filter(status=Node.Status.READY, schedulable=True, last_heartbeat__gte=placement_cutoff(now),
                                agent_pid__isnull=False)
            .order_by("name"))


def ready_nodes(now: datetime | None = None) -> list[Node]:
    return list(ready_nodes_queryset(now))


def node_states(nodes: list[Node]) -> list[scheduler.NodeState]:
    """The nodes with what their active tasks hold now."""
    usage = {
        node_id: (cpus, memory)
        for node_id, cpus, memory in TaskAttempt.objects.filter(node__in=nodes, state__in=ACTIVE_TASK_STATES)
        .values_list("node_id").annotate(cpus=Sum("cpus"), memory=Sum("memory_mb"))
    }
    rows = [(n.pk, n.name, n.address, n.cpus, n.memory_mb, n.gpus, n.port_start, n.port_end) for n in nodes]
    return _states(rows, usage, GpuAllocation.objects.filter(node__in=nodes).values_list("node_id", "index"),
                   PortAllocation.objects.values_list("address", "port"))


# A node's GPUs as stored (JSON text) -> {index: type}; nodes alike share one.
_gpu_maps: dict[str, dict[int, str]] = {}


def _gpu_map(stored: str | list) -> dict[int, str]:
    """{index: type} of a node's `gpus`, read once per distinct value: a
    pass reads every ready node, and most nodes of a cluster are alike."""
    if not isinstance(stored, str):  # a decoded list (psycopg decodes jsonb itself)
        return {int(g["index"]): str(g["type"]) for g in stored}
    found = _gpu_maps.get(stored)
    if found is None:
        if len(_gpu_maps) > 10_000:
            _gpu_maps.clear()
        found = _gpu_maps[stored] = {int(g["index"]): str(g["type"]) for g in json.loads(stored)}
    return found


def _states(rows: list[tuple], usage: dict[int, tuple[int, int]], gpu_rows: Iterable[tuple[int, int]],
            port_rows: Iterable[tuple[str, int]]) -> list[scheduler.NodeState]:
    """NodeStates of node `rows` (id, name, address, CPUs, memory, GPUs,
    port range), with `usage` (CPUs, memory) and GPUs (node, index) taken by
    node, and the ports (address, port) taken on each node's address."""
    gpus: dict[int, set[int]] = defaultdict(set)
    for node_id, index in gpu_rows:
        gpus[node_id].add(index)
    ports_by_address: dict[str, set[int]] = defaultdict(set)
    for address, port in port_rows:
        ports_by_address[address].add(port)
    fixed = settings.FIXED_PORTS_ALLOWED
    states = []
    for node_id, name, address, cpus, memory_mb, stored_gpus, port_start, port_end in rows:
        used_cpus, used_memory = usage.get(node_id, (0, 0))
        states.append(scheduler.NodeState(
            id=node_id, name=name, address=address, cpus=cpus, memory_mb=memory_mb, gpus=_gpu_map(stored_gpus),
            port_start=port_start, port_end=port_end, used_cpus=used_cpus or 0, used_memory_mb=used_memory or 0,
            used_gpus=gpus[node_id], used_ports=ports_by_address[address], fixed_ports_allowed=fixed,
        ))
    return states


@dataclass
class _Inputs:
    """Everything a pass decides from, as read: rows of plain values, so
    that two reads compare equal exactly when they would decide the same
    (the configs behind `waiting` never change)."""

    nodes: list[tuple]  # the ready nodes: id, name, address, CPUs, memory, GPUs (JSON), port range
    away: list[tuple]  # the schedulable nodes not ready now (scheduler.Away), as `nodes`
    usage: list[tuple]  # what active tasks hold: node id, virtual cluster, CPUs, memory
    gpus: list[tuple]  # GPUs taken: node id, index
    ports: list[tuple]  # ports taken: address, port
    vcs: list[tuple]  # virtual clusters: name, capacity
    vc_gpus: list[tuple]  # GPUs taken: virtual cluster, type, count
    waiting: list[_Waiting]
    limits: dict[tuple[str, int], tuple]  # the owners' limits and use (user_quotas), as values


def _read() -> _Inputs:
    sql = _read_sql(connection.vendor)
    with connection.cursor() as cursor:
        def rows(name: str, params: Iterable[Any] = ()) -> list[tuple]:
            cursor.execute(sql[name], list(params))
            return cursor.fetchall()

        cutoff = connection.ops.adapt_datetimefield_value(placement_cutoff())
        waiting = rows("waiting", [State.WAITING, MAX_JOBS_PER_PASS + 1])
        if len(waiting) > MAX_JOBS_PER_PASS:
            [(owners,)] = rows("waiting_owners", [State.WAITING])
            share = max(1, MAX_JOBS_PER_PASS // owners)
            waiting = rows("waiting_shared", [State.WAITING, share, MAX_JOBS_PER_PASS])
        waiting = list(map(_Waiting._make, waiting))
        ready, away = _split_ready(rows("nodes", [Node.Status.READY, cutoff, True]))
        return _Inputs(
            nodes=ready, away=away, usage=rows("usage", ACTIVE_TASK_STATES),
            gpus=rows("gpus"), ports=rows("ports"), vcs=rows("vcs"), vc_gpus=rows("vc_gpus"), waiting=waiting,
            limits={key: (q.max_running_jobs, q.max_gpus, q.running_jobs, q.used_gpus)
                    for key, q in user_quotas(waiting).items()},
        )


def _split_ready(rows: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """The schedulable nodes' rows, ready ones and the others, each without
    the last column (whether it is ready), in the order read."""
    ready, away = [], []
    for row in rows:
        (ready if row[-1] else away).append(row[:-1])
    return ready, away


@functools.cache
def _read_sql(vendor: str) -> dict[str, str]:
    """What a pass reads, as SQL of its own. The ORM built and compiled
    these seven small queries at every pass, several times what running
    them cost (4 of a pass's 12 ms on an idle cluster, in the middle of
    every job's way from submission to its container:
    bench/submit_to_running.py). They are what the querysets they replace
    said: the ready nodes by name (ready_nodes_queryset), what active tasks
    hold by node and virtual cluster, the GPUs and ports taken, the virtual
    clusters, the GPUs each virtual cluster holds by type, and the waiting
    jobs in submission order."""
    quote = connection.ops.quote_name
    node, attempt, job, vc, gpu, port = (quote(model._meta.db_table) for model in (
        Node, TaskAttempt, Job, VirtualCluster, GpuAllocation, PortAllocation))
    active = ", ".join(["%s"] * len(ACTIVE_TASK_STATES))
    job_vc = f"INNER JOIN {job} j ON j.id = a.job_id INNER JOIN {vc} vc ON vc.id = j.virtual_cluster_id"
    return {
        # Every schedulable node, and whether it is ready: the others are
        # those a job may wait for (scheduler.Away), in the same one read.
        "nodes": f"SELECT id, name, address, cpus, memory_mb, CAST(gpus AS text), port_start, port_end, "
                 "CASE WHEN status = %s AND last_heartbeat >= %s AND agent_pid IS NOT NULL THEN 1 ELSE 0 END "
                 f"FROM {node} WHERE schedulable = %s ORDER BY name",
        "usage": f"SELECT a.node_id, vc.name, SUM(a.cpus), SUM(a.memory_mb) FROM {attempt} a {job_vc} "
                 f"WHERE a.state IN ({active}) GROUP BY a.node_id, vc.name",
        "gpus": f"SELECT node_id, {quote('index')} FROM {gpu}",
        "ports": f"SELECT address, port FROM {port}",
        "vcs": f"SELECT name, capacity FROM {vc} ORDER BY name",
        "vc_gpus": f"SELECT vc.name, a.gpu_type, COUNT(g.id) FROM {gpu} g INNER JOIN {attempt} a ON a.id = g.attempt_id "
                   f"{job_vc} GROUP BY vc.name, a.gpu_type",
        "waiting": f"SELECT j.id, vc.name, j.gpu_type, j.overtaken, j.waiting_reason, j.owner_id FROM {job} j "
                   f"INNER JOIN {vc} vc ON vc.id = j.virtual_cluster_id WHERE j.state = %s ORDER BY j.id LIMIT %s",
        "waiting_owners": f"SELECT COUNT(DISTINCT owner_id) FROM {job} WHERE state = %s",
        # Each owner's oldest `share` waiting jobs, then in submission order as above.
        "waiting_shared": "SELECT id, vc_name, gpu_type, overtaken, waiting_reason, owner_id FROM ("
                          "SELECT j.id, vc.name AS vc_name, j.gpu_type, j.overtaken, j.waiting_reason, j.owner_id, "
                          "ROW_NUMBER() OVER (PARTITION BY j.owner_id ORDER BY j.id) AS nth "
                          f"FROM {job} j INNER JOIN {vc} vc ON vc.id = j.virtual_cluster_id WHERE j.state = %s"
                          ") shared WHERE nth <= %s ORDER BY id LIMIT %s",
    }


def _ready_states(inputs: _Inputs) -> tuple[list[scheduler.NodeState], dict[str, scheduler.Quota]]:
    """The ready nodes' states and the virtual clusters' quotas, from one read."""
    by_node: dict[int, tuple[int, int]] = defaultdict(lambda: (0, 0))
    by_vc: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    for node_id, vc, cpus, memory in inputs.usage:
        cpus, memory = cpus or 0, memory or 0
        by_node[node_id] = (by_node[node_id][0] + cpus, by_node[node_id][1] + memory)
        by_vc[vc] = (by_vc[vc][0] + cpus, by_vc[vc][1] + memory)
    states = _states(inputs.nodes, by_node, inputs.gpus, inputs.ports)
    return states, _quotas(states, by_vc, inputs.vcs, inputs.vc_gpus)


def _away(inputs: _Inputs, states: list[scheduler.NodeState]) -> scheduler.Away | None:
    """The schedulable nodes not ready now, and the quotas were they back;
    None when every one is ready (the usual pass)."""
    if not inputs.away:
        return None
    away = _states(inputs.away, {}, (), ())
    return scheduler.Away(nodes=away, quotas=_quotas(states + away, {}, inputs.vcs, ()))


def quotas(states: list[scheduler.NodeState]) -> dict[str, scheduler.Quota]:
    """Each virtual cluster's share of the ready nodes, and what it holds."""
    active = TaskAttempt.objects.filter(state__in=ACTIVE_TASK_STATES)
    used = {vc: (cpus or 0, memory or 0) for vc, cpus, memory in active.values_list("job__virtual_cluster__name")
            .annotate(cpus=Sum("cpus"), memory=Sum("memory_mb"))}
    gpu_rows = GpuAllocation.objects.values_list("attempt__job__virtual_cluster__name", "attempt__gpu_type").annotate(n=Count("id"))
    return _quotas(states, used, VirtualCluster.objects.values_list("name", "capacity"), gpu_rows)


# Shares are typed in percent to a hundredth: a quota of GPUs or CPUs within
# that of a whole unit is that unit. Three virtual clusters of 33.33% on three
# GPUs each hold one GPU, not 0.9999 of one that no one-GPU job could ever fit.
SHARE_PRECISION = 0.0001


def _whole_if_close(value: float, total: float) -> float:
    nearest = round(value)
    return float(nearest) if abs(value - nearest) <= total * SHARE_PRECISION + 1e-9 else value


def _quotas(states: list[scheduler.NodeState], used: dict[str, tuple[int, int]], vcs: Iterable[tuple[str, float]],
            gpu_rows: Iterable[tuple[str, str, int]]) -> dict[str, scheduler.Quota]:
    """`quotas`, given the CPUs and memory held by virtual cluster, the
    virtual clusters (name, capacity) and the GPUs held (virtual cluster,
    type, count)."""
    vcs = list(vcs)
    total_cpus = sum(n.cpus for n in states)
    total_memory = sum(n.memory_mb for n in states)
    total_gpus: dict[str, int] = defaultdict(int)
    for node in states:
        for kind in node.gpus.values():
            total_gpus[kind] += 1
    others = sum(capacity for name, capacity in vcs if name != VirtualCluster.DEFAULT)
    result: dict[str, scheduler.Quota] = {}
    for name, capacity in vcs:
        share = max(0.0, 100.0 - others) if name == VirtualCluster.DEFAULT else capacity
        share /= 100.0
        result[name] = scheduler.Quota(
            cpus=_whole_if_close(total_cpus * share, total_cpus),
            memory_mb=total_memory * share,  # in MB: a hundredth of a percent of it is no whole unit
            gpus={kind: _whole_if_close(count * share, count) for kind, count in total_gpus.items()},
        )
    for name, (cpus, memory) in used.items():
        if name in result:
            result[name].used_cpus, result[name].used_memory_mb = cpus, memory
    for name, kind, count in gpu_rows:
        if name in result:
            result[name].used_gpus[kind] += count
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


class _Asks(NamedTuple):
    """What a stored job's task roles ask for (in the spec's order), and
    what writing its start needs besides: each role's shared memory."""

    roles: tuple[scheduler.RoleRequest, ...]
    shm_mb: tuple[int, ...]


def _asks(spec: JobSpec) -> _Asks:
    return _Asks(_roles(spec), tuple(role.shm_mb for role in spec.task_roles))


# A job's config never changes once stored, so a process builds each waiting
# job's requests once instead of at every pass (a pass may look at thousands
# of waiting jobs, several times a second under a burst). The specs behind
# them come through the Job.spec memo, which the rest of the process shares.
_roles_cache: dict[int, _Asks] = {}
_ROLES_CACHE_MAX = 20_000
# Alike jobs (a sweep of one config) share one requests object, which the
# scheduler then hashes once for all of them (scheduler._Kinds).
_role_shapes: dict[_Asks, _Asks] = {}
_request_memo: dict[int, scheduler.JobRequest] = {}


def _among(ids: Iterable[int]) -> list[int] | RawSQL:
    """`ids` for an `__in` filter: on PostgreSQL as one array parameter. A
    pass filters by thousands of ids at once, and psycopg binds parameters
    on the client: splitting the statement at thousands of placeholders and
    quoting each cost more than running it (bench/scheduler_scale.py)."""
    if connection.vendor == "postgresql":
        return RawSQL("SELECT unnest(%s::bigint[])", [_array(ids)])
    return list(ids)


def _array(ids: Iterable[int]) -> str:
    """PostgreSQL's text for an array of ids: quoting a list element by
    element cost more than the rest of a statement of thousands."""
    return "{" + ",".join(map(str, map(int, ids))) + "}"


class _Waiting(NamedTuple):  # a tuple: a pass reads thousands
    id: int
    vc: str
    gpu_type: str
    overtaken: int
    waiting_reason: str
    owner: int


def _requests(waiting: list[_Waiting]) -> list[scheduler.JobRequest]:
    missing = [job.id for job in waiting if job.id not in _roles_cache]
    if len(_roles_cache) + len(missing) > _ROLES_CACHE_MAX:
        _roles_cache.clear()
        _role_shapes.clear()
        _request_memo.clear()
        missing = [job.id for job in waiting]
    _remember_asks(missing)
    requests = []
    for job in waiting:
        asks = _roles_cache.get(job.id)
        if asks is None:  # gone since the pass read it waiting (its owner stopped and deleted it)
            continue
        # The scheduler only reads requests: one kept from the last pass
        # serves again while the job is as it was then.
        request = _request_memo.get(job.id)
        if request is None or request.overtaken != job.overtaken or request.vc != job.vc:
            request = _request_memo[job.id] = scheduler.JobRequest(
                id=job.id, vc=job.vc, gpu_type=job.gpu_type or None, roles=asks.roles,
                overtaken=job.overtaken, owner=job.owner)
        requests.append(request)
    return requests


def _remember_asks(job_ids: list[int]) -> None:
    """Read these jobs' configs into `_roles_cache`."""
    if not job_ids:
        return
    jobs = Job.objects.filter(pk__in=_among(job_ids)).only("id", "owner_id", "name", "config")
    for job in jobs.iterator(chunk_size=500):
        asks = _asks(job.spec)
        _roles_cache[job.pk] = _role_shapes.setdefault(asks, asks)


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


class _JobNetworks:
    """The job networks (subnets of JOB_SUBNET_POOL) in use, read once per
    pass, and handed out as the pass places jobs.

    A job gets the first free subnet big enough for its tasks (.1 is the
    gateway), searching from a place that moves with each attempt, so that
    a subnet just freed is not handed out again at once while a slow engine
    may still be removing its old network. The pool's subnets of one size
    are numbered, and those overlapping a network in use are remembered by
    number: finding a free one costs a few set lookups, not a walk over
    every subnet of the pool (131,072 /26 in a /9)."""

    def __init__(self) -> None:
        self.pool = ipaddress.ip_network(settings.JOB_SUBNET_POOL)
        self.used = [ipaddress.ip_network(s) for s in JobAttempt.objects.exclude(subnet="").values_list("subnet", flat=True)]
        self._taken: dict[int, set[int]] = {}  # by prefix length: numbers of the subnets overlapping one in use

    def take(self, job_attempt_id: int, tasks: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        pool = self.pool
        prefix = max(pool.prefixlen, min(26, 32 - math.ceil(math.log2(tasks + 3))))
        count = 2 ** (prefix - pool.prefixlen)
        taken = self._taken_at(prefix)
        start = job_attempt_id % count
        for number in range(count):
            number = (start + number) % count
            if number not in taken:
                size = 2 ** (pool.max_prefixlen - prefix)
                subnet = ipaddress.ip_network((int(pool.network_address) + number * size, prefix))
                self.used.append(subnet)
                for length, numbers in self._taken.items():
                    numbers.update(self._numbers(subnet, length))
                return subnet
        return None

    def _taken_at(self, prefix: int) -> set[int]:
        if prefix not in self._taken:
            self._taken[prefix] = {number for used in self.used for number in self._overlapping(used, prefix)}
        return self._taken[prefix]

    def _overlapping(self, used: ipaddress.IPv4Network | ipaddress.IPv6Network, prefix: int) -> range:
        """The numbers of the pool's subnets of length `prefix` that overlap `used`."""
        if used.version != self.pool.version or not used.overlaps(self.pool):
            return range(0)
        return self._numbers(used, prefix)

    def _numbers(self, used: ipaddress.IPv4Network | ipaddress.IPv6Network, prefix: int) -> range:
        """`_overlapping` for a subnet known to overlap the pool."""
        pool = self.pool
        size = 2 ** (pool.max_prefixlen - prefix)
        base = int(pool.network_address)
        first = max(0, (int(used.network_address) - base) // size)
        last = min(2 ** (prefix - pool.prefixlen) - 1, (int(used.broadcast_address) - base) // size)
        return range(first, last + 1)


@dataclass
class _Start:
    """A job the pass starts: its current attempt (id and job network) and
    its tasks' placements, in task role order."""

    job: Job  # id, owner, name and attempt number only: its config stays unread
    attempt_id: int
    subnet: str
    placements: list[scheduler.Placement]
    shm_mb: dict[str, int]  # by task role


def _starts(placed: dict[int, list[scheduler.Placement]]) -> list[_Start]:
    """The placed jobs still waiting, locked against a concurrent change of
    state (on PostgreSQL; SQLite's write lock is the pass's already), with
    their current attempts; in the order they were placed.

    What their specs say comes from `_roles_cache`, which the pass's
    `_requests` filled for every waiting job: no config is read again."""
    jobs = {job.pk: job for job in Job.objects.select_for_update().filter(pk__in=_among(placed), state=State.WAITING)
            .only("id", "owner_id", "name", "attempt_number")}
    attempts = {(job_id, number): (pk, subnet) for job_id, number, pk, subnet in JobAttempt.objects
                .filter(job_id__in=_among(jobs)).values_list("job_id", "number", "pk", "subnet")}
    _remember_asks([job_id for job_id in jobs if job_id not in _roles_cache])
    starts = []
    for job_id, placements in placed.items():
        job = jobs.get(job_id)
        if job is None:
            continue
        asks = _roles_cache[job_id]
        order = {role.name: i for i, role in enumerate(asks.roles)}
        placements = sorted(placements, key=lambda p: (order[p.role], p.index))
        attempt_id, subnet = attempts[job_id, job.attempt_number]
        shm = {role.name: shm for role, shm in zip(asks.roles, asks.shm_mb)}
        starts.append(_Start(job, attempt_id, subnet, placements, shm))
    return starts


def _with_networks(starts: list[_Start]) -> list[_Start]:
    """The starts that got a job network if they need one (more than one
    task); the others keep waiting and say why."""
    networks: _JobNetworks | None = None  # read only when a start needs one
    ready = []
    for start in starts:
        if len(start.placements) > 1:
            networks = networks or _JobNetworks()
            subnet = networks.take(start.attempt_id, len(start.placements))
            if subnet is None:
                Job.objects.filter(pk=start.job.pk).update(
                    waiting_reason="waiting for a free job network (JOB_SUBNET_POOL is used up)")
                continue
            start.subnet = str(subnet)
        ready.append(start)
    return ready


def _write_starts(starts: list[_Start], nodes: dict[int, scheduler.NodeState]) -> list[queues.Launch]:
    """Every placed job RUNNING with its task attempts and allocations, a
    few statements for the whole pass; (node name, attempt id, owner id) to launch."""
    job_ids = [start.job.pk for start in starts]
    Job.objects.filter(pk__in=_among(job_ids), state=State.WAITING).update(state=State.RUNNING, waiting_reason="")
    notifications.jobs_state_changed(jobs=[start.job for start in starts], previous=State.WAITING, state=State.RUNNING)
    _attempts_running(starts)
    tasks = {(job_id, role, index): pk for job_id, role, index, pk in Task.objects.filter(
        job_id__in=_among(job_ids)).values_list("job_id", "role", "index", "pk")}
    now = db_clock.now()  # the agents that launch these compare it with their own (corrected) clocks
    rows: list[dict[str, Any]] = []
    placements: list[scheduler.Placement] = []
    for start in starts:
        job = start.job
        # Task i gets the subnet's (i+2)th address: .1 is the gateway.
        first = ipaddress.ip_network(start.subnet).network_address + 2 if start.subnet else None
        for i, p in enumerate(start.placements):
            node = nodes[p.node_id]
            rows.append({
                "task_id": tasks[job.pk, p.role, p.index], "job_attempt_id": start.attempt_id, "job_id": job.pk,
                "number": job.attempt_number, "node_id": node.id, "node_name": node.name, "host_ip": node.address,
                "ip": str(first + i) if first is not None else "", "cpus": p.cpus, "memory_mb": p.memory_mb,
                "shm_mb": start.shm_mb[p.role], "gpus": list(p.gpus), "gpu_type": p.gpu_type, "ports": p.ports,
                "assigned_at": now,
            })
            placements.append(p)
    rows_sql.insert(TaskAttempt, rows)
    # The attempts' ids, by task (one attempt per task and job attempt).
    ids = dict(TaskAttempt.objects.filter(job_attempt_id__in=_among([start.attempt_id for start in starts]))
               .values_list("task_id", "pk"))
    rows_sql.insert_values(GpuAllocation, ["node_id", "index", "attempt_id"],
                           [(p.node_id, index, ids[row["task_id"]]) for row, p in zip(rows, placements) for index in p.gpus])
    rows_sql.insert_values(PortAllocation, ["address", "port", "node_id", "attempt_id"],
                           [(row["host_ip"], port, p.node_id, ids[row["task_id"]]) for row, p in zip(rows, placements)
                            for ports in p.ports.values() for port in ports])
    owners = {start.job.pk: start.job.owner_id for start in starts}
    return [(row["node_name"], ids[row["task_id"]], owners[row["job_id"]]) for row in rows]


def _attempts_running(starts: list[_Start]) -> None:
    """The starts' job attempts RUNNING, each with its job network."""
    if connection.vendor != "postgresql":
        rows_sql.many(JobAttempt, "UPDATE {table} SET {state} = %s, {subnet} = %s WHERE {id} = %s",
                      [(State.RUNNING, start.subnet, start.attempt_id) for start in starts])
        return
    # One statement over two arrays: executemany would send one per attempt
    # (several times slower for thousands of them).
    ids, subnets = _array(start.attempt_id for start in starts), [start.subnet for start in starts]
    with connection.cursor() as cursor:
        cursor.execute(rows_sql.sql_for(JobAttempt, "UPDATE {table} SET {state} = %s, {subnet} = given.subnet "
                                                    "FROM unnest(%s::bigint[], %s::text[]) AS given(id, subnet) "
                                                    "WHERE {table}.{id} = given.id"), [State.RUNNING, ids, subnets])


@dataclass
class _Plan:
    inputs: _Inputs
    nodes: list[scheduler.NodeState]
    waiting: list[_Waiting]
    decision: scheduler.Decision


def _plan(inputs: _Inputs) -> _Plan:
    states, quota = _ready_states(inputs)
    owners = {key: scheduler.UserQuota(*values) for key, values in inputs.limits.items()}
    decision = scheduler.schedule(_requests(inputs.waiting), states, quota,
                                  max_overtakes=settings.SCHEDULER_MAX_OVERTAKES, user_quotas=owners,
                                  away=_away(inputs, states))
    return _Plan(inputs, states, inputs.waiting, decision)


def _record_waiting(plan: _Plan) -> None:
    """Store the changed waiting reasons: one UPDATE per distinct reason (a
    queue of alike jobs shares one), only for jobs still waiting."""
    changed: dict[str, list[int]] = defaultdict(list)
    for job in plan.waiting:
        reason = plan.decision.waiting.get(job.id, job.waiting_reason)
        if job.id not in plan.decision.placed and reason != job.waiting_reason:
            changed[reason].append(job.id)
    # A pass that places many jobs changes thousands of reasons (each says
    # what is free now): plain statements, not a query built per reason.
    postgres = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        for reason, ids in changed.items():
            if postgres:  # one array parameter (see `_among`)
                cursor.execute(rows_sql.sql_for(Job, "UPDATE {table} SET {waiting_reason} = %s WHERE {state} = %s "
                                                     "AND {id} = ANY(%s::bigint[])"), [reason, State.WAITING, _array(ids)])
            else:
                cursor.execute(rows_sql.sql_for(Job, "UPDATE {table} SET {waiting_reason} = %s WHERE {state} = %s "
                                                     "AND {id} IN ({ids})", ids=", ".join(["%s"] * len(ids))),
                               [reason, State.WAITING, *ids])


def _place(plan: _Plan) -> list[queues.Launch]:
    """Write the plan's placements; (node name, attempt id, owner id) to launch."""
    starts = _with_networks(_starts(plan.decision.placed))
    launches = _write_starts(starts, {node.id: node for node in plan.nodes}) if starts else []
    for job_id in plan.decision.placed:
        _roles_cache.pop(job_id, None)
        _request_memo.pop(job_id, None)
    # One UPDATE per distinct count: a pass that places thousands of jobs
    # may pass over thousands of others.
    by_count: dict[int, list[int]] = defaultdict(list)
    for job_id, count in plan.decision.overtaken.items():
        by_count[count].append(job_id)
    for count, ids in by_count.items():
        Job.objects.filter(pk__in=ids, state=State.WAITING).update(overtaken=F("overtaken") + count)
    return launches


@dataclass(frozen=True)
class LaunchHere:
    """The node whose agent runs this pass, and its way to take a launch."""

    node_name: str
    launch: Callable[[int, int], None]  # attempt id, owner id


def schedule_pass(*, here: LaunchHere | None = None) -> int:
    """Start every waiting job that fits now; returns how many started.
    `here`: the pass runs in that node's agent, which takes that node's
    launches at once (_send_launches). Its duration goes to /metrics
    (queues.record_pass_duration)."""
    started = time.perf_counter()
    placed = 0
    try:
        with _collector_paused():
            placed = _schedule_pass(here)
        return placed
    finally:
        _record_duration(time.perf_counter() - started, started_tasks=placed > 0)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for the pass. A pass makes tens of
    thousands of objects that live until it ends (rows read, requests,
    placements), and each full collection they trigger walks every object of
    the process (the spec and request caches: over 100,000) to find nothing:
    two of those were a third of a pass's CPU (bench/scheduler_scale.py).
    Reference counting frees the pass's objects as it ends; cycles among
    them wait for the next collection. Nested or concurrent passes leave the
    collector as the first found it, give or take a collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _record_duration(seconds: float, *, started_tasks: bool) -> None:
    try:
        queues.record_pass_duration(seconds, started_tasks=started_tasks)
    except Exception:  # Redis away: the pass itself went through
        log.warning("could not record the scheduling pass's duration", exc_info=True)


def _schedule_pass(here: LaunchHere | None) -> int:
    """On SQLite a first look is taken without the write lock: that lock is
    the whole database's, and a pass over thousands of waiting jobs would
    hold up every submission meanwhile. Only when a job can start is the
    pass done again under the lock, so placements see every allocation
    committed before them, unless nothing was committed meanwhile. On
    PostgreSQL the lock is one row's, which only other passes take: a pass
    takes it first and looks once."""
    queues.schedule_pass_started()
    nodes_mark_lost_if_due()
    if connection.vendor == "postgresql":
        with transaction.atomic():
            _lock_passes()
            return _carry_out(_plan(_read()), here)
    version = _data_version()
    plan = _plan(_read())
    if not plan.decision.placed:
        # Each reason's UPDATE stands on its own; no transaction, so a pass
        # that changes nothing never takes the write lock at all.
        _record_waiting(plan)
        return 0
    with transaction.atomic():  # BEGIN IMMEDIATE: this waits for any other pass (transaction_mode)
        # Read again only if another connection committed since the look:
        # on a quiet cluster that second read was a third of the pass that
        # starts a job (bench/submit_to_running.py).
        if _data_version() != version:
            inputs = _read()
            if inputs != plan.inputs:  # else the same inputs decide the same: no need to decide again
                plan = _plan(inputs)
        return _carry_out(plan, here)


def _data_version() -> int:
    """SQLite's PRAGMA data_version: it changes when any other connection,
    of this process or another, commits to the database."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA data_version")
        return cursor.fetchone()[0]


def _carry_out(plan: _Plan, here: LaunchHere | None) -> int:
    """Write the plan's placements and waiting reasons in the pass's
    transaction; the launch requests go out after commit. Returns how many
    tasks start."""
    launches = _place(plan) if plan.decision.placed else []
    _record_waiting(plan)
    transaction.on_commit(lambda: _send_launches(launches, here), robust=True)
    return len({attempt_id for _name, attempt_id, _owner_id in launches})


def _send_launches(launches: list[queues.Launch], here: LaunchHere | None) -> None:
    """A launch request to each node's queue, except for the node whose
    agent runs the pass: it takes its own at once, without the trip through
    Redis and the RQ job around each request (~4 ms and the worker's CPU,
    bench/submit_to_running.py). A launch so taken that a crash cuts off is
    sent again by the agent's reconciliation, as a lost request is."""
    if here is None:
        queues.enqueue_launches(launches)
        return
    queues.enqueue_launches([launch for launch in launches if launch[0] != here.node_name])
    for _name, attempt_id, owner_id in [launch for launch in launches if launch[0] == here.node_name]:
        try:
            here.launch(attempt_id, owner_id)
        except Exception:  # the others still go; this one is sent again as above
            log.exception("could not take the launch of task attempt %s", attempt_id)
