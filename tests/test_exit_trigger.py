"""What ended a job and each of its attempts: OpenPAI's appExitTriggerMessage,
appExitTriggerTaskRoleName and appExitTriggerTaskIndex.

The pure rule first (`judge`'s trigger), then each completion rule end to
end through the services as tests/test_lifecycle.py drives them (the test
plays the node agent). A stop names no task: its message says who stopped it.

Users: alice (owner); each test makes its own.
"""

from __future__ import annotations

import pytest

from jobs import services
from jobs.completion import TaskResult, Trigger, judge
from jobs.models import ExitType, Job, JobAttempt, State
from jobs.services import lifecycle
from tests.helpers import config, hold_vc, role, submit
from tests.test_lifecycle import exit_, fresh, gpu_job, node, results, spec_of, start  # noqa: F401  (node: a fixture)


def trigger_of(row: Job | JobAttempt) -> tuple[str | None, str | None, int | None]:
    row = fresh(row)
    return row.exit_trigger_message, row.exit_trigger_role, row.exit_trigger_index


def attempt(job: Job, number: int = 1) -> JobAttempt:
    return JobAttempt.objects.get(job=job, number=number)


# ------------------------------------------------------------ the pure rule


def test_judge_names_the_failure_that_reached_min_failed_task_count_as_the_trigger():
    spec = spec_of(role("w", tasks=4, minFailedTaskCount=2))
    verdict = judge(spec, results(("w", 0, "FAILED"), ("w", 1, None), ("w", 2, "FAILED"), ("w", 3, None)),
                    last=TaskResult("w", 2, "FAILED"))
    assert verdict.trigger == Trigger("minFailedTaskCount 2 of role w reached: 2 tasks failed", "w", 2)
    # The exit code stays the first failure's (OpenPAI's appExitCode is unchanged by this).
    assert verdict.deciding.index == 0


def test_judge_names_the_success_that_reached_min_succeeded_task_count():
    spec = spec_of(role("ps"), role("w", tasks=3, minSucceededTaskCount=2))
    verdict = judge(spec, results(("ps", 0, None), ("w", 0, "SUCCEEDED"), ("w", 1, None), ("w", 2, "SUCCEEDED")),
                    last=TaskResult("w", 0, "SUCCEEDED"))
    assert verdict.trigger == Trigger("minSucceededTaskCount 2 of role w reached: 2 tasks succeeded", "w", 0)
    assert verdict.deciding is None


def test_judge_names_the_completion_that_reached_kill_all_on_completed_task_number():
    spec = spec_of(role("ps", tasks=2), role("w", tasks=2), killAllOnCompletedTaskNumber=2)
    verdict = judge(spec, results(("ps", 0, "SUCCEEDED"), ("ps", 1, None), ("w", 0, None), ("w", 1, "SUCCEEDED")),
                    last=TaskResult("ps", 0, "SUCCEEDED"))
    assert verdict.trigger == Trigger("killAllOnCompletedTaskNumber 2 reached: 2 tasks completed", "ps", 0)


def test_judge_names_the_last_task_to_complete_when_all_have():
    spec = spec_of(role("w", tasks=3, minFailedTaskCount=None))
    verdict = judge(spec, results(("w", 0, "SUCCEEDED"), ("w", 1, "FAILED"), ("w", 2, "SUCCEEDED")),
                    last=TaskResult("w", 0, "SUCCEEDED"))
    assert verdict.trigger == Trigger(
        "all tasks completed: 2 of 3 succeeded, 1 failed without reaching a minFailedTaskCount", "w", 0)
    verdict = judge(spec_of(role("w")), results(("w", 0, "SUCCEEDED")), last=TaskResult("w", 0, "SUCCEEDED"))
    assert verdict.trigger == Trigger("all tasks completed: 1 of 1 succeeded", "w", 0)


def test_judge_names_the_last_counted_task_when_it_is_not_told_which_completed():
    spec = spec_of(role("w", tasks=3, minFailedTaskCount=2))
    failed = results(("w", 0, "FAILED"), ("w", 1, "FAILED"), ("w", 2, None))
    assert (judge(spec, failed).trigger.role, judge(spec, failed).trigger.index) == ("w", 1)
    # A `last` the firing rule did not count (it ended another way) is not named either.
    assert judge(spec, failed, last=TaskResult("w", 2, "SUCCEEDED")).trigger.index == 1


# ------------------------------------------------- each rule, through the services


def test_the_failure_that_ends_a_job_is_its_trigger_and_later_exits_change_nothing(alice, node):
    job = gpu_job(alice, node, role(tasks=3))
    tasks = start(job)
    assert exit_(tasks["main-0"], 0)
    assert trigger_of(job) == (None, None, None)  # still running
    assert exit_(tasks["main-1"], 3)
    expected = ("minFailedTaskCount 1 of role main reached: 1 task failed", "main", 1)
    assert fresh(job).state == State.FAILED
    assert trigger_of(job) == trigger_of(attempt(job)) == expected
    # The task stopped because the job ended exits last: it triggered nothing.
    assert exit_(tasks["main-2"], 137)
    assert trigger_of(job) == trigger_of(attempt(job)) == expected


@pytest.mark.parametrize("exit_type, error", [
    (ExitType.IMAGE_PULL, "pull access denied for nosuch/image"),
    (ExitType.NODE_LOST, "node n1 was lost (no heartbeat since then)"),
], ids=["launch-failure", "node-lost"])
def test_a_platform_failure_of_a_task_is_the_trigger_like_any_failure(alice, node, exit_type, error):
    """As in OpenPAI, where a lost or unlaunchable pod fails its task and the
    task's failure fires minFailedTaskCount; the platform's words stay in
    appExitDiagnostics and appExitSpec."""
    job = gpu_job(alice, node, role(tasks=2))
    tasks = start(job)
    assert exit_(tasks["main-0"], None, exit_type=exit_type, error=error)
    job = fresh(job)
    assert (job.exit_type, trigger_of(job)) == (
        exit_type, ("minFailedTaskCount 1 of role main reached: 1 task failed", "main", 0))


def test_min_failed_task_count_names_the_failure_that_reached_it(alice, node):
    job = gpu_job(alice, node, role(tasks=3, minFailedTaskCount=2))
    tasks = start(job)
    assert exit_(tasks["main-0"], 1)
    assert exit_(tasks["main-2"], None, oom_killed=True)
    job = fresh(job)
    assert job.exit_code == 1  # the first failure's, as before
    assert trigger_of(job) == ("minFailedTaskCount 2 of role main reached: 2 tasks failed", "main", 2)


def test_min_succeeded_task_count_names_the_success_that_reached_it(alice, node):
    job = gpu_job(alice, node, role("ps"), role("worker", tasks=3, minSucceededTaskCount=2))
    tasks = start(job)
    assert exit_(tasks["worker-2"], 0)
    assert exit_(tasks["worker-0"], 0)
    assert fresh(job).state == State.SUCCEEDED
    assert trigger_of(job) == trigger_of(attempt(job)) == (
        "minSucceededTaskCount 2 of role worker reached: 2 tasks succeeded", "worker", 0)


def test_kill_all_on_completed_task_number_names_the_completion_that_reached_it(alice, node):
    job = gpu_job(alice, node, role("ps", tasks=2), role("worker", tasks=2), killAllOnCompletedTaskNumber=2)
    tasks = start(job)
    assert exit_(tasks["worker-1"], 0)
    assert exit_(tasks["ps-0"], 0)
    assert trigger_of(job) == ("killAllOnCompletedTaskNumber 2 reached: 2 tasks completed", "ps", 0)


def test_all_tasks_completed_names_the_last_to_complete(alice, node):
    job = gpu_job(alice, node, role(tasks=3, minFailedTaskCount=None))
    tasks = start(job)
    assert exit_(tasks["main-0"], 1)
    assert exit_(tasks["main-2"], None, exit_type=ExitType.NODE_LOST, error="node gone")
    assert exit_(tasks["main-1"], 0)
    assert fresh(job).state == State.SUCCEEDED
    assert trigger_of(job) == (
        "all tasks completed: 1 of 3 succeeded, 2 failed without reaching a minFailedTaskCount", "main", 1)


def test_each_attempt_of_a_retried_job_keeps_its_own_trigger(alice, node):
    job = gpu_job(alice, node, role(tasks=2), retryCount=1)
    first = start(job)
    assert exit_(first["main-1"], 3)
    first_trigger = ("minFailedTaskCount 1 of role main reached: 1 task failed", "main", 1)
    assert trigger_of(attempt(job, 1)) == first_trigger
    # The job waits for its retry: it has not ended, so it names no trigger.
    assert fresh(job).state == State.WAITING
    assert trigger_of(job) == trigger_of(attempt(job, 2)) == (None, None, None)

    second = start(job)
    assert exit_(first["main-0"], 1)  # the first attempt's last task, late: it decides nothing
    assert exit_(second["main-1"], 0) and exit_(second["main-0"], 0)
    assert fresh(job).state == State.SUCCEEDED
    assert trigger_of(job) == trigger_of(attempt(job, 2)) == ("all tasks completed: 2 of 2 succeeded", "main", 0)
    assert trigger_of(attempt(job, 1)) == first_trigger


def test_a_stop_names_who_stopped_the_job_and_no_task(alice, node):
    running = gpu_job(alice, node, role(tasks=2), retryCount=3)
    tasks = start(running)
    services.job_stop(job=running, by=alice)
    assert trigger_of(running) == (None, None, None)  # stopping, not ended yet
    assert exit_(tasks["main-0"], 137) and exit_(tasks["main-1"], 1)
    assert trigger_of(running) == trigger_of(attempt(running)) == (f"stopped by {alice.username}", None, None)

    waiting = submit(alice, config("never_placed", role(), virtualCluster=hold_vc("trigger_hold", alice).name))
    services.job_stop(job=waiting, by=alice)
    assert trigger_of(waiting) == trigger_of(attempt(waiting)) == (f"stopped by {alice.username}", None, None)


def test_idle_gpus_reclaimed_names_the_platform_and_no_task(alice, node):
    job = gpu_job(alice, node, role(tasks=2), retryCount=1)
    tasks = start(job)
    assert lifecycle.job_reclaim_idle_gpus(job_id=job.pk, number=1)
    assert exit_(tasks["main-0"], 137) and exit_(tasks["main-1"], 143)
    job = fresh(job)
    assert (job.state, job.exit_type) == (State.STOPPED, ExitType.IDLE_GPUS)
    assert trigger_of(job) == (lifecycle.IDLE_GPUS_TRIGGER.message, None, None)
    assert "stopped by the platform" in job.exit_trigger_message
