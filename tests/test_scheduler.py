"""The pure scheduling rules and completion rules, on hand-made snapshots."""

from __future__ import annotations

import json

from jobs.completion import Outcome, TaskResult, judge
from jobs.scheduler import Away, JobRequest, NodeState, Quota, RoleRequest, UserQuota, never_fits, schedule
from jobs.spec import PortSpec, parse_job_config


def node(node_id: int, name: str, *, cpus: int = 8, memory: int = 32000, gpus: dict | None = None,
         address: str | None = None, ports: tuple[int, int] = (20000, 20009), used_ports: set | None = None) -> NodeState:
    return NodeState(id=node_id, name=name, address=address or f"10.0.0.{node_id}", cpus=cpus, memory_mb=memory,
                     gpus=gpus or {}, port_start=ports[0], port_end=ports[1],
                     used_ports=used_ports if used_ports is not None else set())


def job(job_id: int, *roles: RoleRequest, vc: str = "default", gpu_type: str | None = None, overtaken: int = 0,
        owner: int = 0) -> JobRequest:
    return JobRequest(id=job_id, vc=vc, gpu_type=gpu_type, roles=roles, overtaken=overtaken, owner=owner)


def r(tasks: int = 1, cpus: int = 1, memory: int = 1000, gpus: int = 0, ports: tuple = (), name: str = "main") -> RoleRequest:
    return RoleRequest(name=name, task_number=tasks, cpus=cpus, memory_mb=memory, gpus=gpus, ports=ports)


def big_quota() -> dict[str, Quota]:
    return {"default": Quota(cpus=1e6, memory_mb=1e9, gpus={"V100": 1e6, "K80": 1e6})}


def test_it_places_all_tasks_or_none():
    nodes = [node(1, "a", cpus=4), node(2, "b", cpus=4), node(3, "c", cpus=4)]
    nodes[2].used_cpus = 4
    decision = schedule([job(1, r(tasks=3, cpus=3))], nodes, big_quota(), max_overtakes=3)
    assert 1 not in decision.placed
    assert nodes[0].used_cpus == 0 and nodes[1].used_cpus == 0 and nodes[2].used_cpus == 4
    assert "needs 3 tasks of role main" in decision.waiting[1]


def test_it_spreads_a_gang_over_nodes_when_it_must():
    nodes = [node(1, "a", cpus=4), node(2, "b", cpus=4)]
    decision = schedule([job(1, r(tasks=2, cpus=3))], nodes, big_quota(), max_overtakes=3)
    assert {p.node_id for p in decision.placed[1]} == {1, 2}


def test_it_gives_whole_gpus_of_the_asked_type_and_never_shares_them():
    nodes = [node(1, "a", gpus={0: "K80", 1: "V100", 2: "V100", 3: "V100"})]
    decision = schedule([job(1, r(gpus=2), gpu_type="V100"), job(2, r(gpus=2), gpu_type="V100")], nodes,
                        big_quota(), max_overtakes=3)
    assert decision.placed[1][0].gpus == (1, 2)
    assert 2 not in decision.placed
    assert "2 GPUs of type V100" in decision.waiting[2]


def test_it_packs_gpu_tasks_to_keep_big_holes_free():
    nodes = [node(1, "a", gpus={0: "V100", 1: "V100"}), node(2, "b", gpus={i: "V100" for i in range(8)})]
    decision = schedule([job(1, r(gpus=1))], nodes, big_quota(), max_overtakes=3)
    assert decision.placed[1][0].node_id == 1


def test_it_takes_exact_ports_or_free_ones_from_the_range():
    nodes = [node(1, "a", used_ports={20000})]
    ports = (PortSpec("http", 0, 2), PortSpec("fixed", 20005, 1))
    decision = schedule([job(1, r(ports=ports)), job(2, r(ports=(PortSpec("fixed", 20005, 1),)))], nodes,
                        big_quota(), max_overtakes=3)
    assert decision.placed[1][0].ports == {"http": [20001, 20002], "fixed": [20005]}
    assert 2 not in decision.placed and "fixed ports 20005" in decision.waiting[2]


def test_two_nodes_on_one_address_never_hand_out_one_port_twice():
    shared: set[int] = set()
    nodes = [node(1, "a", address="127.0.0.1", used_ports=shared), node(2, "b", address="127.0.0.1", used_ports=shared)]
    decision = schedule([job(1, r(tasks=2, cpus=6, ports=(PortSpec("fixed", 20005, 1),)))], nodes, big_quota(),
                        max_overtakes=3)
    assert 1 not in decision.placed  # both tasks want 127.0.0.1:20005


def test_it_respects_the_virtual_cluster_quota():
    quotas = {"default": Quota(cpus=100, memory_mb=1e6, gpus={}), "small": Quota(cpus=2, memory_mb=1e6, gpus={"V100": 1})}
    nodes = [node(1, "a", cpus=16, gpus={0: "V100", 1: "V100"})]
    decision = schedule([job(1, r(cpus=2), vc="small"), job(2, r(cpus=1), vc="small"), job(3, r(gpus=2), vc="small")],
                        nodes, quotas, max_overtakes=3)
    assert 1 in decision.placed and 2 not in decision.placed
    assert "virtual cluster 'small' has 0 CPUs" in decision.waiting[2]
    assert decision.waiting[3].startswith("can never fit: needs 2 GPUs but virtual cluster 'small' holds 1")


def test_it_says_when_a_job_can_never_fit():
    decision = schedule([job(1, r(cpus=64))], [node(1, "a", cpus=8)], big_quota(), max_overtakes=3)
    assert decision.waiting[1].startswith("can never fit: no node has 64 CPUs")
    assert 1 in decision.never_fits


def test_it_lets_small_jobs_overtake_a_big_one_only_a_few_times():
    nodes = [node(1, "a", cpus=4)]
    nodes[0].used_cpus = 2  # something else runs
    jobs = [job(1, r(cpus=4))] + [job(i, r(cpus=1)) for i in range(2, 8)]
    decision = schedule(jobs, nodes, big_quota(), max_overtakes=1)
    # One small job may pass the big one; then the queue waits behind it.
    assert sorted(decision.placed) == [2]
    assert decision.overtaken[1] == 1
    assert "queued behind job #1" in decision.waiting[3]


def test_a_job_overtaken_enough_blocks_its_virtual_cluster_only():
    nodes = [node(1, "a", cpus=4)]
    quotas = {"default": Quota(cpus=4, memory_mb=1e9, gpus={}), "other": Quota(cpus=4, memory_mb=1e9, gpus={})}
    nodes[0].used_cpus = 2
    decision = schedule([job(1, r(cpus=4), overtaken=3), job(2, r(cpus=1)), job(3, r(cpus=1), vc="other")],
                        nodes, quotas, max_overtakes=3)
    assert 2 not in decision.placed and 3 in decision.placed


def test_a_job_that_can_never_fit_blocks_nobody():
    decision = schedule([job(1, r(cpus=64), overtaken=99), job(2, r(cpus=1))], [node(1, "a", cpus=8)], big_quota(),
                        max_overtakes=0)
    assert 2 in decision.placed


# ------------------------------------------------------------- per-user limits

ALICE, BOB = 1, 2


def test_it_holds_a_job_over_its_owners_running_limit_and_says_so():
    limits = {("default", ALICE): UserQuota(max_running_jobs=2, running_jobs=2)}
    decision = schedule([job(1, r(), owner=ALICE), job(2, r(), owner=BOB)], [node(1, "a")], big_quota(),
                        max_overtakes=3, user_quotas=limits)
    assert 1 not in decision.placed and 2 in decision.placed
    assert decision.waiting[1] == ("you have 2 running jobs in virtual cluster 'default', your limit there; "
                                   "it starts when one of them ends")
    assert 1 not in decision.never_fits


def test_it_counts_the_jobs_it_places_in_the_same_pass_against_the_limit():
    limits = {("default", ALICE): UserQuota(max_running_jobs=2, max_gpus=3)}
    jobs = [job(i, r(gpus=1), owner=ALICE) for i in range(1, 5)]
    decision = schedule(jobs, [node(1, "a", gpus={i: "V100" for i in range(8)})], big_quota(), max_overtakes=3,
                        user_quotas=limits)
    assert sorted(decision.placed) == [1, 2]
    assert "you have 2 running jobs" in decision.waiting[3]
    assert (limits["default", ALICE].running_jobs, limits["default", ALICE].used_gpus) == (2, 2)


def test_it_holds_a_job_that_would_take_its_owner_over_the_gpu_limit():
    limits = {("default", ALICE): UserQuota(max_gpus=4, used_gpus=3)}
    nodes = [node(1, "a", gpus={i: "V100" for i in range(8)})]
    decision = schedule([job(1, r(gpus=2), owner=ALICE), job(2, r(gpus=1), owner=ALICE)], nodes, big_quota(),
                        max_overtakes=3, user_quotas=limits)
    assert 1 not in decision.placed and 2 in decision.placed  # the smaller one fits under the limit
    assert decision.waiting[1] == ("your jobs hold 3 GPUs in virtual cluster 'default' and this one needs 2; "
                                   "your limit there is 4, so it starts when enough of them end")


def test_a_job_needing_more_gpus_than_its_owners_limit_can_never_fit():
    limits = {("default", ALICE): UserQuota(max_gpus=4)}
    decision = schedule([job(1, r(tasks=2, gpus=4), owner=ALICE)], [node(1, "a", gpus={i: "V100" for i in range(8)})],
                        big_quota(), max_overtakes=3, user_quotas=limits)
    assert decision.waiting[1] == "can never fit: needs 8 GPUs but your limit in virtual cluster 'default' is 4"
    assert 1 in decision.never_fits


def test_a_job_held_by_its_owners_limit_is_never_overtaken_and_blocks_nobody():
    # Alice's job waited long (overtaken often) and now her own limit holds
    # it: Bob's later jobs start, and it is not counted as overtaken again.
    limits = {("default", ALICE): UserQuota(max_running_jobs=1, running_jobs=1)}
    jobs = [job(1, r(), owner=ALICE, overtaken=5), job(2, r(), owner=BOB), job(3, r(), owner=BOB)]
    decision = schedule(jobs, [node(1, "a")], big_quota(), max_overtakes=3, user_quotas=limits)
    assert sorted(decision.placed) == [2, 3]
    assert 1 not in decision.overtaken


def test_a_users_limit_applies_only_in_its_virtual_cluster():
    quotas = {"default": Quota(cpus=100, memory_mb=1e9, gpus={}), "other": Quota(cpus=100, memory_mb=1e9, gpus={})}
    limits = {("default", ALICE): UserQuota(max_running_jobs=0)}
    decision = schedule([job(1, r(), owner=ALICE), job(2, r(), vc="other", owner=ALICE)], [node(1, "a")], quotas,
                        max_overtakes=3, user_quotas=limits)
    assert 1 not in decision.placed and 2 in decision.placed


# ------------------------------------------------------------- completion


def spec_of(*roles: dict, **top):
    config = {"jobName": "j", "image": "i", "taskRoles": list(roles), **top}
    return parse_job_config(json.dumps(config), user_name="u", default_fs_uri="file://").spec


def role_cfg(name: str, tasks: int, **extra) -> dict:
    return {"name": name, "taskNumber": tasks, "cpuNumber": 1, "memoryMB": 100, "gpuNumber": 0, "command": "x", **extra}


def results(*states: tuple[str, int, str | None]) -> list[TaskResult]:
    return [TaskResult(role, index, state, "why") for role, index, state in states]


def test_the_first_failed_task_fails_the_job_by_default():
    spec = spec_of(role_cfg("w", 2))
    verdict = judge(spec, results(("w", 0, "FAILED"), ("w", 1, None)))
    assert verdict.outcome == Outcome.FAILED and verdict.deciding.index == 0


def test_a_null_min_failed_task_count_never_fails_the_job():
    spec = spec_of(role_cfg("w", 2, minFailedTaskCount=None))
    assert judge(spec, results(("w", 0, "FAILED"), ("w", 1, None))) is None
    verdict = judge(spec, results(("w", 0, "FAILED"), ("w", 1, "SUCCEEDED")))
    assert verdict.outcome == Outcome.SUCCEEDED and "minFailedTaskCount is null" in verdict.reason


def test_the_reason_names_each_role_s_own_rule_for_the_failures_it_kept():
    spec = spec_of(role_cfg("w", 2, minFailedTaskCount=2))
    verdict = judge(spec, results(("w", 0, "FAILED"), ("w", 1, "SUCCEEDED")))
    assert verdict.outcome == Outcome.SUCCEEDED
    assert verdict.reason == ("all tasks completed; 1 task failed (w-0) without failing the job because "
                              "1 failure of role w stayed below its minFailedTaskCount (2)")
    spec = spec_of(role_cfg("ps", 1, minFailedTaskCount=None), role_cfg("w", 3, minFailedTaskCount=3))
    verdict = judge(spec, results(("ps", 0, "FAILED"), ("w", 0, "FAILED"), ("w", 1, "FAILED"), ("w", 2, "SUCCEEDED")))
    assert verdict.reason == ("all tasks completed; 3 tasks failed (ps-0, w-0, w-1) without failing the job because "
                              "role ps's minFailedTaskCount is null; "
                              "2 failures of role w stayed below its minFailedTaskCount (3)")


def test_min_failed_task_count_waits_for_that_many_failures():
    spec = spec_of(role_cfg("w", 3, minFailedTaskCount=2))
    assert judge(spec, results(("w", 0, "FAILED"), ("w", 1, None), ("w", 2, None))) is None
    assert judge(spec, results(("w", 0, "FAILED"), ("w", 1, "FAILED"), ("w", 2, None))).outcome == Outcome.FAILED


def test_min_succeeded_task_count_succeeds_early():
    spec = spec_of(role_cfg("ps", 1), role_cfg("w", 2, minSucceededTaskCount=2))
    verdict = judge(spec, results(("ps", 0, None), ("w", 0, "SUCCEEDED"), ("w", 1, "SUCCEEDED")))
    assert verdict.outcome == Outcome.SUCCEEDED


def test_kill_all_on_completed_task_number_ends_the_job():
    spec = spec_of(role_cfg("ps", 2), role_cfg("w", 2), killAllOnCompletedTaskNumber=2)
    assert judge(spec, results(("ps", 0, None), ("ps", 1, None), ("w", 0, "SUCCEEDED"), ("w", 1, None))) is None
    verdict = judge(spec, results(("ps", 0, None), ("ps", 1, None), ("w", 0, "SUCCEEDED"), ("w", 1, "SUCCEEDED")))
    assert verdict.outcome == Outcome.SUCCEEDED


def test_all_tasks_succeeding_succeeds_the_job():
    spec = spec_of(role_cfg("w", 2))
    assert judge(spec, results(("w", 0, "SUCCEEDED"), ("w", 1, None))) is None
    assert judge(spec, results(("w", 0, "SUCCEEDED"), ("w", 1, "SUCCEEDED"))).reason == "all tasks succeeded"


def test_it_answers_alike_jobs_alike_until_a_placement_changes_the_cluster():
    # A sweep: many jobs asking for the same. Two fit; the rest wait with the
    # same reason, and a different, smaller request later in the queue is
    # still looked at on its own (backfilled).
    nodes = [node(1, "a", cpus=4)]
    sweep = [job(i, r(cpus=2)) for i in range(1, 6)]
    small = job(6, r(cpus=1, memory=10))
    decision = schedule([*sweep, small], nodes, big_quota(), max_overtakes=10)
    assert sorted(decision.placed) == [1, 2]
    assert decision.waiting[3] == decision.waiting[4] == decision.waiting[5]
    assert "needs 1 task of role main with 2 CPUs" in decision.waiting[3]
    assert 6 not in decision.placed  # the node is full: 4 CPUs taken
    nodes = [node(1, "a", cpus=5)]
    decision = schedule([*sweep, small], nodes, big_quota(), max_overtakes=10)
    assert sorted(decision.placed) == [1, 2, 6]
    assert decision.overtaken == {3: 1, 4: 1, 5: 1}


def test_it_blocks_behind_an_alike_job_overtaken_too_often():
    # Job 2 was overtaken three times: it and its alike job 1 wait with the
    # same reason, and no later job of the virtual cluster may start.
    nodes = [node(1, "a", cpus=4)]
    waiting = [job(1, r(cpus=3)), job(2, r(cpus=3), overtaken=3), job(3, r(cpus=1))]
    nodes[0].used_cpus = 2
    decision = schedule(waiting, nodes, big_quota(), max_overtakes=3)
    assert decision.placed == {}
    assert decision.waiting[1] == decision.waiting[2]
    assert "queued behind job #2" in decision.waiting[3]


PLATFORM_PORTS = (PortSpec("ssh", 0, 1), PortSpec("main", 0, 1))  # what scheduling adds to every role


def test_a_gang_one_order_of_its_roles_cannot_place_is_placed_in_another():
    """Best fit by GPUs first puts role a (2 GPUs, 1 CPU) on n1, the one node
    with the 8 CPUs role b needs; CPUs first places both."""
    nodes = [node(1, "n1", cpus=8, gpus={0: "V100", 1: "V100"}),
             node(2, "n2", cpus=1, gpus={0: "V100", 1: "V100", 2: "V100"})]
    gang = job(1, r(name="a", gpus=2, cpus=1), r(name="b", gpus=1, cpus=8), gpu_type="V100", overtaken=3)
    decision = schedule([gang, job(2, r(cpus=1))], nodes, big_quota(), max_overtakes=3)
    assert {p.role: p.node_id for p in decision.placed[1]} == {"a": 2, "b": 1}
    assert sum(n.used_cpus for n in nodes) == 9 and 2 not in decision.placed  # no CPU left for job 2


def test_no_any_port_request_takes_a_port_the_job_asks_for_exactly():
    ports = (PortSpec("http", 0, 1), PortSpec("fixed", 20000, 1)) + PLATFORM_PORTS
    decision = schedule([job(1, r(ports=ports))], [node(1, "a")], big_quota(), max_overtakes=3)
    placed = decision.placed[1][0].ports
    assert placed["fixed"] == [20000] and 20000 not in placed["http"] + placed["ssh"] + placed["main"]
    assert list(placed) == ["http", "fixed", "ssh", "main"]  # in the order the role lists them
    # Across roles on one address: the GPU role goes first, and its platform ports leave 20000 alone.
    worker = r(name="worker", gpus=1, ports=PLATFORM_PORTS)
    server = r(name="server", ports=(PortSpec("http", 20000, 1),) + PLATFORM_PORTS)
    decision = schedule([job(2, worker, server)], [node(2, "b", gpus={0: "V100"})], big_quota(), max_overtakes=3)
    assert {p.role: p.ports.get("http") for p in decision.placed[2]} == {"worker": None, "server": [20000]}


def test_a_task_needing_more_gpus_of_one_type_than_its_vc_holds_of_any_never_blocks():
    nodes = [node(1, "a", gpus={0: "K80", 1: "K80"}), node(2, "b", gpus={0: "V100", 1: "V100"})]
    quotas = {"half": Quota(cpus=8, memory_mb=32000, gpus={"K80": 1, "V100": 1})}
    decision = schedule([job(1, r(gpus=2), vc="half", overtaken=3), job(2, r(gpus=1), vc="half")], nodes, quotas,
                        max_overtakes=3)
    assert 1 in decision.never_fits and "2 GPUs of one type" in decision.waiting[1]
    assert 2 in decision.placed


def test_a_gang_no_idle_cluster_can_hold_at_once_never_blocks():
    # Two tasks of 8 GPUs each: each fits the one 8-GPU node, never both at once.
    nodes = [node(1, "big", gpus={i: "V100" for i in range(8)}),
             node(2, "s1", gpus={i: "V100" for i in range(4)}), node(3, "s2", gpus={i: "V100" for i in range(4)})]
    quotas = {"default": Quota(cpus=1e6, memory_mb=1e9, gpus={"V100": 16})}
    hopeless = job(1, r(tasks=2, gpus=8), gpu_type="V100", overtaken=3)
    assert "even with every node idle" in never_fits(hopeless, nodes, quotas["default"])
    decision = schedule([hopeless, job(2, r(gpus=1))], nodes, quotas, max_overtakes=3)
    assert 1 in decision.never_fits and 2 in decision.placed


def test_a_fixed_port_more_tasks_ask_for_than_there_are_addresses_never_blocks():
    hopeless = job(1, r(tasks=2, ports=(PortSpec("fixed", 20005, 1),) + PLATFORM_PORTS), overtaken=3)
    decision = schedule([hopeless, job(2, r(ports=PLATFORM_PORTS))], [node(1, "a")], big_quota(), max_overtakes=3)
    assert 1 in decision.never_fits and "2 tasks ask for port 20005" in decision.waiting[1]
    assert 2 in decision.placed
    # Two addresses: it fits.
    decision = schedule([job(3, r(tasks=2, ports=(PortSpec("fixed", 20005, 1),)))], [node(1, "a"), node(2, "b")],
                        big_quota(), max_overtakes=3)
    assert 3 in decision.placed


def test_a_running_job_limit_of_zero_can_never_be_met():
    decision = schedule([job(1, r(), owner=7)], [node(1, "a")], big_quota(), max_overtakes=3,
                        user_quotas={("default", 7): UserQuota(max_running_jobs=0)})
    assert 1 in decision.never_fits and "limit of running jobs" in decision.waiting[1]


def test_the_queued_behind_message_gives_the_real_overtaken_count():
    # The maximum was lowered to 3 after job 1 had been overtaken 7 times:
    # the queue is told 7, not the setting.
    nodes = [node(1, "a", cpus=4)]
    nodes[0].used_cpus = 2
    decision = schedule([job(1, r(cpus=4), overtaken=7), job(2, r(cpus=1))], nodes, big_quota(), max_overtakes=3)
    assert "queued behind job #1, which was overtaken 7 times" in decision.waiting[2]


def test_the_queued_behind_message_counts_the_overtakes_of_this_pass():
    nodes = [node(1, "a", cpus=4)]
    nodes[0].used_cpus = 2
    jobs = [job(1, r(cpus=4), overtaken=0)] + [job(i, r(cpus=1)) for i in range(2, 5)]
    decision = schedule(jobs, nodes, big_quota(), max_overtakes=1)
    assert "queued behind job #1, which was overtaken 1 time and" in decision.waiting[3]


def test_a_job_that_fits_only_a_node_now_away_waits_for_it_and_is_not_hopeless():
    # The 8-GPU node lost its heartbeat for a moment: judged on the ready
    # node alone the job "can never fit", and its page told its owner to stop it.
    ready, away = node(1, "a", gpus={i: "V100" for i in range(2)}), node(2, "b", gpus={i: "V100" for i in range(8)})
    whole = {"default": Quota(cpus=16, memory_mb=64000, gpus={"V100": 10})}
    quotas = {"default": Quota(cpus=8, memory_mb=32000, gpus={"V100": 2})}
    decision = schedule([job(1, r(gpus=8), overtaken=9), job(2, r(gpus=1))], [ready], quotas, max_overtakes=3,
                        away=Away(nodes=[away], quotas=whole))
    assert 1 not in decision.never_fits
    assert decision.waiting[1].startswith("waiting for 1 node not ready now to come back; without them it cannot fit: ")
    assert "can never fit" not in decision.waiting[1]
    # It blocks nobody meanwhile (the node may not come back) and is not counted as overtaken.
    assert 2 in decision.placed and 1 not in decision.overtaken


def test_a_job_that_fits_no_node_ready_or_away_can_never_fit():
    ready, away = node(1, "a", cpus=8), node(2, "b", cpus=8)
    whole = {"default": Quota(cpus=16, memory_mb=64000, gpus={})}
    decision = schedule([job(1, r(cpus=64))], [ready], big_quota(), max_overtakes=3,
                        away=Away(nodes=[away], quotas=whole))
    assert 1 in decision.never_fits and decision.waiting[1].startswith("can never fit: no node has")


def test_a_quota_that_holds_the_job_only_with_the_away_nodes_is_waited_for():
    ready, away = node(1, "a", cpus=8), node(2, "b", cpus=8)
    quotas = {"default": Quota(cpus=8, memory_mb=32000, gpus={})}
    whole = {"default": Quota(cpus=16, memory_mb=64000, gpus={})}
    request = job(1, r(tasks=2, cpus=6))
    assert never_fits(request, [ready], quotas["default"]).startswith("can never fit")
    decision = schedule([request], [ready], quotas, max_overtakes=3, away=Away(nodes=[away], quotas=whole))
    assert 1 not in decision.never_fits and "without them it cannot fit: needs 12 CPUs" in decision.waiting[1]
