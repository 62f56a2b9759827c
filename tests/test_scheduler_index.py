"""The scheduler's node index (jobs/scheduler.py `_NodeIndex`) finds what
looking at every node finds.

Best fit used to try every node for every task and take the best
`_fit_score`; at 1,000 nodes and thousands of tasks a pass that way took
minutes (bench/scheduler_scale.py). The index must change nothing but the
time: over the random clusters and queues of test_scheduler_properties.py,
a pass decides exactly what the same pass decides with every node looked
at (the brute-force index below: the old rule, written out).
"""

from __future__ import annotations

import copy

from hypothesis import given

from jobs import scheduler
from jobs.scheduler import NodeState, Placement, Quota, RoleRequest, _fit_score, _try_node
from tests.test_scheduler_properties import PROPERTY_SETTINGS, scenarios


class EveryNode(scheduler._NodeIndex):
    """Best fit by looking at every node, as `place_job` and `explain_wait` did."""

    def best(self, role: RoleRequest, index: int, gpu_type: str | None, quota: Quota,
             reserved: frozenset[int] = frozenset()) -> Placement | None:
        options = [(p, position) for position, node in enumerate(self.nodes)
                   if (p := _try_node(node, role, index, gpu_type, quota, reserved))]
        if not options:
            return None
        return min(options, key=lambda option: (_fit_score(self.nodes[option[1]], option[0]), option[1]))[0]

    def most_free(self, role: RoleRequest, gpu_type: str | None) -> NodeState:
        return max(self.nodes, key=lambda n: (len(n.free_gpus(gpu_type)) if role.gpus else 0, n.free_cpus,
                                              n.free_memory_mb))


def _decide(scenario, index_class, monkeypatch) -> tuple:
    nodes, quotas, jobs, max_overtakes = copy.deepcopy(scenario)
    with monkeypatch.context() as patch:
        patch.setattr(scheduler, "_NodeIndex", index_class)
        decision = scheduler.schedule(jobs, nodes, quotas, max_overtakes=max_overtakes)
    used = [(n.used_cpus, n.used_memory_mb, sorted(n.used_gpus), sorted(n.used_ports)) for n in nodes]
    return decision.placed, decision.waiting, decision.never_fits, dict(decision.overtaken), used


@PROPERTY_SETTINGS
@given(scenarios())
def test_a_pass_decides_what_looking_at_every_node_decides(scenario):
    import pytest

    monkeypatch = pytest.MonkeyPatch()
    assert _decide(scenario, scheduler._NodeIndex, monkeypatch) == _decide(scenario, EveryNode, monkeypatch)


@PROPERTY_SETTINGS
@given(scenarios())
def test_the_index_stays_filed_right_as_placements_are_taken_and_undone(scenario):
    nodes, quotas, jobs, _ = copy.deepcopy(scenario)
    index = scheduler._NodeIndex(nodes)
    for job in jobs:  # some fit and stay, some are undone half-way
        if job.vc in quotas:
            scheduler._place_job(job, index, quotas[job.vc])
    fresh = scheduler._NodeIndex(nodes)
    assert {key: level for key, level in index.levels.items() if level} == \
        {key: level for key, level in fresh.levels.items() if level}
    assert index.every == fresh.every


def test_it_names_the_first_of_equally_free_nodes_in_their_order():
    nodes = [NodeState(id=i, name=name, address=f"10.0.0.{i}", cpus=4, memory_mb=4000, gpus={0: "V100"},
                       port_start=20000, port_end=20009) for i, name in ((1, "b"), (2, "a"))]
    job = scheduler.JobRequest(id=1, vc="default", gpu_type=None,
                               roles=(RoleRequest(name="main", task_number=1, cpus=8, memory_mb=100, gpus=1),))
    quota = Quota(cpus=100, memory_mb=1e6, gpus={"V100": 10})
    assert "(b)" in scheduler.explain_wait(job, nodes, quota)
    assert EveryNode(nodes).most_free(job.roles[0], None).name == "b"
