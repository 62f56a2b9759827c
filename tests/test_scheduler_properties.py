"""Properties of the pure gang scheduler (jobs/scheduler.py) over random
clusters and queues.

A cluster: nodes with CPUs, memory, typed GPUs and port ranges, some on a
shared address (so they share one set of used ports, as in
services/scheduling.py), some of it already in use. A queue: jobs of
several task roles, gangs of 1-16 tasks, GPU types or none, fixed and free
ports, in several virtual clusters whose quotas may already be partly used
(or overused: a node was lost). Whatever `schedule` decides, nothing is
given twice, nothing is over capacity or over quota, every job is placed
whole or not at all, and a job it calls hopeless cannot fit an idle cluster.
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduler import Decision, JobRequest, NodeState, Placement, Quota, RoleRequest, schedule
from jobs.spec import PortSpec

GPU_TYPES = ["V100", "K80", "A100"]
VCS = ["default", "a", "b"]
FIXED_PORTS = range(8080, 8090)
RANGE_BASE = 20000
EPSILON = 1e-6

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -------------------------------------------------------------- generators
# Strategies are built once, here: building them inside each draw costs
# more than the scheduling itself. Half the scenarios are roomy (idle-ish
# nodes, whole quotas, jobs the cluster can serve), so that many jobs are
# placed; the other half are tight, with odd corners: quotas used up or
# overused, virtual clusters and GPU types that do not exist.

NODE_COUNTS = st.sampled_from([3, 2, 4, 1, 5])
ADDRESS_COUNTS = st.integers(1, 3)
SOME_USED_PORTS = st.sets(st.sampled_from([*FIXED_PORTS, *range(RANGE_BASE, RANGE_BASE + 40)]), max_size=4)
GPU_GROUPS = st.lists(st.tuples(st.sampled_from(GPU_TYPES), st.sampled_from([4, 8, 2, 1])), max_size=2)
# (CPUs, memory in 500 MB, GPUs as (type, count) groups, port range offset, its size - 1)
NODE_SHAPES = st.tuples(st.sampled_from([8, 16, 4, 32, 2]), st.integers(8, 64), GPU_GROUPS, st.integers(0, 30),
                        st.integers(0, 20))
USED_QUARTERS = {True: st.sampled_from([0, 1]), False: st.sampled_from([0, 1, 2, 4])}
SHARES = {True: st.just(1.0), False: st.sampled_from([1.0, 0.5, 0.25, 0.0])}
# What a virtual cluster holds already: in a tight cluster, sometimes more
# than its share (the share shrank when a node was lost).
USED_SHARES = {True: st.just(0.0), False: st.sampled_from([0.0, 0.3, 0.9, 1.2])}
PORT_LABELS = st.lists(st.sampled_from(["ssh", "main", "http", "tb", "x"]), unique=True, min_size=1, max_size=3)
BEGIN_AT = st.sampled_from([0, 0, 8080, 0, 8081, 8085, RANGE_BASE + 5, RANGE_BASE + 20])  # 0: any free port
PORT_NUMBERS = st.sampled_from([1, 2, 1, 3])
# Small gangs are the common case; some big ones make the rest wait.
TASK_NUMBERS = st.one_of(st.sampled_from([1, 2, 1, 4]), st.integers(1, 16))
# (tasks, CPUs, memory in 250 MB, GPUs, with ports?)
ROLE_SHAPES = st.tuples(TASK_NUMBERS, st.sampled_from([1, 2, 1, 4]), st.integers(1, 8),
                        st.sampled_from([0, 1, 0, 2, 4]), st.booleans())
ROLE_COUNTS = st.sampled_from([1, 2, 1, 3])
JOB_COUNTS = st.integers(1, 10)
JOB_VCS = {True: st.sampled_from(VCS), False: st.sampled_from([*VCS, "nowhere"])}
OVERTAKEN = st.integers(0, 4)
MAX_OVERTAKES = st.integers(0, 5)


@st.composite
def clusters(draw, roomy: bool) -> list[NodeState]:
    addresses = [f"10.0.0.{i}" for i in range(draw(ADDRESS_COUNTS))]
    used_ports = {address: draw(SOME_USED_PORTS) for address in addresses}
    nodes = []
    for node_id in range(1, draw(NODE_COUNTS) + 1):
        cpus, memory_halves, gpu_groups, range_offset, range_size = draw(NODE_SHAPES)
        gpus = dict(enumerate(kind for kind, count in gpu_groups for _ in range(count)))
        address = draw(st.sampled_from(addresses))
        nodes.append(NodeState(
            id=node_id, name=f"node-{node_id}", address=address, cpus=cpus, memory_mb=memory_halves * 500, gpus=gpus,
            port_start=RANGE_BASE + range_offset, port_end=RANGE_BASE + range_offset + range_size,
            used_cpus=cpus * draw(USED_QUARTERS[roomy]) // 4,
            used_memory_mb=memory_halves * 500 * draw(USED_QUARTERS[roomy]) // 4,
            used_gpus={index for index in gpus if draw(st.booleans())} if draw(st.booleans()) else set(),
            used_ports=used_ports[address],  # one set per address, shared like the real snapshot's
        ))
    return nodes


@st.composite
def quotas_for(draw, nodes: list[NodeState], roomy: bool) -> dict[str, Quota]:
    total_cpus = sum(n.cpus for n in nodes)
    total_memory = sum(n.memory_mb for n in nodes)
    total_gpus = Counter(kind for n in nodes for kind in n.gpus.values())
    result = {}
    for vc in VCS:
        share, used = draw(SHARES[roomy]), draw(USED_SHARES[roomy])
        quota = Quota(cpus=total_cpus * share, memory_mb=total_memory * share,
                      gpus={kind: count * share for kind, count in total_gpus.items()})
        quota.used_cpus, quota.used_memory_mb = quota.cpus * used, quota.memory_mb * used
        for kind, count in quota.gpus.items():
            quota.used_gpus[kind] = float(int(count * used))
        result[vc] = quota
    return result


@st.composite
def port_requests(draw) -> tuple[PortSpec, ...]:
    return tuple(PortSpec(label=label, begin_at=draw(BEGIN_AT), port_number=draw(PORT_NUMBERS))
                 for label in draw(PORT_LABELS))


@st.composite
def roles(draw, name: str) -> RoleRequest:
    task_number, cpus, memory_quarters, gpus, with_ports = draw(ROLE_SHAPES)
    return RoleRequest(name=name, task_number=task_number, cpus=cpus, memory_mb=memory_quarters * 250, gpus=gpus,
                       ports=draw(port_requests()) if with_ports else ())


@st.composite
def queues(draw, gpu_types: list[str], roomy: bool) -> list[JobRequest]:
    """Jobs asking for no GPU type or one the cluster has, or when tight
    at times for one it lacks."""
    job_gpu_types = st.sampled_from([None, *gpu_types] if roomy else [None, *gpu_types, "P100"])
    return [
        JobRequest(id=job_id, vc=draw(JOB_VCS[roomy]), gpu_type=draw(job_gpu_types),
                   roles=tuple(draw(roles(f"role{i}")) for i in range(draw(ROLE_COUNTS))),
                   overtaken=draw(OVERTAKEN))
        for job_id in range(1, draw(JOB_COUNTS) + 1)
    ]


@st.composite
def scenarios(draw) -> tuple[list[NodeState], dict[str, Quota], list[JobRequest], int]:
    roomy = draw(st.booleans())
    nodes = draw(clusters(roomy))
    gpu_types = sorted({kind for node in nodes for kind in node.gpus.values()})
    return nodes, draw(quotas_for(nodes, roomy)), draw(queues(gpu_types, roomy)), draw(MAX_OVERTAKES)


def decide(scenario) -> tuple[list[NodeState], dict[str, Quota], list[JobRequest], Decision]:
    """Schedule a copy of the scenario; the scenario stays as it was given."""
    nodes, quotas, jobs, max_overtakes = scenario
    working_nodes, working_quotas = copy.deepcopy((nodes, quotas))  # keeps nodes on one address on one set
    return working_nodes, working_quotas, jobs, schedule(jobs, working_nodes, working_quotas, max_overtakes=max_overtakes)


def placements(decision: Decision) -> list[tuple[int, Placement]]:
    return [(job_id, p) for job_id, placed in decision.placed.items() for p in placed]


# -------------------------------------------------------------- properties


@PROPERTY_SETTINGS
@given(scenarios())
def test_it_never_gives_a_gpu_twice(scenario):
    nodes = {n.id: n for n in scenario[0]}
    *_, decision = decide(scenario)
    given_out: dict[int, list[int]] = defaultdict(list)
    for _job, p in placements(decision):
        given_out[p.node_id].extend(p.gpus)
    for node_id, indices in given_out.items():
        assert len(indices) == len(set(indices)), f"node {node_id}: {sorted(indices)}"
        assert not set(indices) & nodes[node_id].used_gpus
        assert set(indices) <= set(nodes[node_id].gpus)


@PROPERTY_SETTINGS
@given(scenarios())
def test_it_never_gives_a_port_on_an_address_twice(scenario):
    nodes = {n.id: n for n in scenario[0]}
    *_, decision = decide(scenario)
    given_out: dict[str, list[int]] = defaultdict(list)
    for _job, p in placements(decision):
        given_out[nodes[p.node_id].address].extend(port for ports in p.ports.values() for port in ports)
    for address, ports in given_out.items():
        assert len(ports) == len(set(ports)), f"{address}: {sorted(ports)}"
        used_before = next(n.used_ports for n in nodes.values() if n.address == address)
        assert not set(ports) & used_before


@PROPERTY_SETTINGS
@given(scenarios())
def test_it_never_puts_a_node_over_its_cpus_or_memory(scenario):
    nodes = {n.id: n for n in scenario[0]}
    *_, decision = decide(scenario)
    cpus: Counter[int] = Counter()
    memory: Counter[int] = Counter()
    for _job, p in placements(decision):
        cpus[p.node_id] += p.cpus
        memory[p.node_id] += p.memory_mb
    for node_id, node in nodes.items():
        assert node.used_cpus + cpus[node_id] <= node.cpus
        assert node.used_memory_mb + memory[node_id] <= node.memory_mb


@PROPERTY_SETTINGS
@given(scenarios())
def test_it_places_each_job_whole_or_not_at_all(scenario):
    *_, jobs, decision = decide(scenario)
    for job in jobs:
        assert (job.id in decision.placed) != (job.id in decision.waiting), f"job {job.id}"
        if job.id not in decision.placed:
            assert decision.waiting[job.id]
            continue
        tasks = Counter((p.role, p.index) for p in decision.placed[job.id])
        assert tasks == Counter((r.name, i) for r in job.roles for i in range(r.task_number))
        by_name = {r.name: r for r in job.roles}
        for p in decision.placed[job.id]:
            role = by_name[p.role]
            assert (p.cpus, p.memory_mb, len(p.gpus)) == (role.cpus, role.memory_mb, role.gpus)
            assert sorted(p.ports) == sorted(port.label for port in role.ports)
    assert decision.never_fits <= set(decision.waiting)


@PROPERTY_SETTINGS
@given(scenarios())
def test_it_leaves_the_snapshot_holding_exactly_what_it_placed(scenario):
    # Jobs that did not fit gave back whatever they had tentatively taken.
    before, quotas_before = scenario[0], scenario[1]
    after, quotas_after, jobs, decision = decide(scenario)
    vc_of = {job.id: job.vc for job in jobs}
    for node_before, node_after in zip(before, after):
        mine = [p for _job, p in placements(decision) if p.node_id == node_before.id]
        assert node_after.used_cpus == node_before.used_cpus + sum(p.cpus for p in mine)
        assert node_after.used_memory_mb == node_before.used_memory_mb + sum(p.memory_mb for p in mine)
        assert node_after.used_gpus == node_before.used_gpus | {g for p in mine for g in p.gpus}
    for address in {n.address for n in before}:
        on_address = {n.id for n in before if n.address == address}
        ports = {port for _job, p in placements(decision) if p.node_id in on_address for ps in p.ports.values() for port in ps}
        used_before = next(n.used_ports for n in before if n.address == address)
        assert next(n.used_ports for n in after if n.address == address) == used_before | ports
    for vc, quota in quotas_after.items():
        mine = [p for job_id, p in placements(decision) if vc_of[job_id] == vc]
        assert abs(quota.used_cpus - quotas_before[vc].used_cpus - sum(p.cpus for p in mine)) < EPSILON


@PROPERTY_SETTINGS
@given(scenarios())
def test_it_never_exceeds_a_virtual_clusters_quota(scenario):
    quotas = scenario[1]
    *_, jobs, decision = decide(scenario)
    vc_of = {job.id: job.vc for job in jobs}
    for vc, quota in quotas.items():
        mine = [p for job_id, p in placements(decision) if vc_of[job_id] == vc]
        assert sum(p.cpus for p in mine) <= max(0.0, quota.cpus - quota.used_cpus) + EPSILON
        assert sum(p.memory_mb for p in mine) <= max(0.0, quota.memory_mb - quota.used_memory_mb) + EPSILON
        gpus: Counter[str] = Counter()
        for p in mine:
            gpus[p.gpu_type] += len(p.gpus)
        for kind, count in gpus.items():
            if count:
                assert count <= max(0.0, quota.free_gpus(kind)) + EPSILON, f"{vc}: {count} {kind}"
    assert not any(vc_of[job_id] not in quotas for job_id in decision.placed)


@PROPERTY_SETTINGS
@given(scenarios())
def test_it_gives_gpus_of_the_jobs_type(scenario):
    nodes = {n.id: n for n in scenario[0]}
    *_, jobs, decision = decide(scenario)
    gpu_type_of = {job.id: job.gpu_type for job in jobs}
    for job_id, p in placements(decision):
        if not p.gpus:
            assert p.gpu_type == ""
            continue
        assert {nodes[p.node_id].gpus[index] for index in p.gpus} == {p.gpu_type}
        if gpu_type_of[job_id]:
            assert p.gpu_type == gpu_type_of[job_id]


@PROPERTY_SETTINGS
@given(scenarios())
def test_it_takes_exactly_the_fixed_ports_and_free_ones_from_the_nodes_range(scenario):
    nodes = {n.id: n for n in scenario[0]}
    *_, jobs, decision = decide(scenario)
    roles_of = {job.id: {r.name: r for r in job.roles} for job in jobs}
    for job_id, p in placements(decision):
        node = nodes[p.node_id]
        for request in roles_of[job_id][p.role].ports:
            got = p.ports[request.label]
            if request.begin_at:
                assert got == list(range(request.begin_at, request.begin_at + request.port_number))
            else:
                assert len(got) == request.port_number
                assert all(node.port_start <= port <= node.port_end for port in got)


@PROPERTY_SETTINGS
@given(scenarios())
def test_a_job_it_says_can_never_fit_cannot_fit_an_idle_cluster(scenario):
    nodes, quotas, *_ = scenario
    *_, jobs, decision = decide(scenario)
    for job in jobs:
        if job.id not in decision.never_fits:
            continue
        assert decision.waiting[job.id].startswith("can never fit: ")
        idle = [NodeState(id=n.id, name=n.name, address=n.address, cpus=n.cpus, memory_mb=n.memory_mb, gpus=n.gpus,
                          port_start=n.port_start, port_end=n.port_end) for n in nodes]
        shared: dict[str, set[int]] = defaultdict(set)
        for node in idle:
            node.used_ports = shared[node.address]
        quota = quotas[job.vc]
        empty_quota = Quota(cpus=quota.cpus, memory_mb=quota.memory_mb, gpus=dict(quota.gpus))
        alone = schedule([JobRequest(job.id, job.vc, job.gpu_type, job.roles)], idle, {job.vc: empty_quota},
                         max_overtakes=0)
        assert job.id not in alone.placed, f"job {job.id} fits an idle cluster: {alone.placed[job.id]}"
