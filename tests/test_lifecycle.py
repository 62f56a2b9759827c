"""How a task's exit is classified, and what it does to its job: the verdict,
the tasks stopped because the job ended, and retries.

Unit tests of the seams first (`_classify` on unsaved attempts, the pure
`judge`), then the same rules end to end through the real services and the
test database: a node row of the test's own, served by no agent, and the
test playing the agent (`attempt_claim_launch`, `attempt_mark_running`,
`attempt_record_exit`), so every exit is exactly the one the test reports.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs import services
from jobs.completion import Outcome, TaskResult, judge
from jobs.models import (
    ACTIVE_TASK_STATES,
    ExitType,
    GpuAllocation,
    Job,
    JobAttempt,
    Node,
    PortAllocation,
    State,
    TaskAttempt,
    TaskState,
)
from jobs.services import lifecycle, nodes, scheduling
from jobs.services.lifecycle import ContainerExit, _classify
from jobs.spec import parse_job_config
from tests.cluster import wait_for
from tests.helpers import config, role, submit

# ------------------------------------------------------- classifying one exit


def classify(result: ContainerExit, *, stop_reason: str = "", memory_mb: int = 512) -> tuple[str, str, str]:
    return _classify(TaskAttempt(stop_reason=stop_reason), result, memory_mb)


def test_it_calls_exit_code_zero_succeeded():
    assert classify(ContainerExit(0)) == (TaskState.SUCCEEDED, ExitType.SUCCEEDED, "exited with code 0")


@pytest.mark.parametrize("code", [1, 3, 127, 137, 255])
def test_it_calls_a_non_zero_exit_the_users_with_its_code(code):
    assert classify(ContainerExit(code)) == (TaskState.FAILED, ExitType.USER_EXIT,
                                              f"the command exited with code {code}")


def test_it_calls_an_oom_kill_by_name_with_the_memory_limit_in_words():
    assert classify(ContainerExit(137, oom_killed=True), memory_mb=768) == (
        TaskState.FAILED, ExitType.OOM, "killed for exceeding its memory limit (768 MB)")


@pytest.mark.parametrize("exit_type", [ExitType.IMAGE_PULL, ExitType.NODE_LOST, ExitType.PLATFORM])
def test_it_keeps_a_platform_exit_type_and_its_message(exit_type):
    # Whatever the code and the memory: the platform said what happened.
    result = ContainerExit(137, oom_killed=True, exit_type=exit_type, error="what the platform saw")
    assert classify(result) == (TaskState.FAILED, exit_type, "what the platform saw")
    assert classify(ContainerExit(None, exit_type=exit_type)) == (TaskState.FAILED, exit_type, exit_type.label)


@pytest.mark.parametrize("stop_reason", [ExitType.USER_STOP, ExitType.COMPLETED])
@pytest.mark.parametrize("result", [ContainerExit(137), ContainerExit(1), ContainerExit(None),
                                    ContainerExit(137, oom_killed=True), ContainerExit(143, error="engine said no")],
                         ids=["sigkill", "code-1", "no-code", "oom", "engine-error"])
def test_it_calls_a_task_the_platform_was_stopping_stopped_whatever_its_exit(stop_reason, result):
    assert classify(result, stop_reason=stop_reason) == (TaskState.STOPPED, stop_reason, stop_reason.label)


def test_it_calls_a_task_that_finished_before_its_stop_took_effect_succeeded():
    assert classify(ContainerExit(0), stop_reason=ExitType.USER_STOP)[:2] == (TaskState.SUCCEEDED, ExitType.SUCCEEDED)


@pytest.mark.parametrize("code", [None, 125])
def test_it_calls_engine_error_text_a_platform_error(code):
    result = ContainerExit(code, error="OCI runtime create failed: no such file")
    assert classify(result) == (TaskState.FAILED, ExitType.PLATFORM,
                                "platform error: OCI runtime create failed: no such file")


# ------------------------------------------------------- the pure verdict


def spec_of(*roles: dict, **top):
    text = json.dumps({"jobName": "j", "image": "i", "taskRoles": list(roles), **top})
    return parse_job_config(text, user_name="u", default_fs_uri="file://").spec


def results(*states: tuple[str, int, str | None]) -> list[TaskResult]:
    return [TaskResult(name, index, state, f"{name}-{index} said so") for name, index, state in states]


def test_judge_checks_failure_before_success():
    spec = spec_of(role("w", tasks=2, minSucceededTaskCount=1))
    verdict = judge(spec, results(("w", 0, "SUCCEEDED"), ("w", 1, "FAILED")))
    assert verdict.outcome == Outcome.FAILED
    assert verdict.deciding == TaskResult("w", 1, "FAILED", "w-1 said so")
    assert verdict.reason == "task w-1 failed: w-1 said so"


def test_judge_names_the_count_and_the_first_failure_when_several_are_needed():
    spec = spec_of(role("w", tasks=4, minFailedTaskCount=3))
    assert judge(spec, results(("w", 0, None), ("w", 1, "FAILED"), ("w", 2, "FAILED"), ("w", 3, None))) is None
    verdict = judge(spec, results(("w", 0, "FAILED"), ("w", 1, "FAILED"), ("w", 2, "FAILED"), ("w", 3, None)))
    assert verdict.outcome == Outcome.FAILED and verdict.deciding.index == 0
    assert verdict.reason == "3 tasks of role w failed (minFailedTaskCount is 3); first: w-0: w-0 said so"


def test_judge_counts_only_the_role_that_sets_min_succeeded_task_count():
    spec = spec_of(role("ps", tasks=2), role("w", tasks=2, minSucceededTaskCount=2))
    assert judge(spec, results(("ps", 0, "SUCCEEDED"), ("ps", 1, "SUCCEEDED"), ("w", 0, "SUCCEEDED"), ("w", 1, None))) is None
    last = TaskResult("w", 1, "SUCCEEDED")
    verdict = judge(spec, results(("ps", 0, None), ("ps", 1, None), ("w", 0, "SUCCEEDED"), ("w", 1, "SUCCEEDED")),
                    last=last)
    assert verdict == judge(spec, results(("w", 1, "SUCCEEDED"), ("w", 0, "SUCCEEDED")), last=last)
    assert verdict.reason == "2 tasks of role w succeeded (minSucceededTaskCount is 2)"


def test_judge_counts_failed_tasks_as_completed_for_kill_all_but_not_stopped_ones():
    spec = spec_of(role("w", tasks=4, minFailedTaskCount=None), killAllOnCompletedTaskNumber=2)
    assert judge(spec, results(("w", 0, "STOPPED"), ("w", 1, "FAILED"), ("w", 2, None), ("w", 3, None))) is None
    verdict = judge(spec, results(("w", 0, "STOPPED"), ("w", 1, "FAILED"), ("w", 2, "SUCCEEDED"), ("w", 3, None)))
    assert verdict.outcome == Outcome.SUCCEEDED
    assert verdict.reason == "2 tasks completed (killAllOnCompletedTaskNumber is 2)"


def test_judge_waits_for_tasks_it_has_not_heard_of():
    spec = spec_of(role("w", tasks=3))
    assert judge(spec, results(("w", 0, "SUCCEEDED"), ("w", 1, "SUCCEEDED"))) is None


# ------------------------------------------------- end to end, through the services


@pytest.fixture
def node(make_user, redis_server) -> Iterator[Node]:
    """A node of the test's own, with GPUs of a type no other node has: the
    test's jobs ask for that type, so they land here and nowhere else. Its
    heartbeat is set an hour ahead so that it stays ready, and is never
    declared lost, however slowly the test runs. (Depends on make_user so
    that it is torn down first: its tasks end before their jobs are stopped.)"""
    gpu_type = f"LC{uuid.uuid4().hex[:8].upper()}"
    node = Node.objects.create(
        name=f"t-lifecycle-{gpu_type.lower()}", address=f"{gpu_type.lower()}.invalid", docker_host="unix:///nonexistent",
        cpus=16, memory_mb=16000, gpus=[{"index": i, "type": gpu_type} for i in range(8)], gpus_simulated=True,
        port_start=40000, port_end=40099, last_heartbeat=timezone.now() + timedelta(hours=1),
        agent_pid=os.getpid(),  # this process plays the node's agent
    )
    yield node
    Node.objects.filter(pk=node.pk).update(schedulable=False, last_heartbeat=timezone.now())
    for attempt_id in TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES).values_list("pk", flat=True):
        services.attempt_record_exit(attempt_id, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="the test ended"))


def gpu_job(user, node: Node, *roles: dict, **top) -> Job:
    """A job whose every task wants one GPU of the test node's type."""
    gpu_type = node.gpus[0]["type"]
    roles = roles or (role(gpus=1),)
    return submit(user, config(f"lc-{uuid.uuid4().hex[:8]}", *({**r, "gpuNumber": 1} for r in roles),
                               gpuType=gpu_type, **top))


def start(job: Job) -> dict[str, TaskAttempt]:
    """Place the job's current attempt and launch its tasks as an agent
    would; its task attempts by name ("main-0")."""
    services.schedule_pass()
    job.refresh_from_db()
    assert job.state == State.RUNNING, job.waiting_reason
    attempts = TaskAttempt.objects.filter(job=job, number=job.attempt_number).select_related("task")
    for attempt in attempts:
        assert services.attempt_claim_launch(attempt.pk)
        assert services.attempt_mark_running(attempt.pk, container_id=f"fake-{attempt.pk}")
    return {attempt.hostname: attempt for attempt in attempts}


def exit_(attempt: TaskAttempt, code: int | None, **kw) -> bool:
    return services.attempt_record_exit(attempt.pk, ContainerExit(code, **kw))


def fresh(row):
    row.refresh_from_db()
    return row


def test_it_succeeds_a_job_when_all_its_tasks_exit_zero_and_frees_what_they_held(alice, node):
    job = gpu_job(alice, node, role(tasks=2))
    tasks = start(job)
    assert GpuAllocation.objects.filter(attempt__job=job, node=node).count() == 2
    assert PortAllocation.objects.filter(attempt__job=job, node=node).count() == 4  # ssh and main for each task

    assert exit_(tasks["main-0"], 0)
    assert fresh(job).state == State.RUNNING
    assert fresh(tasks["main-1"]).stop_reason == ""
    assert exit_(tasks["main-1"], 0)

    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_code, job.exit_reason) == (State.SUCCEEDED, ExitType.SUCCEEDED, 0,
                                                                          "all tasks succeeded")
    assert job.finished_at is not None and job.waiting_reason == ""
    assert JobAttempt.objects.get(job=job, number=1).state == State.SUCCEEDED
    assert all(fresh(a).state == TaskState.SUCCEEDED for a in tasks.values())
    assert not GpuAllocation.objects.filter(attempt__job=job).exists()
    assert not PortAllocation.objects.filter(attempt__job=job).exists()


@pytest.mark.parametrize("result, task_state, exit_type, reason", [
    (ContainerExit(3), TaskState.FAILED, ExitType.USER_EXIT, "the command exited with code 3"),
    (ContainerExit(137, oom_killed=True), TaskState.FAILED, ExitType.OOM,
     "killed for exceeding its memory limit (300 MB)"),
    (ContainerExit(None, exit_type=ExitType.IMAGE_PULL, error="pull access denied for nosuch/image"),
     TaskState.FAILED, ExitType.IMAGE_PULL, "pull access denied for nosuch/image"),
    (ContainerExit(None, exit_type=ExitType.NODE_LOST, error="node x was lost (no heartbeat since then)"),
     TaskState.FAILED, ExitType.NODE_LOST, "node x was lost (no heartbeat since then)"),
    (ContainerExit(None, exit_type=ExitType.PLATFORM, error="the container disappeared"),
     TaskState.FAILED, ExitType.PLATFORM, "the container disappeared"),
    (ContainerExit(None, error="cannot start container: port is already allocated"),
     TaskState.FAILED, ExitType.PLATFORM, "platform error: cannot start container: port is already allocated"),
], ids=["user-exit", "oom", "image-pull", "node-lost", "platform", "engine-error"])
def test_it_stores_how_a_task_failed_on_the_task_and_the_job(alice, node, result, task_state, exit_type, reason):
    job = gpu_job(alice, node, role(memory=300))
    task = start(job)["main-0"]
    assert services.attempt_record_exit(task.pk, result)

    task = fresh(task)
    assert (task.state, task.exit_type, task.exit_code, task.exit_reason) == (task_state, exit_type, result.exit_code,
                                                                              reason)
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_code) == (State.FAILED, exit_type, result.exit_code)
    assert job.exit_reason == f"task main-0 failed: {reason}"


def test_it_ignores_a_second_report_of_the_same_exit(alice, node):
    job = gpu_job(alice, node, role(tasks=2))
    tasks = start(job)
    assert exit_(tasks["main-0"], 0)
    task_before = TaskAttempt.objects.filter(pk=tasks["main-0"].pk).values().get()
    job_before = Job.objects.filter(pk=job.pk).values().get()

    # An agent restarted and reports again: the same exit, or what it saw
    # of the container after its restart.
    assert not exit_(tasks["main-0"], 0)
    assert not exit_(tasks["main-0"], 1)
    assert not exit_(tasks["main-0"], None, exit_type=ExitType.PLATFORM, error="the container disappeared")
    assert TaskAttempt.objects.filter(pk=tasks["main-0"].pk).values().get() == task_before
    assert Job.objects.filter(pk=job.pk).values().get() == job_before
    assert fresh(tasks["main-1"]).stop_reason == ""


def test_it_ignores_a_second_report_after_the_job_has_ended(alice, node):
    job = gpu_job(alice, node, retryCount=1)
    task = start(job)["main-0"]
    assert exit_(task, 0)
    assert not exit_(task, 2)  # must not fail the job, nor start a retry
    job = fresh(job)
    assert (job.state, job.attempt_number) == (State.SUCCEEDED, 1)
    assert JobAttempt.objects.filter(job=job).count() == 1


def test_the_first_failure_ends_the_job_and_stops_its_other_tasks(alice, node):
    job = gpu_job(alice, node, role(tasks=3))
    tasks = start(job)
    assert exit_(tasks["main-1"], 3)
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_code) == (State.FAILED, ExitType.USER_EXIT, 3)
    assert job.exit_reason == "task main-1 failed: the command exited with code 3"
    for name in ("main-0", "main-2"):
        assert fresh(tasks[name]).stop_reason == ExitType.COMPLETED

    # Their containers end as the agent kills them: stopped, not failed,
    # whatever their code, and the job's verdict stands.
    assert exit_(tasks["main-0"], 137)
    assert exit_(tasks["main-2"], 0)
    main_0 = fresh(tasks["main-0"])
    assert (main_0.state, main_0.exit_type, main_0.exit_reason) == (TaskState.STOPPED, ExitType.COMPLETED,
                                                                    "stopped because the job completed")
    assert fresh(tasks["main-2"]).state == TaskState.SUCCEEDED
    assert Job.objects.filter(pk=job.pk).values("state", "exit_reason", "exit_code").get() == {
        "state": State.FAILED, "exit_reason": job.exit_reason, "exit_code": 3}
    assert not GpuAllocation.objects.filter(attempt__job=job).exists()
    assert not PortAllocation.objects.filter(attempt__job=job).exists()


def test_min_failed_task_count_fails_the_job_at_that_many_failures(alice, node):
    job = gpu_job(alice, node, role(tasks=3, minFailedTaskCount=2))
    tasks = start(job)
    assert exit_(tasks["main-0"], 1)
    assert fresh(job).state == State.RUNNING
    assert fresh(tasks["main-1"]).stop_reason == ""
    assert exit_(tasks["main-2"], None, oom_killed=True)
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_code) == (State.FAILED, ExitType.USER_EXIT, 1)  # the first failure's
    assert job.exit_reason == ("2 tasks of role main failed (minFailedTaskCount is 2); "
                               "first: main-0: the command exited with code 1")
    assert fresh(tasks["main-1"]).stop_reason == ExitType.COMPLETED


def test_min_succeeded_task_count_succeeds_the_job_early(alice, node):
    job = gpu_job(alice, node, role("ps"), role("worker", tasks=3, minSucceededTaskCount=2))
    tasks = start(job)
    assert exit_(tasks["worker-2"], 0)
    assert fresh(job).state == State.RUNNING
    assert exit_(tasks["worker-0"], 0)
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_code) == (State.SUCCEEDED, ExitType.SUCCEEDED, 0)
    assert job.exit_reason == "2 tasks of role worker succeeded (minSucceededTaskCount is 2)"
    assert fresh(tasks["ps-0"]).stop_reason == fresh(tasks["worker-1"]).stop_reason == ExitType.COMPLETED


def test_a_null_min_failed_task_count_lets_the_job_succeed_with_failed_tasks(alice, node):
    job = gpu_job(alice, node, role(tasks=3, minFailedTaskCount=None))
    tasks = start(job)
    assert exit_(tasks["main-0"], 1)
    assert exit_(tasks["main-2"], None, exit_type=ExitType.NODE_LOST, error="node gone")
    assert fresh(job).state == State.RUNNING
    assert fresh(tasks["main-1"]).stop_reason == ""
    assert exit_(tasks["main-1"], 0)
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_code) == (State.SUCCEEDED, ExitType.SUCCEEDED, 0)
    assert job.exit_reason == ("all tasks completed; 2 tasks failed (main-0, main-2) without failing the job "
                               "because minFailedTaskCount is null")


def test_kill_all_on_completed_task_number_ends_the_job_and_stops_the_rest(alice, node):
    job = gpu_job(alice, node, role("ps", tasks=2), role("worker", tasks=2), killAllOnCompletedTaskNumber=2)
    tasks = start(job)
    assert exit_(tasks["worker-1"], 0)
    assert fresh(job).state == State.RUNNING
    assert exit_(tasks["ps-0"], 0)
    job = fresh(job)
    assert (job.state, job.exit_code) == (State.SUCCEEDED, 0)
    assert job.exit_reason == "2 tasks completed (killAllOnCompletedTaskNumber is 2)"
    assert fresh(tasks["ps-1"]).stop_reason == fresh(tasks["worker-0"]).stop_reason == ExitType.COMPLETED


def test_retry_count_starts_a_new_attempt_that_names_the_failure(alice, node):
    job = gpu_job(alice, node, role(tasks=2), retryCount=1)
    first = start(job)
    assert exit_(first["main-0"], 3)

    job = fresh(job)
    assert (job.state, job.attempt_number, job.finished_at) == (State.WAITING, 2, None)
    assert job.waiting_reason == "retrying (attempt 2 of 2) after: task main-0 failed: the command exited with code 3"
    attempt_1 = JobAttempt.objects.get(job=job, number=1)
    assert (attempt_1.state, attempt_1.exit_type, attempt_1.exit_code) == (State.FAILED, ExitType.USER_EXIT, 3)
    assert JobAttempt.objects.get(job=job, number=2).state == State.WAITING
    assert fresh(first["main-1"]).stop_reason == ExitType.COMPLETED

    second = start(job)
    assert {a.number for a in second.values()} == {2}
    # The first attempt's last task ends late, failing: it decides nothing now.
    assert exit_(first["main-1"], 1)
    assert fresh(first["main-1"]).state == TaskState.STOPPED
    assert fresh(job).state == State.RUNNING
    assert exit_(second["main-0"], 0) and exit_(second["main-1"], 0)
    job = fresh(job)
    assert (job.state, job.attempt_number, job.retries, job.exit_reason) == (State.SUCCEEDED, 2, 1, "all tasks succeeded")
    assert JobAttempt.objects.get(job=job, number=1).state == State.FAILED


def test_a_job_fails_when_its_retries_are_used_up(alice, node):
    job = gpu_job(alice, node, retryCount=1)
    assert exit_(start(job)["main-0"], None, exit_type=ExitType.NODE_LOST, error="node n1 was lost")
    job = fresh(job)
    assert job.waiting_reason == "retrying (attempt 2 of 2) after: task main-0 failed: node n1 was lost"
    assert exit_(start(job)["main-0"], 4)
    job = fresh(job)
    assert (job.state, job.attempt_number, job.exit_type, job.exit_code) == (State.FAILED, 2, ExitType.USER_EXIT, 4)
    assert job.exit_reason == "task main-0 failed: the command exited with code 4"
    assert JobAttempt.objects.filter(job=job).count() == 2
    services.schedule_pass()
    assert not TaskAttempt.objects.filter(job=job, number=3).exists()


@pytest.mark.parametrize("last_exit", [ContainerExit(1), ContainerExit(137, oom_killed=True),
                                       ContainerExit(None, exit_type=ExitType.NODE_LOST, error="node gone")],
                         ids=["non-zero", "oom", "node-lost"])
def test_a_job_stopped_by_its_user_is_never_retried(alice, node, last_exit):
    job = gpu_job(alice, node, role(tasks=2), retryCount=3)
    tasks = start(job)
    assert services.job_stop(job=job, by=alice).state == State.STOPPING
    assert all(fresh(a).stop_reason == ExitType.USER_STOP for a in tasks.values())

    assert exit_(tasks["main-0"], 137)
    main_0 = fresh(tasks["main-0"])
    assert (main_0.state, main_0.exit_type, main_0.exit_reason) == (TaskState.STOPPED, ExitType.USER_STOP,
                                                                    "stopped by user")
    assert fresh(job).state == State.STOPPING
    assert services.attempt_record_exit(tasks["main-1"].pk, last_exit)

    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_reason) == (State.STOPPED, ExitType.USER_STOP,
                                                           f"stopped by {alice.username}")
    assert (job.attempt_number, job.waiting_reason) == (1, "")
    services.schedule_pass()
    assert fresh(job).state == State.STOPPED
    assert JobAttempt.objects.filter(job=job).count() == 1
    assert TaskAttempt.objects.filter(job=job).count() == 2
    assert not GpuAllocation.objects.filter(attempt__job=job).exists()
    assert not PortAllocation.objects.filter(attempt__job=job).exists()


def test_a_pass_run_by_a_nodes_agent_hands_that_nodes_launches_over_and_queues_the_rest(alice, node):
    """The agent that runs a pass takes its own node's launches at once; every
    other node still gets a launch request through Redis."""
    from rq import Queue

    from jobs import queues

    other = Node.objects.create(
        name=f"{node.name}-b", address=f"b.{node.address}", docker_host="unix:///nonexistent", cpus=16,
        memory_mb=16000, gpus=node.gpus, gpus_simulated=True, port_start=40000, port_end=40099,
        last_heartbeat=timezone.now() + timedelta(hours=1), agent_pid=os.getpid())
    try:
        taken: list[tuple[int, int]] = []
        # The submission and the pass in one transaction: the pass that the
        # submission asks for (run by a test cluster's agent, when one is up)
        # sees the job only once this one has placed it, and finds nothing to
        # do. The launches go out when it commits.
        with transaction.atomic():
            job = submit(alice, config(f"lc-{uuid.uuid4().hex[:8]}", role(tasks=2, gpuNumber=8),
                                       gpuType=node.gpus[0]["type"]))
            services.schedule_pass(here=services.LaunchHere(
                node_name=node.name, launch=lambda attempt_id, owner_id: taken.append((attempt_id, owner_id))))
            assert taken == []  # not before the placements are committed
        job.refresh_from_db()
        assert job.state == State.RUNNING, job.waiting_reason
        placed = dict(TaskAttempt.objects.filter(job=job).values_list("node__name", "pk"))
        assert taken == [(placed[node.name], alice.pk)]  # whose: the node takes launches in turn by owner
        mine, theirs = (Queue(queues.node_queue_name(n.name), connection=queues.connection()) for n in (node, other))
        assert mine.count == 0
        assert [request.args for request in theirs.jobs] == [(placed[other.name], alice.pk)]
    finally:
        Node.objects.filter(pk=other.pk).update(schedulable=False, last_heartbeat=timezone.now())
        for attempt_id in TaskAttempt.objects.filter(node=other, state__in=ACTIVE_TASK_STATES).values_list("pk", flat=True):
            services.attempt_record_exit(attempt_id, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="the test ended"))
        Queue(queues.node_queue_name(other.name), connection=queues.connection()).empty()


def test_a_pass_on_sqlite_reads_again_under_the_lock_only_after_another_connection_committed(alice, node, monkeypatch):
    """A pass looks first without the write lock; under the lock it reads the
    cluster again only if another connection committed since (PRAGMA
    data_version), and then decides on what it read last.

    The test's node stays unschedulable in the database throughout, so no
    other process's pass (a test cluster's agents share the database, and
    the submissions wake them) can place the test's jobs, which only this
    node's GPU type fits. This pass's reads see the node ready while
    `shown` says so: the look of the second pass sees it, as it would just
    before another connection took it away."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's pass takes its lock first and reads once")
    ready_row = next(row for row in scheduling._read().nodes if row[0] == node.pk)
    Node.objects.filter(pk=node.pk).update(schedulable=False)
    shown = [True]
    reads: list[int] = []
    versions: list[int] = []
    real_read, real_version, real_plan = scheduling._read, scheduling._data_version, scheduling._plan

    def read() -> scheduling._Inputs:
        reads.append(1)
        inputs = real_read()
        if shown[0]:  # in the name order the pass reads nodes in
            inputs.nodes = sorted([*inputs.nodes, ready_row], key=lambda row: row[1])
        return inputs

    monkeypatch.setattr(scheduling, "_read", read)
    monkeypatch.setattr(scheduling, "_data_version", lambda: versions.append(real_version()) or versions[-1])
    here = services.LaunchHere(node_name=node.name, launch=lambda attempt_id, owner_id: None)
    gpus = role(gpuNumber=1)

    first = submit(alice, config(f"lc-{uuid.uuid4().hex[:8]}", gpus, gpuType=node.gpus[0]["type"]))
    services.schedule_pass(here=here)
    first.refresh_from_db()
    assert first.state == State.RUNNING, first.waiting_reason
    # Other processes (a test cluster's agents) may commit meanwhile; only then is there a second read.
    assert len(versions) == 2 and len(reads) == (1 if versions[0] == versions[1] else 2)

    # Another connection takes the node away between the look (which placed
    # the job) and the lock: the pass must see it and place nothing.
    def plan_then_commit_elsewhere(inputs):
        plan = real_plan(inputs)
        if len(reads) == 1:
            def elsewhere() -> None:
                Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() + timedelta(hours=1))
                connection.close()

            shown[0] = False
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join()
        return plan

    reads.clear()
    versions.clear()
    monkeypatch.setattr(scheduling, "_plan", plan_then_commit_elsewhere)
    second = submit(alice, config(f"lc-{uuid.uuid4().hex[:8]}", gpus, gpuType=node.gpus[0]["type"]))
    assert services.schedule_pass(here=here) == 0
    assert versions[0] != versions[1] and len(reads) == 2
    second.refresh_from_db()
    assert second.state == State.WAITING


def test_a_stop_asked_while_a_task_starts_does_not_deadlock_with_recording_its_start(alice, node, monkeypatch):
    """A stop locks the job's row, then its tasks'; recording a start must
    take them in that order too. The other way round, PostgreSQL found a
    deadlock and aborted one of the two (the API answered the stop with 500)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's write lock, taken at BEGIN, makes the two wait in turn")
    job = submit(alice, config(f"lc-{uuid.uuid4().hex[:8]}", role(gpuNumber=1), gpuType=node.gpus[0]["type"]))
    services.schedule_pass(here=services.LaunchHere(node_name=node.name, launch=lambda attempt_id, owner_id: None))
    attempt = TaskAttempt.objects.get(job=job)
    assert services.attempt_claim_launch(attempt.pk)

    holding, go_on = threading.Event(), threading.Event()
    real_stop_tasks = lifecycle._stop_attempt_tasks

    def stop_tasks_later(*args):  # the stop holds the job's row here
        holding.set()
        go_on.wait(30)
        return real_stop_tasks(*args)

    monkeypatch.setattr(lifecycle, "_stop_attempt_tasks", stop_tasks_later)
    errors: list[BaseException] = []
    started: list[bool] = []

    def in_thread(work) -> threading.Thread:
        def run() -> None:
            try:
                work()
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    stopping = in_thread(lambda: services.job_stop(job=job, by=alice))
    assert holding.wait(30)
    recording = in_thread(lambda: started.append(services.attempt_mark_running(attempt.pk, container_id="c" * 64)))

    def recording_waits_for_a_lock() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock'")
            return cursor.fetchone()[0] > 0

    wait_for(recording_waits_for_a_lock, timeout=30, what="recording the start to wait for the stop's lock")
    go_on.set()
    stopping.join(30)
    recording.join(30)
    assert not errors, errors
    assert started == [True]
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.state == State.STOPPING and attempt.state == TaskState.RUNNING and attempt.stop_reason


def test_a_jobs_times_span_its_tasks_whatever_order_their_agents_report_in(alice, node):
    """Each task's start and end are its container's. A job (and its
    attempt) started at its first task's start and ended at its last
    task's end, even when the later start is recorded first and the
    earlier end last: the API's createdTime <= appLaunchedTime <=
    appCompletedTime held only when the agents reported in order."""
    from django.test import Client

    from jobs.services import tokens

    job = gpu_job(alice, node, role(tasks=2))
    services.schedule_pass()
    first, second = TaskAttempt.objects.filter(job=job).order_by("task__index")
    base = timezone.now() + timedelta(seconds=1)
    for attempt in (first, second):
        assert services.attempt_claim_launch(attempt.pk)
    # The second task started 40 ms after the first and ran longer; the
    # first's agent reports its start last and its end last.
    assert services.attempt_mark_running(second.pk, container_id="c-2", started_at=base + timedelta(milliseconds=40))
    assert services.attempt_mark_running(first.pk, container_id="c-1", started_at=base)
    exit_(second, 0, finished_at=base + timedelta(milliseconds=90))
    exit_(first, 0, finished_at=base + timedelta(milliseconds=30))
    job = fresh(job)
    attempt = JobAttempt.objects.get(job=job, number=1)
    assert job.state == State.SUCCEEDED
    assert (job.started_at, job.finished_at) == (base, base + timedelta(milliseconds=90))
    assert (attempt.started_at, attempt.finished_at) == (base, base + timedelta(milliseconds=90))
    key = tokens.token_create(user=alice, lifetime=timedelta(hours=1)).key
    status = Client(HTTP_AUTHORIZATION=f"Bearer {key}").get(f"/api/v1/user/{alice.username}/jobs/{job.name}").json()
    times = status["jobStatus"]
    assert times["createdTime"] <= times["appLaunchedTime"] <= times["appCompletedTime"] == times["completedTime"]


def test_a_job_a_task_running_out_of_memory_ended_is_not_retried(alice, node):
    """OpenPAI's exit spec: NEVER_RETRY for a container killed for memory
    (the same limit would kill the same program again)."""
    job = gpu_job(alice, node, role(memory=300), retryCount=2)
    assert exit_(start(job)["main-0"], 137, oom_killed=True)
    job = fresh(job)
    assert (job.state, job.attempt_number, job.exit_type) == (State.FAILED, 1, ExitType.OOM)
    assert JobAttempt.objects.filter(job=job).count() == 1


def test_with_min_failed_task_count_above_1_the_exit_code_is_the_first_failure_in_time(alice, node):
    job = gpu_job(alice, node, role(tasks=3, minFailedTaskCount=2))
    tasks = start(job)
    assert exit_(tasks["main-2"], 7)  # the first to fail, though not the first by index
    assert fresh(job).state == State.RUNNING
    assert exit_(tasks["main-0"], 9)  # reaches the count: the trigger
    job = fresh(job)
    assert (job.state, job.exit_code, job.exit_trigger_role, job.exit_trigger_index) == (State.FAILED, 7, "main", 0)
    assert "first: main-2" in job.exit_reason


def test_a_task_a_drain_stopped_is_a_drain_failure_even_if_it_exits_0(alice, admin_user, node):
    """A program that catches SIGTERM and exits cleanly still lost its node:
    its job runs again elsewhere (retries left), as README's drain says."""
    assert classify(ContainerExit(0), stop_reason=ExitType.NODE_DRAINED)[:2] == (TaskState.FAILED, ExitType.NODE_DRAINED)
    job = gpu_job(alice, node, role(), retryCount=1)
    task = start(job)["main-0"]
    nodes.node_drain(node=node, by=admin_user, mode="stop")
    assert exit_(task, 0)
    job = fresh(job)
    assert (job.state, job.attempt_number) == (State.WAITING, 2), job.exit_reason


@pytest.mark.parametrize("code", [0, 143])
def test_a_job_a_drain_ended_fails_as_the_platform_s_doing_with_no_exit_code_of_the_user_s(alice, admin_user, node,
                                                                                          code):
    """No retries left: the job fails as "node drained", a platform failure.
    Its exit code is not the program's answer to the drain's SIGTERM (a
    FAILED job with exit code 0 read as a contradiction); the task keeps the
    code its container gave, and its reason says the drain came first."""
    from django.test import Client

    from jobs import exit_spec
    from jobs.services import tokens

    job = gpu_job(alice, node, role())
    task = start(job)["main-0"]
    nodes.node_drain(node=node, by=admin_user, mode="stop")
    assert exit_(task, code)
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_code) == (State.FAILED, ExitType.NODE_DRAINED, None)
    assert job.exit_reason.startswith("task main-0 failed: node drained: ") and exit_spec.spec_for(job.exit_type).causer == "PLATFORM"
    attempt = JobAttempt.objects.get(job=job, number=1)
    assert (attempt.state, attempt.exit_type, attempt.exit_code) == (State.FAILED, ExitType.NODE_DRAINED, None)
    task = fresh(task)
    assert (task.state, task.exit_type, task.exit_code) == (TaskState.FAILED, ExitType.NODE_DRAINED, code)
    assert task.exit_reason == (f"node drained: node {node.name} was drained by an admin; "
                                f"stopped, the command exited with code {code}")
    key = tokens.token_create(user=alice, lifetime=timedelta(hours=1)).key
    status = Client(HTTP_AUTHORIZATION=f"Bearer {key}").get(f"/api/v1/user/{alice.username}/jobs/{job.name}").json()
    app = status["jobStatus"]
    assert (app["appExitCode"], app["appExitSpec"]["code"], app["appExitSpec"]["causer"]) == (None, None, "PLATFORM")
