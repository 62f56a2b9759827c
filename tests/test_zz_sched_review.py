"""Review findings on the scheduler."""

from __future__ import annotations

from jobs.scheduler import Quota, never_fits, schedule
from tests.test_scheduler import job, node, r


def test_a_gang_no_idle_cluster_can_hold_is_called_hopeless_and_blocks_nobody():
    # Two tasks of 8 GPUs each: each fits the one 8-GPU node, never both at once.
    nodes = [node(1, "big", gpus={i: "V100" for i in range(8)}),
             node(2, "s1", gpus={i: "V100" for i in range(4)}), node(3, "s2", gpus={i: "V100" for i in range(4)})]
    quotas = {"default": Quota(cpus=1e6, memory_mb=1e9, gpus={"V100": 16})}
    hopeless = job(1, r(tasks=2, gpus=8), gpu_type="V100", overtaken=3)
    assert never_fits(hopeless, nodes, quotas["default"]) is not None
    decision = schedule([hopeless, job(2, r(gpus=1))], nodes, quotas, max_overtakes=3)
    assert 1 in decision.never_fits and 2 in decision.placed
