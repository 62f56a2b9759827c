"""A job's life after submission: tasks launched, running, exiting; stops;
the verdict on each attempt; retries.

Every change is a conditional UPDATE or runs under the job's row lock, so a
web request, a scheduling pass and node agents can act at once. Work for
other processes (stop requests, scheduling passes) is enqueued after commit.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import F, Max, Q

from jobs import exit_spec, queues
from jobs.completion import Outcome, TaskResult, Trigger, Verdict, judge
from jobs.models import (
    ACTIVE_TASK_STATES,
    FINAL_STATES,
    ExitType,
    GpuAllocation,
    Job,
    JobAttempt,
    PortAllocation,
    State,
    TaskAttempt,
    TaskState,
    User,
)
from jobs.services import db_clock, notifications


class JobStateError(Exception):
    """The job is not in a state that allows the action."""


# -------------------------------------------------------------------- stopping


def job_stop(*, job: Job, by: User) -> Job:
    """Stop a job: a waiting one at once, a running one through its tasks.

    Asking again while it is stopping makes the node agents kill at once.
    """
    stops: list[tuple[str, int]] = []
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.is_final:
            raise JobStateError(f"the job has already ended ({job.get_state_display()})")
        now = db_clock.now()
        reason = f"stopped by {by.username}"
        if job.state == State.WAITING:
            _finish_job(job, State.STOPPED, ExitType.USER_STOP, reason, None, now, Trigger(reason))
            _stop_attempt_tasks(job, ExitType.USER_STOP, stops)
        else:
            Job.objects.filter(pk=job.pk).update(
                state=State.STOPPING, stop_requested_at=job.stop_requested_at or now, stop_requested_by=by
            )
            _stop_attempt_tasks(job, ExitType.USER_STOP, stops)
            _maybe_finish_stopping(job.pk, now)
        transaction.on_commit(lambda: _send_stops(stops), robust=True)
    return Job.objects.get(pk=job.pk)


def job_reclaim_idle_gpus(*, job_id: int, number: int) -> bool:
    """Stop a running job whose GPUs stayed idle past the grace period
    (IDLE_GPU_POLICY=stop, jobs/services/usage.py). The whole job stops: a
    gang job without one of its tasks is no use. It ends STOPPED with
    ExitType.IDLE_GPUS and is never retried: it goes through STOPPING like a
    user's stop, where no verdict is judged (a reclaim is not a failure).

    The conditional UPDATE RUNNING -> STOPPING is the claim: node agents
    checking at once stop it once. False if it was no longer running
    attempt `number` (stopped, finished or retried meanwhile)."""
    stops: list[tuple[str, int]] = []
    with transaction.atomic():
        now = db_clock.now()
        if not Job.objects.filter(pk=job_id, state=State.RUNNING, attempt_number=number).update(
                state=State.STOPPING, stop_requested_at=now):
            return False
        job = Job.objects.get(pk=job_id)
        # A drain's pending stop gives way: it meant "run it elsewhere", yet
        # the job now ends for good. Left as it was, a job whose every task
        # a drain was stopping kept no mark of the reclaim and ended
        # "stopped by a user" (_maybe_finish_stopping).
        TaskAttempt.objects.filter(job=job, state__in=ACTIVE_TASK_STATES, stop_reason=ExitType.NODE_DRAINED).update(
            stop_reason=ExitType.IDLE_GPUS)
        _stop_attempt_tasks(job, ExitType.IDLE_GPUS, stops)
        _maybe_finish_stopping(job.pk, now)
        transaction.on_commit(lambda: _send_stops(stops), robust=True)
    return True


def _send_stops(stops: list[tuple[str, int]]) -> None:
    """After commit, robustly (an error is logged, not raised): the stop is
    in the database, and what Redis loses the agents repair (a running
    task's stop at their reconciliation, a pass when jobs wait with none).
    Raised, it answered 500 to a stop that was made, and cut an exit
    report off half way (tests/test_lifecycle_without_redis.py)."""
    for node_name, attempt_id in stops:
        queues.enqueue_stop(node_name, attempt_id)
    if stops:
        queues.request_schedule()


def _stop_attempt_tasks(job: Job, reason: str, stops: list[tuple[str, int]]) -> None:
    """Stop every active task of the job: unlaunched ones in the database,
    launched ones by asking their node agents (collected in `stops`)."""
    now = db_clock.now()
    active = TaskAttempt.objects.filter(job=job, state__in=ACTIVE_TASK_STATES)
    # Locked as listed: an agent's claim of one for launch (which takes no
    # job lock) committed between the list and the UPDATE would leave a
    # starting container whose GPUs and ports the next pass hands out again.
    unlaunched = list(active.filter(state=TaskState.ASSIGNED).select_for_update().values_list("pk", flat=True))
    if unlaunched:
        TaskAttempt.objects.filter(pk__in=unlaunched, state=TaskState.ASSIGNED).update(
            state=TaskState.STOPPED, exit_type=reason, stop_reason=reason, finished_at=now,
            exit_reason="stopped before it was launched",
        )
        _release(unlaunched)
    launched = active.filter(state__in=(TaskState.LAUNCHING, TaskState.RUNNING))
    launched.filter(stop_reason="").update(stop_reason=reason)
    stops.extend(launched.values_list("node_name", "pk"))


# A stop names no task, as OpenPAI's stops do not; unlike OpenPAI (whose
# trigger is then null) the message still says who ended the job.
IDLE_GPUS_TRIGGER = Trigger("stopped by the platform: its GPUs stayed idle past the cluster's grace period")


def _maybe_finish_stopping(job_id: int, now: datetime) -> None:
    job = Job.objects.get(pk=job_id)
    if job.state != State.STOPPING:
        return
    if TaskAttempt.objects.filter(job=job, state__in=ACTIVE_TASK_STATES).exists():
        return
    # Reclaimed first: a user's stop asked meanwhile changes nothing of why.
    if TaskAttempt.objects.filter(job=job, number=job.attempt_number, stop_reason=ExitType.IDLE_GPUS).exists():
        _finish_job(job, State.STOPPED, ExitType.IDLE_GPUS, ExitType.IDLE_GPUS.label, None, now, IDLE_GPUS_TRIGGER)
        return
    who = job.stop_requested_by.username if job.stop_requested_by else "a user"
    reason = f"stopped by {who}"
    _finish_job(job, State.STOPPED, ExitType.USER_STOP, reason, None, now, Trigger(reason))


def _trigger_columns(trigger: Trigger) -> dict[str, str | int | None]:
    """A trigger as the columns Job and JobAttempt store it in."""
    return {"exit_trigger_message": trigger.message, "exit_trigger_role": trigger.role,
            "exit_trigger_index": trigger.index}


def _finish_job(job: Job, state: str, exit_type: str, reason: str, exit_code: int | None, now: datetime,
                trigger: Trigger) -> None:
    """`job` as read under its row lock: its state is the one it leaves."""
    ended = {"state": state, "exit_type": exit_type, "exit_reason": reason, "exit_code": exit_code,
             "finished_at": now, **_trigger_columns(trigger)}
    finished = Job.objects.filter(pk=job.pk).exclude(state__in=FINAL_STATES).update(**ended, waiting_reason="")
    if finished:
        notifications.job_state_changed(job=job, previous=job.state, state=state, reason=reason, at=now,
                                        trigger=trigger)
    JobAttempt.objects.filter(job=job, number=job.attempt_number).exclude(state__in=FINAL_STATES).update(**ended)
    _free_subnet_if_idle(job.pk, job.attempt_number)


def _release(attempt_ids: list[int]) -> None:
    GpuAllocation.objects.filter(attempt_id__in=attempt_ids).delete()
    PortAllocation.objects.filter(attempt_id__in=attempt_ids).delete()


def _free_subnet_if_idle(job_id: int, number: int) -> None:
    """A job attempt's subnet returns to the pool once none of its tasks
    holds an address in it."""
    if not TaskAttempt.objects.filter(job_id=job_id, number=number, state__in=ACTIVE_TASK_STATES).exists():
        JobAttempt.objects.filter(job_id=job_id, number=number).exclude(
            state__in=(State.WAITING, State.RUNNING, State.STOPPING)
        ).update(subnet="")


# -------------------------------------------------------------- task lifecycle


def attempt_claim_launch(attempt_id: int) -> bool:
    """The node agent takes an assigned task to launch it; False if someone
    else did, or it was stopped meanwhile."""
    return TaskAttempt.objects.filter(pk=attempt_id, state=TaskState.ASSIGNED).update(
        state=TaskState.LAUNCHING, launched_at=db_clock.now()
    ) == 1


def attempt_unclaim(attempt_id: int) -> bool:
    """Give a launch back (the agent died mid-launch) so it is tried again;
    False if it was not. One whose job was stopped meanwhile ends stopped
    instead: the stop was asked of the agent that died, and only it knew."""
    cut_off = TaskAttempt.objects.filter(pk=attempt_id, state=TaskState.LAUNCHING, container_id="")
    if cut_off.filter(stop_reason="").update(state=TaskState.ASSIGNED, launched_at=None) == 1:
        return True
    if cut_off.exclude(stop_reason="").exists():
        attempt_record_exit(attempt_id, ContainerExit(None))  # judged by its stop_reason (_classify)
    return False


def attempt_mark_running(attempt_id: int, *, container_id: str, started_at: datetime | None = None) -> bool:
    started_at = started_at or db_clock.now()
    with transaction.atomic():
        attempt = TaskAttempt.objects.only("job_id", "number").filter(pk=attempt_id).first()
        if attempt is None:
            return False
        # The job's row first, as a stop and a recorded exit lock it: taking
        # the task's row first deadlocked with a stop asked while the task
        # was starting (PostgreSQL aborted one of the two).
        list(Job.objects.select_for_update().filter(pk=attempt.job_id).values_list("pk", flat=True))
        changed = TaskAttempt.objects.filter(pk=attempt_id, state=TaskState.LAUNCHING).update(
            state=TaskState.RUNNING, container_id=container_id, started_at=started_at, last_activity_at=started_at
        ) == 1
        if changed:
            # The earliest start, whichever task's is recorded first: the
            # agents of a job's tasks report in their own order. Not once the
            # attempt has ended (another task's exit decided it while this one
            # was starting): its end is recorded, and a start after it would
            # put the job's start past its end.
            earlier = Q(started_at__isnull=True) | Q(started_at__gt=started_at)
            Job.objects.filter(earlier, pk=attempt.job_id, attempt_number=attempt.number,
                               state__in=(State.RUNNING, State.STOPPING)).update(started_at=started_at)
            JobAttempt.objects.filter(earlier, job_id=attempt.job_id, number=attempt.number,
                                      state=State.RUNNING).update(started_at=started_at)
    return changed


@dataclass(frozen=True)
class ContainerExit:
    """What the node saw when a task's container ended."""

    exit_code: int | None
    oom_killed: bool = False
    error: str = ""
    exit_type: str = ""  # set by the platform for launch failures and lost nodes
    finished_at: datetime | None = None


def _classify(attempt: TaskAttempt, result: ContainerExit, memory_mb: int) -> tuple[str, str, str]:
    """(task state, exit type, reason in words)."""
    if result.exit_type:
        return TaskState.FAILED, result.exit_type, result.error or ExitType(result.exit_type).label
    if attempt.stop_reason == ExitType.NODE_DRAINED:
        # Stopped because an admin drained its node: a failure like a node
        # loss (it counts toward retryCount), so the job may run elsewhere,
        # even when the program caught the SIGTERM and exited with 0. The
        # container's code stays the task's, said to be its answer to the stop.
        reason = f"node drained: node {attempt.node_name} was drained by an admin"
        if result.exit_code is not None:
            reason += f"; stopped, the command exited with code {result.exit_code}"
        return TaskState.FAILED, ExitType.NODE_DRAINED, reason
    if result.exit_code == 0:
        return TaskState.SUCCEEDED, ExitType.SUCCEEDED, "exited with code 0"
    if attempt.stop_reason:
        return TaskState.STOPPED, attempt.stop_reason, ExitType(attempt.stop_reason).label
    if result.oom_killed:
        return TaskState.FAILED, ExitType.OOM, f"killed for exceeding its memory limit ({memory_mb} MB)"
    if result.error:
        return TaskState.FAILED, ExitType.PLATFORM, f"platform error: {result.error}"
    return TaskState.FAILED, ExitType.USER_EXIT, f"the command exited with code {result.exit_code}"


def attempt_record_exit(attempt_id: int, result: ContainerExit) -> bool:
    """Record how a task ended, free what it held, and decide the job.

    Returns False if the exit was already recorded (agents may report twice
    after a restart; the second report changes nothing).
    """
    stops: list[tuple[str, int]] = []
    with transaction.atomic():
        job_id = TaskAttempt.objects.filter(pk=attempt_id).values_list("job_id", flat=True).get()
        # The job's row first, then the task as it is under that lock: a stop
        # (or a drain, or the job's end) sets the task's stop_reason holding
        # the same lock, and an exit judged on a copy read before it would
        # call a stopped task the user's failure (PostgreSQL).
        job = Job.objects.select_for_update().select_related("owner").get(pk=job_id)
        attempt = TaskAttempt.objects.select_related("task").get(pk=attempt_id)
        state, exit_type, reason = _classify(attempt, result, attempt.memory_mb)
        now = result.finished_at or db_clock.now()
        updated = TaskAttempt.objects.filter(pk=attempt_id, state__in=ACTIVE_TASK_STATES).update(
            state=state, exit_type=exit_type, exit_code=result.exit_code, exit_reason=reason, finished_at=now,
            kept_for_debug=False,
        )
        if not updated:
            return False
        _release([attempt_id])
        job_attempt = JobAttempt.objects.get(job=job, number=attempt.number)
        if job.state == State.STOPPING:
            # The job's current attempt ends, whichever attempt's task this
            # was: one of an earlier attempt (stopped when that attempt
            # failed) may be reported last, its end long before this one's.
            _maybe_finish_stopping(job.pk, _attempt_end(job.pk, job.attempt_number, now))
        elif job_attempt.state == State.RUNNING and attempt.number == job.attempt_number:
            spec = job.spec
            # In the order the tasks ended (the containers' own end times), so
            # that "the first failure" is the first in time, not in index.
            results = [
                TaskResult(a.task.role, a.task.index, None if a.state in ACTIVE_TASK_STATES else a.state, a.exit_reason)
                for a in TaskAttempt.objects.filter(job=job, number=attempt.number).select_related("task")
                .order_by(F("finished_at").asc(nulls_last=True), "pk")
            ]
            # This exit is the trigger of any verdict it brings about.
            verdict = judge(spec, results, last=TaskResult(attempt.task.role, attempt.task.index, state, reason))
            if verdict is not None:
                _conclude_attempt(job, job_attempt, verdict, stops, _attempt_end(job.pk, attempt.number, now))
        _free_subnet_if_idle(job.pk, attempt.number)
        transaction.on_commit(lambda: _send_stops(stops), robust=True)
        transaction.on_commit(queues.request_schedule, robust=True)
    return True


def _attempt_end(job_id: int, number: int, now: datetime) -> datetime:
    """When a job attempt ended: its last task's end, which need not be the
    exit recorded last (each task's end is its container's, and agents
    report in their own order), nor before any of its tasks' starts."""
    latest = TaskAttempt.objects.filter(job_id=job_id, number=number).aggregate(
        end=Max("finished_at"), start=Max("started_at"))
    return max(moment for moment in (now, latest["end"], latest["start"]) if moment is not None)


def _job_exit_code(verdict: Verdict, deciding: TaskAttempt | None, exit_type: str) -> int | None:
    """The job's exit code: its program's, when the program decided the job.
    None when the platform did (a node lost or drained, our error): a drained
    task's code is only its answer to our SIGTERM, and a FAILED job with exit
    code 0 read as a contradiction. The task keeps its code."""
    if verdict.outcome == Outcome.SUCCEEDED:
        return 0
    spec = exit_spec.spec_for(exit_type)
    if deciding is None or (spec is not None and spec.causer == "PLATFORM"):
        return None
    return deciding.exit_code


def _conclude_attempt(job: Job, job_attempt: JobAttempt, verdict: Verdict, stops: list[tuple[str, int]], now: datetime) -> None:
    deciding = None
    if verdict.deciding is not None:
        deciding = TaskAttempt.objects.filter(
            job=job, number=job_attempt.number, task__role=verdict.deciding.role, task__index=verdict.deciding.index
        ).first()
    exit_type = ExitType.SUCCEEDED if verdict.outcome == Outcome.SUCCEEDED else (deciding.exit_type if deciding else ExitType.PLATFORM)
    exit_code = _job_exit_code(verdict, deciding, exit_type)
    _stop_attempt_tasks(job, ExitType.COMPLETED, stops)
    if verdict.outcome == Outcome.FAILED and job.attempt_number <= job.retry_limit and exit_spec.retried(exit_type):
        JobAttempt.objects.filter(pk=job_attempt.pk).update(
            state=State.FAILED, exit_type=exit_type, exit_code=exit_code, exit_reason=verdict.reason, finished_at=now,
            **_trigger_columns(verdict.trigger),
        )
        number = job.attempt_number + 1
        JobAttempt.objects.create(job=job, number=number)
        Job.objects.filter(pk=job.pk, state=State.RUNNING).update(
            state=State.WAITING, attempt_number=number, overtaken=0,
            waiting_reason=f"retrying (attempt {number} of {job.retry_limit + 1}) after: {verdict.reason}",
        )
        return
    state = State.SUCCEEDED if verdict.outcome == Outcome.SUCCEEDED else State.FAILED
    _finish_job(job, state, exit_type, verdict.reason, exit_code, now, verdict.trigger)


def attempt_keep_for_debug(attempt_id: int) -> None:
    TaskAttempt.objects.filter(pk=attempt_id).update(kept_for_debug=True)


def attempt_set_ssh_available(attempt_id: int, *, available: bool) -> bool:
    """Record whether the task's container can serve SSH (its node probes
    once, at the start); the first answer stays. False if one was recorded."""
    return TaskAttempt.objects.filter(pk=attempt_id, ssh_available__isnull=True).update(ssh_available=available) == 1


def attempts_note_activity(attempt_ids: Collection[int], *, now: datetime) -> int:
    """The tasks printed something: a sign of use, which idle notices read
    (access.last_activity). Runs in the log writer's transaction, beside
    the lines. Only ever moves last_activity_at forward (a terminal session
    moves it too). Returns how many tasks moved."""
    if not attempt_ids:
        return 0
    return TaskAttempt.objects.filter(
        Q(last_activity_at__isnull=True) | Q(last_activity_at__lt=now), pk__in=attempt_ids
    ).update(last_activity_at=now)




def job_delete(*, job: Job) -> None:
    """Delete a finished job with its tasks and logs; its name is free again."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if not job.is_final:
            raise JobStateError(f"only a finished job can be deleted; this one is {job.get_state_display()}: stop it first")
        if TaskAttempt.objects.filter(job=job, state__in=ACTIVE_TASK_STATES).exists():
            raise JobStateError("the job's last tasks are still stopping; try again in a few seconds")
        job.delete()
