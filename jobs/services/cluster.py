"""Read-only views of the cluster for pages and the API: what each virtual
cluster and node holds, where a waiting job stands, whether a job could
ever fit. They reuse the scheduler's own snapshot, so the numbers users see
are the numbers the scheduler decides with."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.db.models import Count

from jobs import scheduler
from jobs.models import ACTIVE_TASK_STATES, GpuAllocation, Job, Node, State, TaskAttempt, VirtualCluster
from jobs.services.scheduling import job_request, node_states, quotas, ready_nodes, spec_request
from jobs.services.db_clock import database_now
from jobs.spec import JobSpec


@dataclass(frozen=True)
class Amount:
    used: float
    total: float

    @property
    def free(self) -> float:
        return max(0.0, self.total - self.used)


@dataclass(frozen=True)
class VcUsage:
    name: str
    description: str
    capacity: float  # percent of the cluster
    running_jobs: int
    waiting_jobs: int
    cpus: Amount
    memory_mb: Amount
    gpus: dict[str, Amount] = field(default_factory=dict)


def _capacity(vc: VirtualCluster, vcs: list[VirtualCluster]) -> float:
    if vc.name != VirtualCluster.DEFAULT:
        return vc.capacity
    return max(0.0, 100.0 - sum(v.capacity for v in vcs if v.name != VirtualCluster.DEFAULT))


def ready_node_states() -> list[scheduler.NodeState]:
    """The ready nodes with what their tasks hold now: one snapshot a page
    can hand to both vc_usage and config_fit."""
    return node_states(ready_nodes())


def vc_usage(*, states: list[scheduler.NodeState] | None = None) -> list[VcUsage]:
    """Every virtual cluster's quota and use, over the ready nodes (`states`:
    their snapshot when the caller has one already)."""
    if states is None:
        states = ready_node_states()
    quota = quotas(states)
    vcs = list(VirtualCluster.objects.all())
    counts: dict[tuple[str, str], int] = {
        (row["virtual_cluster__name"], row["state"]): row["n"]
        for row in Job.objects.filter(state__in=(State.RUNNING, State.STOPPING, State.WAITING))
        .values("virtual_cluster__name", "state").annotate(n=Count("id"))
    }
    result = []
    for vc in vcs:
        q = quota.get(vc.name)
        if q is None:
            continue  # made since the quotas were read: shown on the next look
        running = counts.get((vc.name, State.RUNNING), 0) + counts.get((vc.name, State.STOPPING), 0)
        result.append(VcUsage(
            name=vc.name, description=vc.description, capacity=_capacity(vc, vcs), running_jobs=running,
            waiting_jobs=counts.get((vc.name, State.WAITING), 0),
            cpus=Amount(q.used_cpus, q.cpus), memory_mb=Amount(q.used_memory_mb, q.memory_mb),
            gpus={kind: Amount(q.used_gpus.get(kind, 0.0), total) for kind, total in sorted(q.gpus.items())},
        ))
    return result


@dataclass(frozen=True)
class SkuType:
    """OpenPAI's resource unit of a SKU (hived's leaf cell): one GPU of a
    type and the CPUs and memory that come with it."""
    cpus: int
    memory_mb: int
    gpus: int = 1


def sku_types(*, vc: str | None = None) -> dict[str, SkuType] | None:
    """Each GPU type on the ready nodes, with the CPUs and memory one GPU of
    it comes with on the smallest node that has it: a task asking that much
    per GPU fits anywhere the type is. With `vc`, only the types that
    virtual cluster has a share of; None when there is no such cluster.

    A unit has at least one CPU, even on a node with more GPUs of the type
    than CPUs: a v2 task role asks for a whole CPU or more, so a unit of 0
    would make every config built from it (cpu = skuNum x unit) refused.
    On such a node fewer one-GPU tasks than GPUs fit at once."""
    if vc is not None and not VirtualCluster.objects.filter(name=vc).exists():
        return None
    states = ready_node_states()
    units: dict[str, SkuType] = {}
    for state in states:
        counts = Counter(state.gpus.values())
        for kind, count in counts.items():
            unit = SkuType(cpus=max(1, state.cpus // count), memory_mb=state.memory_mb // count)
            known = units.get(kind)
            units[kind] = unit if known is None else SkuType(
                cpus=min(known.cpus, unit.cpus), memory_mb=min(known.memory_mb, unit.memory_mb))
    if vc is None:
        return dict(sorted(units.items()))
    shared = next((usage.gpus for usage in vc_usage(states=states) if usage.name == vc), {})
    return {kind: unit for kind, unit in sorted(units.items()) if shared.get(kind, Amount(0, 0)).total > 0}


@dataclass(frozen=True)
class NodeUsage:
    node: Node
    ready: bool
    cpus: Amount
    memory_mb: Amount
    gpus: list[tuple[int, str, bool]]  # (index, type, in use)
    running_tasks: int
    heartbeat_fresh: bool  # by the database's clock, as heartbeats are stamped


def node_usage() -> list[NodeUsage]:
    now = database_now()
    ready_ids = {n.pk for n in ready_nodes(now)}
    nodes = list(Node.objects.all())
    snapshot = {s.id: s for s in node_states(nodes)}
    tasks = {
        row["node_id"]: row["n"]
        for row in TaskAttempt.objects.filter(state__in=ACTIVE_TASK_STATES).values("node_id").annotate(n=Count("id"))
    }
    used_gpus = set(GpuAllocation.objects.values_list("node_id", "index"))
    result = []
    for node in nodes:
        s = snapshot[node.pk]
        result.append(NodeUsage(
            node=node, ready=node.pk in ready_ids, cpus=Amount(s.used_cpus, s.cpus),
            memory_mb=Amount(s.used_memory_mb, s.memory_mb),
            gpus=[(int(g["index"]), g["type"], (node.pk, int(g["index"])) in used_gpus) for g in node.gpus],
            running_tasks=tasks.get(node.pk, 0), heartbeat_fresh=node.heartbeat_fresh(now),
        ))
    return result


def queue_position(job: Job) -> int | None:
    """1 for the next waiting job of its virtual cluster, and so on."""
    if job.state != State.WAITING:
        return None
    return Job.objects.filter(state=State.WAITING, virtual_cluster_id=job.virtual_cluster_id, id__lt=job.pk).count() + 1


def never_fits_reason(job: Job) -> str | None:
    """Why `job` could not run even on an idle cluster, or None."""
    states = ready_node_states()
    quota = quotas(states).get(job.virtual_cluster.name)
    if quota is None:
        return f"virtual cluster '{job.virtual_cluster.name}' does not exist"
    return _never_fits(job_request(job), states, quota)


def _never_fits(request: scheduler.JobRequest, ready: list[scheduler.NodeState],
                quota: scheduler.Quota) -> str | None:
    """`scheduler.never_fits` over the cluster as registered: a job that would
    fit once a node briefly down (no heartbeat, agent restarting) is back
    is no hopeless job, as the scheduling pass also judges (scheduler.Away).
    The registered nodes are read only when the ready ones say never."""
    never = scheduler.never_fits(request, ready, quota)
    if never is None:
        return None
    registered = node_states(list(Node.objects.filter(schedulable=True).order_by("name")))
    whole = quotas(registered).get(request.vc)
    if len(registered) == len(ready) or whole is None:
        return never
    return scheduler.never_fits(request, registered, whole)


@dataclass(frozen=True)
class ConfigFit:
    """Would a not-yet-submitted config fit? `never`: why it could not run even
    on an idle cluster; `wait`: why it could not start right now."""

    never: str | None
    wait: str | None


def config_fit(spec: JobSpec, vc_name: str, *, states: list[scheduler.NodeState] | None = None) -> ConfigFit:
    """Submit Job's panel: both answers from one snapshot of the cluster as it
    is now (jobs queued before it aside), `states` when the caller has it.
    Nothing is reserved."""
    if states is None:
        states = ready_node_states()
    quota = quotas(states).get(vc_name)  # None only when no such virtual cluster exists
    if quota is None:
        missing = f"virtual cluster '{vc_name}' does not exist"
        return ConfigFit(never=missing, wait=missing)
    request = spec_request(spec, job_id=0, vc=vc_name)
    never = _never_fits(request, states, quota)
    if never or scheduler.place_job(request, states, quota) is not None:
        return ConfigFit(never=never, wait=None)
    return ConfigFit(never=None, wait=scheduler.explain_wait(request, states, quota))
