"""Gang scheduling over a snapshot of the cluster. Pure: no Django, no I/O.

A job starts only when every task of every task role can be placed at once:
CPUs, memory, GPUs (whole devices, never shared, of the job's gpuType),
ports (beginAt 0: any free port in the node's range; otherwise exactly those
ports) and the job's virtual-cluster quota. Tasks may spread over nodes.

Order and fairness (the rule documented in the README):
  Waiting jobs are considered first come, first served. A job that does not
  fit may be overtaken by later, smaller jobs of its virtual cluster
  (backfilling), but only `max_overtakes` times. After that, its virtual
  cluster is blocked behind it: no later job of that virtual cluster starts
  until it has started, so running jobs drain and the big job gets its turn.
  A job that could never fit (bigger than any node, or than its virtual
  cluster's whole quota: `never_fits`) never blocks anyone. Nor does one
  that would fit only once nodes now away (no heartbeat, agent down) come
  back (`Away`): it is told so, not that it can never fit, and is judged
  again at every pass.

Per-user limits (an admin's, per virtual cluster): a job that would put its
owner over their running jobs or GPUs there waits, says which limit, and
is neither overtaken nor blocking: one user's limit never holds back
anyone else's jobs. It starts once enough of its owner's jobs have ended.

Placement is best fit: the node left with the fewest free GPUs, then CPUs,
then memory, so that large holes stay free for large jobs.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from dataclasses import dataclass, field, replace
from itertools import islice

from jobs.spec.language import PortSpec


@dataclass
class NodeState:
    id: int
    name: str
    address: str
    cpus: int
    memory_mb: int
    gpus: dict[int, str]
    port_start: int
    port_end: int
    used_cpus: int = 0
    used_memory_mb: int = 0
    used_gpus: set[int] = field(default_factory=set)
    # Nodes on one machine share one set: ports belong to the address.
    used_ports: set[int] = field(default_factory=set)
    # Fixed ports (beginAt > 0) a task may take outside port_start..port_end
    # (the admin's FIXED_PORTS_ALLOWED); never any other port of the node.
    fixed_ports_allowed: frozenset[int] = frozenset()

    def may_fix(self, ports: range) -> bool:
        """Whether a task may ask for exactly these ports on this node."""
        inside = self.port_start <= ports[0] and ports[-1] <= self.port_end
        return inside or all(port in self.fixed_ports_allowed for port in ports)

    @property
    def free_cpus(self) -> int:
        return self.cpus - self.used_cpus

    @property
    def free_memory_mb(self) -> int:
        return self.memory_mb - self.used_memory_mb

    def free_gpus(self, gpu_type: str | None = None) -> list[int]:
        return sorted(
            index for index, kind in self.gpus.items()
            if index not in self.used_gpus and (gpu_type is None or kind == gpu_type)
        )

    def free_gpu_types(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for index, kind in self.gpus.items():
            if index not in self.used_gpus:
                counts[kind] += 1
        return dict(counts)


@dataclass(frozen=True)
class RoleRequest:
    name: str
    task_number: int
    cpus: int
    memory_mb: int
    gpus: int
    # The spec's own port requests, plus the platform's (ssh, main) at beginAt 0.
    ports: tuple[PortSpec, ...] = ()

    def describe(self, gpu_type: str | None) -> str:
        gpu = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}" + (f" of type {gpu_type}" if gpu_type and self.gpus else "")
        return f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}, {self.memory_mb} MB memory, {gpu}"

    @property
    def fixed_ports(self) -> frozenset[int]:
        """Every port one task of this role asks for exactly."""
        return frozenset(port for p in self.ports for port in p.fixed)


@dataclass
class JobRequest:
    id: int
    vc: str
    gpu_type: str | None
    roles: tuple[RoleRequest, ...]
    overtaken: int = 0
    owner: int = 0  # the user's id: whose limits apply (see UserQuota)

    @property
    def total_gpus(self) -> int:
        return sum(role.gpus * role.task_number for role in self.roles)


@dataclass
class Quota:
    """What a virtual cluster may hold, and what it holds now."""

    cpus: float
    memory_mb: float
    gpus: dict[str, float]
    used_cpus: float = 0
    used_memory_mb: float = 0
    used_gpus: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def free_gpus(self, gpu_type: str) -> float:
        return self.gpus.get(gpu_type, 0.0) - self.used_gpus.get(gpu_type, 0.0)


@dataclass
class UserQuota:
    """What one user may hold in one virtual cluster (None: no limit), and
    holds now; jobs placed in a pass are added as they are placed."""

    max_running_jobs: int | None = None
    max_gpus: int | None = None
    running_jobs: int = 0
    used_gpus: int = 0

    def take(self, job: JobRequest) -> None:
        self.running_jobs += 1
        self.used_gpus += job.total_gpus


@dataclass(frozen=True)
class Placement:
    role: str
    index: int
    node_id: int
    gpus: tuple[int, ...]
    gpu_type: str
    ports: dict[str, list[int]]
    cpus: int
    memory_mb: int


@dataclass
class Decision:
    placed: dict[int, list[Placement]] = field(default_factory=dict)
    waiting: dict[int, str] = field(default_factory=dict)
    never_fits: set[int] = field(default_factory=set)
    overtaken: dict[int, int] = field(default_factory=lambda: defaultdict(int))


@dataclass(frozen=True)
class Away:
    """The nodes registered for new tasks but not ready now (a lost
    heartbeat, an agent restarting), and each virtual cluster's quota over
    the ready nodes and these together. A job may wait for them: one judged
    against the ready nodes alone was told it could never fit, and the job
    page told its owner to stop it, while a node was briefly down."""

    nodes: list[NodeState]
    quotas: dict[str, Quota]


_EPSILON = 1e-9


# A node as its index files it: free CPUs, free memory, name, place in the
# list it came in. Sorted, these give best fit's order after free GPUs.
_Entry = tuple[int, int, str, int]


class _NodeIndex:
    """The nodes filed by how many GPUs they have free, so that finding a
    task's best-fit node looks at a few nodes instead of every one.

    Best fit (`_fit_score`) orders nodes by the GPUs left free after the
    task (of the type it takes; of every type for a task without GPUs),
    then free CPUs, free memory, name. So the best node is in the lowest
    "level" (free GPUs) that has any node the task fits, and within a level
    the first node it fits in (free CPUs, free memory, name) order. Each
    level is a sorted list per GPU type (None: every type together), kept
    up to date as placements are taken and undone (`refile`)."""

    def __init__(self, nodes: list[NodeState]) -> None:
        self.nodes = nodes
        self.by_id = {node.id: node for node in nodes}
        self.top = max((len(node.gpus) for node in nodes), default=0)
        self.types = sorted({kind for node in nodes for kind in node.gpus.values()})
        self.levels: dict[tuple[str | None, int], list[_Entry]] = defaultdict(list)
        self.every: list[_Entry] = []  # every node, in the same order
        self._position = {id(node): position for position, node in enumerate(nodes)}
        self._filed: dict[int, tuple[_Entry, list[tuple[str | None, int]]]] = {}
        for position, node in enumerate(nodes):
            self._file(position, node)

    def _file(self, position: int, node: NodeState) -> None:
        entry = (node.free_cpus, node.free_memory_mb, node.name, position)
        free = node.free_gpu_types()
        keys = [(None, sum(free.values()))] + [(kind, free.get(kind, 0)) for kind in set(node.gpus.values())]
        for key in keys:
            insort(self.levels[key], entry)
        insort(self.every, entry)
        self._filed[position] = (entry, keys)

    def refile(self, node: NodeState) -> None:
        """After `node`'s use changed."""
        position = self._position[id(node)]
        entry, keys = self._filed.pop(position)
        for level in [self.levels[key] for key in keys] + [self.every]:
            del level[bisect_left(level, entry)]
        self._file(position, node)

    def best(self, role: RoleRequest, index: int, gpu_type: str | None, quota: Quota,
             reserved: frozenset[int] = frozenset()) -> Placement | None:
        """The placement `place_job` would pick for this task among every
        node: the same as the best `_fit_score` of `_try_node` over them.
        `reserved`: the job's fixed ports, which no port of its own "any
        free port" requests may take."""
        if quota.cpus - quota.used_cpus < role.cpus - _EPSILON or quota.memory_mb - quota.used_memory_mb < role.memory_mb - _EPSILON:
            return None  # _try_node refuses every node
        if not role.gpus:
            kinds: list[str | None] = [None]
        else:
            kinds = [kind for kind in ([gpu_type] if gpu_type else self.types)
                     if quota.free_gpus(kind) >= role.gpus - _EPSILON]
        for free in range(role.gpus, self.top + 1):
            found: tuple[_Entry, Placement] | None = None
            for kind in kinds:
                fit = self._first_fit(self.levels.get((kind, free)), role, index, gpu_type, quota, reserved)
                if fit is not None and (found is None or fit[0] < found[0]):
                    found = fit
            if found is not None:
                return found[1]
        return None

    def _first_fit(self, level: list[_Entry] | None, role: RoleRequest, index: int, gpu_type: str | None,
                   quota: Quota, reserved: frozenset[int]) -> tuple[_Entry, Placement] | None:
        if not level:
            return None
        for entry in islice(level, bisect_left(level, (role.cpus,)), None):
            if entry[1] < role.memory_mb:
                continue
            placement = _try_node(self.nodes[entry[3]], role, index, gpu_type, quota, reserved)
            if placement is not None:
                return entry, placement
        return None

    def most_free(self, role: RoleRequest, gpu_type: str | None) -> NodeState:
        """The node `max(nodes, key=(free GPUs if the role wants some, free
        CPUs, free memory))` gives: the first of them in the nodes' order."""
        level = self.every
        if role.gpus:
            for free in range(self.top, 0, -1):
                if self.levels.get((gpu_type, free)):
                    level = self.levels[gpu_type, free]
                    break
        cpus, memory = level[-1][0], level[-1][1]
        return self.nodes[min(entry[3] for entry in level[bisect_left(level, (cpus, memory)):])]


class _Ledger:
    """Tentative allocations for one job, undone if the gang does not fit."""

    def __init__(self, quota: Quota, index: _NodeIndex | None = None) -> None:
        self.quota = quota
        self.index = index
        self.entries: list[tuple[NodeState, Placement]] = []

    def take(self, node: NodeState, placement: Placement) -> None:
        node.used_cpus += placement.cpus
        node.used_memory_mb += placement.memory_mb
        node.used_gpus.update(placement.gpus)
        for ports in placement.ports.values():
            node.used_ports.update(ports)
        self.quota.used_cpus += placement.cpus
        self.quota.used_memory_mb += placement.memory_mb
        if placement.gpus:
            self.quota.used_gpus[placement.gpu_type] += len(placement.gpus)
        self.entries.append((node, placement))
        if self.index is not None:
            self.index.refile(node)

    def undo(self) -> None:
        for node, placement in reversed(self.entries):
            node.used_cpus -= placement.cpus
            node.used_memory_mb -= placement.memory_mb
            node.used_gpus.difference_update(placement.gpus)
            for ports in placement.ports.values():
                node.used_ports.difference_update(ports)
            self.quota.used_cpus -= placement.cpus
            self.quota.used_memory_mb -= placement.memory_mb
            if placement.gpus:
                self.quota.used_gpus[placement.gpu_type] -= len(placement.gpus)
            if self.index is not None:
                self.index.refile(node)
        self.entries.clear()


def _pick_ports(node: NodeState, requests: tuple[PortSpec, ...],
                reserved: frozenset[int] = frozenset()) -> dict[str, list[int]] | None:
    """Fixed ports first, then any free ones but the job's fixed ports
    (`reserved`), so that no "any port" of the job takes one it asks for
    exactly: the task's own, or another task's on this address."""
    taken = set(node.used_ports)
    chosen: dict[str, list[int]] = {}
    for request in sorted(requests, key=lambda request: not request.begin_at):
        if request.begin_at:
            fixed = request.fixed
            if not node.may_fix(fixed) or any(port in taken for port in fixed):
                return None
            wanted = list(fixed)
        else:
            wanted = []
            for port in range(node.port_start, node.port_end + 1):
                if port not in taken and port not in reserved:
                    wanted.append(port)
                    if len(wanted) == request.port_number:
                        break
            if len(wanted) < request.port_number:
                return None
        taken.update(wanted)
        chosen[request.label] = wanted
    return {request.label: chosen[request.label] for request in requests}


def _try_node(node: NodeState, role: RoleRequest, index: int, gpu_type: str | None, quota: Quota,
              reserved: frozenset[int] = frozenset()) -> Placement | None:
    if node.free_cpus < role.cpus or node.free_memory_mb < role.memory_mb:
        return None
    if quota.cpus - quota.used_cpus < role.cpus - _EPSILON or quota.memory_mb - quota.used_memory_mb < role.memory_mb - _EPSILON:
        return None
    gpus: tuple[int, ...] = ()
    chosen_type = ""
    if role.gpus:
        # Of the types this node offers, take the one with the fewest free
        # devices that still fits: keeps whole groups free for bigger asks.
        if gpu_type:
            candidates = [gpu_type]
        else:
            counts = node.free_gpu_types()
            candidates = sorted(counts, key=lambda t: (counts[t], t))
        for kind in candidates:
            free = node.free_gpus(kind)
            if len(free) >= role.gpus and quota.free_gpus(kind) >= role.gpus - _EPSILON:
                gpus, chosen_type = tuple(free[: role.gpus]), kind
                break
        else:
            return None
    ports = _pick_ports(node, role.ports, reserved)
    if ports is None:
        return None
    return Placement(role=role.name, index=index, node_id=node.id, gpus=gpus, gpu_type=chosen_type,
                     ports=ports, cpus=role.cpus, memory_mb=role.memory_mb)


def _fit_score(node: NodeState, placement: Placement) -> tuple:
    free_gpus_after = len(node.free_gpus(placement.gpu_type or None)) - len(placement.gpus) if placement.gpus else len(node.free_gpus())
    return (free_gpus_after, node.free_cpus - placement.cpus, node.free_memory_mb - placement.memory_mb, node.name)


def _hardest_first(roles: tuple[RoleRequest, ...]) -> list[RoleRequest]:
    return sorted(roles, key=lambda r: (-r.gpus, -r.cpus, -r.memory_mb))


def _orders(roles: tuple[RoleRequest, ...]) -> list[list[RoleRequest]]:
    """The orders to place a gang's roles in, each different: hardest by
    GPUs first, then by CPUs first, then by memory first. Best fit task by
    task never goes back, so one order can fill the only node another role
    fits on (2 GPUs and 1 CPU taking the one node with 8 CPUs that a
    1-GPU, 8-CPU role needs), where another order places the job."""
    orders = [_hardest_first(roles)]
    for key in (lambda r: (-r.cpus, -r.gpus, -r.memory_mb), lambda r: (-r.memory_mb, -r.gpus, -r.cpus)):
        order = sorted(roles, key=key)
        if order not in orders:
            orders.append(order)
    return orders


def _fixed_ports(job: JobRequest) -> frozenset[int]:
    return frozenset().union(*(role.fixed_ports for role in job.roles))


def place_job(job: JobRequest, nodes: list[NodeState], quota: Quota) -> list[Placement] | None:
    """Place every task of `job` or nothing; on success the allocations stay
    applied to `nodes` and `quota`. Each task goes to the node of the best
    `_fit_score` among those `_try_node` accepts."""
    return _place_job(job, _NodeIndex(nodes), quota)


def _place_job(job: JobRequest, index: _NodeIndex, quota: Quota) -> list[Placement] | None:
    reserved = _fixed_ports(job)
    for order in _orders(job.roles):
        placements, placed = _place_in_order(job, order, index, quota, reserved)
        if placements is not None:
            return placements
        if not placed:
            # Its first task fits nowhere even before any other task took a
            # thing, so it fits nowhere after them either: no order helps (the
            # common case on a full cluster, which then costs one try).
            return None
    return None


def _place_in_order(job: JobRequest, order: list[RoleRequest], index: _NodeIndex, quota: Quota,
                    reserved: frozenset[int]) -> tuple[list[Placement] | None, int]:
    """(the placements, or None if the gang does not fit; how many tasks were placed before it stopped)."""
    ledger = _Ledger(quota, index)
    placements: list[Placement] = []
    for role in order:
        for task in range(role.task_number):
            best = index.best(role, task, job.gpu_type, quota, reserved)
            if best is None:
                ledger.undo()
                return None, len(placements)
            ledger.take(index.by_id[best.node_id], best)
            placements.append(best)
    return placements, len(placements)


def _quota_words(quota: Quota, vc: str, role: RoleRequest, gpu_type: str | None) -> str:
    parts = [f"{_num(quota.cpus - quota.used_cpus)} CPUs", f"{_num(quota.memory_mb - quota.used_memory_mb)} MB memory"]
    if role.gpus:
        types = [gpu_type] if gpu_type else sorted(quota.gpus)
        gpu_parts = [f"{_num(quota.free_gpus(t))} GPUs of type {t}" for t in types] or ["no GPUs"]
        parts.append(", ".join(gpu_parts))
    return f"virtual cluster '{vc}' has {', '.join(parts)} free"


def _num(value: float) -> str:
    return str(int(value)) if abs(value - round(value)) < 1e-6 else f"{value:.1f}"


def _best_node_words(index: _NodeIndex, role: RoleRequest, gpu_type: str | None) -> str:
    """The node with the most free (GPUs if the role wants some, then CPUs,
    then memory), in words."""
    if not index.nodes:
        return "no node is ready"
    best = index.most_free(role, gpu_type)
    gpu_words = f", {len(best.free_gpus(gpu_type))} GPUs" + (f" of type {gpu_type}" if gpu_type else "") if role.gpus else ""
    return f"the most free on one node is {best.free_cpus} CPUs, {best.free_memory_mb} MB memory{gpu_words} ({best.name})"


def explain_wait(job: JobRequest, nodes: list[NodeState], quota: Quota) -> str:
    """Why `job` does not fit now, in words, for its hardest role."""
    return _explain_wait(job, _NodeIndex(nodes), quota)


def _explain_wait(job: JobRequest, index: _NodeIndex, quota: Quota) -> str:
    role = _hardest_first(job.roles)[0]
    for candidate in _hardest_first(job.roles):
        if index.best(candidate, 0, job.gpu_type, quota) is None:  # no node takes even one task
            role = candidate
            break
    count = f"{role.task_number} tasks" if role.task_number != 1 else "1 task"
    fixed = [p for p in role.ports if p.begin_at]
    port_words = ""
    if fixed:
        port_words = "; fixed ports " + ", ".join(f"{p.fixed[0]}-{p.fixed[-1]}" if p.port_number > 1 else str(p.begin_at) for p in fixed)
    return (
        f"needs {count} of role {role.name} with {role.describe(job.gpu_type)} each{port_words}; "
        f"{_best_node_words(index, role, job.gpu_type)}; {_quota_words(quota, job.vc, role, job.gpu_type)}"
    )


def never_fits(job: JobRequest, nodes: list[NodeState], quota: Quota) -> str | None:
    """A reason if `job` could not fit even on an idle cluster, else None.
    Looks only at totals and at the nodes idle, never at what is in use."""
    return _never_fits(job, nodes, quota, _IdleCluster(nodes))


class _Hopeless:
    """Whether a job can never fit, judged once per kind of request and pass:
    against the ready nodes first (which the answer usually is, and which
    _IDLE_FITS keeps across passes), then, only if that says never and
    nodes are away, against the ready and away nodes together."""

    def __init__(self, nodes: list[NodeState], away: Away | None) -> None:
        self._nodes, self._away = nodes, away
        self._idle = _IdleCluster(nodes)
        self._whole: _IdleCluster | None = None
        self._by_kind: dict[tuple, tuple[str, bool] | None] = {}

    def __call__(self, kind: tuple, job: JobRequest, quota: Quota) -> tuple[str, bool] | None:
        """None if `job` may fit the ready nodes; else why not, and whether
        it never will (False: it waits for away nodes)."""
        if kind not in self._by_kind:
            self._by_kind[kind] = self._judge(job, quota)
        return self._by_kind[kind]

    def _judge(self, job: JobRequest, quota: Quota) -> tuple[str, bool] | None:
        never = _never_fits(job, self._nodes, quota, self._idle)
        if never is None:
            return None
        away = self._away
        whole_quota = away.quotas.get(job.vc) if away is not None and away.nodes else None
        if away is None or whole_quota is None:
            return never, True
        if self._whole is None:
            self._whole = _IdleCluster(self._nodes + away.nodes)
        if _never_fits(job, self._nodes + away.nodes, whole_quota, self._whole) is not None:
            return never, True
        return (f"waiting for {_count(len(away.nodes), 'node')} not ready now to come back; without them it "
                f"cannot fit: {never.removeprefix('can never fit: ')}"), False


class _IdleCluster:
    """The nodes as they would be with no task on them (one set of used
    ports per address, as in use), built only when a question needs them.
    What they answer is kept across passes (_IDLE_FITS) for as long as the
    nodes' capacities stay the same: a queue that cannot start is looked at
    every pass, and placing each kind of job on an idle copy of a thousand
    nodes took a pass that places nothing from about 57 ms to 97 ms
    (bench/scheduler_scale.py)."""

    def __init__(self, nodes: list[NodeState]) -> None:
        self._nodes = nodes
        self._index: _NodeIndex | None = None
        self._capacities: tuple | None = None

    def capacities(self) -> tuple:
        if self._capacities is None:
            self._capacities = tuple((n.id, n.address, n.cpus, n.memory_mb, tuple(sorted(n.gpus.items())),
                                      n.port_start, n.port_end, n.fixed_ports_allowed) for n in self._nodes)
        return self._capacities

    def index(self) -> _NodeIndex:
        if self._index is None:
            ports: dict[str, set[int]] = defaultdict(set)
            self._index = _NodeIndex([replace(node, used_cpus=0, used_memory_mb=0, used_gpus=set(),
                                              used_ports=ports[node.address]) for node in self._nodes])
        return self._index

    def fits(self, job: JobRequest, quota: Quota) -> bool:
        """Whether `job` can be placed on the idle nodes within its virtual
        cluster's whole quota."""
        key = (self.capacities(), job.roles, job.gpu_type, quota.cpus, quota.memory_mb,
               tuple(sorted(quota.gpus.items())))
        found = _IDLE_FITS.get(key)
        if found is None:
            if len(_IDLE_FITS) >= _IDLE_FITS_KEPT:
                _IDLE_FITS.clear()
            found = _IDLE_FITS[key] = _fits_idle(job, self.index(), quota)
        return found


# Answers of _IdleCluster.fits, by the nodes' capacities, the request and the quota.
_IDLE_FITS: dict[tuple, bool] = {}
_IDLE_FITS_KEPT = 4096


def _fits_idle(job: JobRequest, idle: _NodeIndex, quota: Quota) -> bool:
    """Whether `job` can be placed on the idle nodes within the whole
    `quota`; leaves them idle."""
    whole = Quota(cpus=quota.cpus, memory_mb=quota.memory_mb, gpus=quota.gpus)
    placements = _place_job(job, idle, whole)
    if placements is None:
        return False
    ledger = _Ledger(whole, idle)
    ledger.entries = [(idle.by_id[p.node_id], p) for p in placements]
    ledger.undo()
    return True


def _never_fits(job: JobRequest, nodes: list[NodeState], quota: Quota, idle: _IdleCluster) -> str | None:
    """`never_fits`; `idle`: the nodes idle, looked at only if the totals
    leave the question open."""
    if not nodes:
        return None
    for role in job.roles:
        fits_somewhere = False
        for node in nodes:
            types = [job.gpu_type] if job.gpu_type else (sorted(set(node.gpus.values())) or [None])
            gpu_ok = role.gpus == 0 or any(sum(1 for t in node.gpus.values() if t == kind) >= role.gpus for kind in types)
            auto_ports = sum(p.port_number for p in role.ports if not p.begin_at)
            ports_ok = auto_ports <= node.port_end - node.port_start + 1 and all(
                node.may_fix(p.fixed) for p in role.ports if p.begin_at)
            if node.cpus >= role.cpus and node.memory_mb >= role.memory_mb and gpu_ok and ports_ok:
                fits_somewhere = True
                break
        if not fits_somewhere:
            return f"can never fit: no node has {role.describe(job.gpu_type)} for one task of role {role.name}"
    total_cpus = sum(r.cpus * r.task_number for r in job.roles)
    total_memory = sum(r.memory_mb * r.task_number for r in job.roles)
    total_gpus = sum(r.gpus * r.task_number for r in job.roles)
    if total_cpus > quota.cpus + _EPSILON:
        return f"can never fit: needs {total_cpus} CPUs but virtual cluster '{job.vc}' holds {_num(quota.cpus)}"
    if total_memory > quota.memory_mb + _EPSILON:
        return f"can never fit: needs {total_memory} MB memory but virtual cluster '{job.vc}' holds {_num(quota.memory_mb)} MB"
    gpu_quota = quota.gpus.get(job.gpu_type, 0.0) if job.gpu_type else sum(quota.gpus.values())
    if total_gpus > gpu_quota + _EPSILON:
        kind = f" of type {job.gpu_type}" if job.gpu_type else ""
        return f"can never fit: needs {total_gpus} GPUs{kind} but virtual cluster '{job.vc}' holds {_num(gpu_quota)}"
    # One task's GPUs are all of one type: a task needs that many of some type.
    most_of_a_type = max(quota.gpus.values(), default=0.0) if not job.gpu_type else gpu_quota
    for role in job.roles:
        if role.gpus > most_of_a_type + _EPSILON:
            return (f"can never fit: a task of role {role.name} needs {role.gpus} GPUs of one type but virtual "
                    f"cluster '{job.vc}' holds at most {_num(most_of_a_type)} of any type")
    ports = _ports_never_fit(job, nodes)
    if ports is not None:
        return ports
    # Each task fits some node and the totals fit, yet the gang may not: two
    # tasks of 8 GPUs and one node with 8. Waiting, it would block its
    # virtual cluster for good once overtaken enough.
    if not idle.fits(job, quota):
        return (f"can never fit: even with every node idle, its {_count(_task_count(job), 'task')} "
                f"cannot all be placed at once")
    return None


def _task_count(job: JobRequest) -> int:
    return sum(role.task_number for role in job.roles)


def _ports_never_fit(job: JobRequest, nodes: list[NodeState]) -> str | None:
    """A fixed port that more of the job's tasks ask for than the cluster has
    addresses (ports belong to an address) can never be given to them all."""
    asking: dict[int, int] = defaultdict(int)
    for role in job.roles:
        for port in role.fixed_ports:
            asking[port] += role.task_number
    addresses = len({node.address for node in nodes})
    for port, tasks in sorted(asking.items()):
        if tasks > addresses:
            return (f"can never fit: {tasks} tasks ask for port {port} but the cluster has "
                    f"{_count(addresses, 'node address')}, each with one port {port}")
    return None


def over_user_limit(job: JobRequest, quota: UserQuota | None) -> tuple[str, bool] | None:
    """Why its owner's limits hold `job` back, and whether they always will;
    None when they do not."""
    if quota is None:
        return None
    gpus, limit = job.total_gpus, quota.max_gpus
    if limit is not None and gpus > limit:
        return f"can never fit: needs {_count(gpus, 'GPU')} but your limit in virtual cluster '{job.vc}' is {limit}", True
    if quota.max_running_jobs == 0:
        return f"can never fit: your limit of running jobs in virtual cluster '{job.vc}' is 0", True
    if quota.max_running_jobs is not None and quota.running_jobs >= quota.max_running_jobs:
        return (f"you have {_count(quota.running_jobs, 'running job')} in virtual cluster '{job.vc}', your limit there; "
                "it starts when one of them ends"), False
    if limit is not None and quota.used_gpus + gpus > limit:
        return (f"your jobs hold {_count(quota.used_gpus, 'GPU')} in virtual cluster '{job.vc}' and this one needs "
                f"{gpus}; your limit there is {limit}, so it starts when enough of them end"), False
    return None


def _count(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


class _Kinds:
    """What a job asks for, as a key that is cheap to hash: (virtual
    cluster, GPU type, a number per distinct set of task roles). Hashing the
    roles themselves for every job of a long queue costs more than the rest
    of its look; jobs whose requests are one object (jobs/services/
    scheduling.py shares them among alike jobs) are hashed once. Keyed by
    the object's id, valid while the jobs of one pass hold their roles."""

    def __init__(self) -> None:
        self._by_object: dict[int, int] = {}
        self._by_value: dict[tuple[RoleRequest, ...], int] = {}

    def __call__(self, job: JobRequest) -> tuple:
        number = self._by_object.get(id(job.roles))
        if number is None:
            number = self._by_object[id(job.roles)] = self._by_value.setdefault(job.roles, len(self._by_value))
        return (job.vc, job.gpu_type, number)


def schedule(jobs: list[JobRequest], nodes: list[NodeState], quotas: dict[str, Quota],
             *, max_overtakes: int, user_quotas: dict[tuple[str, int], UserQuota] | None = None,
             away: Away | None = None) -> Decision:
    """Decide which waiting jobs start now. `jobs` must be in submission order;
    `user_quotas` are by (virtual cluster, owner), only where a limit applies;
    `away`: the registered nodes not ready now, which a job may wait for.

    Placements are applied to `nodes`, `quotas` and `user_quotas` as they are made.
    """
    user_quotas = user_quotas or {}
    decision = Decision()
    index = _NodeIndex(nodes)
    # The job that now goes first in a virtual cluster, and how often it was
    # overtaken: the real count, which may pass the maximum (the setting was
    # lowered, or several placements of one pass overtook it).
    blocked: dict[str, tuple[int, int]] = {}
    passed_over: dict[str, list[JobRequest]] = defaultdict(list)
    # Why a request does not fit, by what it asks for. Until the next
    # placement changes the nodes and quotas, a job asking for exactly the
    # same (a sweep of one config) gets the same answer, so a queue of
    # thousands of alike jobs costs one look per kind of request.
    # (reason, whether it never fits, whether it waits for away nodes)
    no_fit: dict[tuple, tuple[str, bool, bool]] = {}
    # Whether a kind can never fit looks only at totals and the idle nodes,
    # which no placement changes: once per kind and pass.
    hopeless = _Hopeless(nodes, away)
    kind_of = _Kinds()
    for job in jobs:
        quota = quotas.get(job.vc)
        if quota is None:
            decision.waiting[job.id] = f"virtual cluster '{job.vc}' does not exist"
            continue
        user_quota = user_quotas.get((job.vc, job.owner))
        held = over_user_limit(job, user_quota)
        if held is not None:  # its owner's own limit: never overtaken, blocks nobody
            reason, never = held
            decision.waiting[job.id] = reason
            if never:
                decision.never_fits.add(job.id)
            continue
        if job.vc in blocked:
            first, times = blocked[job.vc]
            decision.waiting[job.id] = (
                f"queued behind job #{first}, which was overtaken {_count(times, 'time')} and now "
                f"goes first in virtual cluster '{job.vc}'"
            )
            continue
        kind = kind_of(job)
        if kind not in no_fit:
            placements = _place_job(job, index, quota)
            if placements is not None:
                no_fit.clear()
                decision.placed[job.id] = placements
                if user_quota is not None:
                    user_quota.take(job)
                for earlier in passed_over[job.vc]:
                    decision.overtaken[earlier.id] += 1
                    times = earlier.overtaken + decision.overtaken[earlier.id]
                    if times >= max_overtakes and job.vc not in blocked:
                        blocked[job.vc] = (earlier.id, times)
                continue
            verdict = hopeless(kind, job, quota)
            if verdict is None:
                no_fit[kind] = (_explain_wait(job, index, quota), False, False)
            else:
                no_fit[kind] = (verdict[0], verdict[1], not verdict[1])
        reason, never, for_away = no_fit[kind]
        decision.waiting[job.id] = reason
        if never:
            decision.never_fits.add(job.id)
        if never or for_away:
            # Blocking the queue behind it would hold everyone for nodes
            # that may not come back; it is judged again next pass.
            continue
        passed_over[job.vc].append(job)
        if job.overtaken >= max_overtakes:
            blocked[job.vc] = (job.id, job.overtaken)
    return decision
