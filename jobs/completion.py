"""When is a job attempt over, and how did it end? Pure rules, no Django.

Following the reference (and FrameworkLauncher, which OpenPAI used):
  * a task role's minFailedTaskCount (default 1) failed tasks fail the job;
    null means failures of that role never fail the job;
  * a task role's minSucceededTaskCount succeeded tasks succeed the job;
    null means the job succeeds only when all its tasks have completed;
  * killAllOnCompletedTaskNumber (early spec; 0 or absent = off) completed
    tasks, of any role and any outcome, end the job;
  * otherwise the job succeeds once every task has completed.
Failure is checked before success. When the job ends, its remaining tasks
are stopped.

Each verdict also names its trigger, as OpenPAI's FrameworkController does
(a job status's appExitTrigger* fields): the rule that fired, and the task
whose completion fired it. That is the task whose exit was being judged
(`last`): every exit is judged as it is recorded, so the rule that fires
fires on it. For "all tasks completed" it is likewise the last task to
complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from jobs.spec import JobSpec


class Outcome(str, Enum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class TaskResult:
    role: str
    index: int
    # "SUCCEEDED", "FAILED", "STOPPED" or None while the task is active.
    state: str | None
    reason: str = ""


@dataclass(frozen=True)
class Trigger:
    """What ended a job attempt: a message naming the rule, and the task
    that fired it. role and index are None for an end no task caused (a
    stop)."""

    message: str
    role: str | None = None
    index: int | None = None


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str
    trigger: Trigger
    # The task whose failure decided the job, for the job's exit code: the
    # role's first to fail (`results` come in the order tasks ended), which
    # with a minFailedTaskCount above 1 need not be the trigger (the one
    # that reached the count).
    deciding: TaskResult | None = None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def judge(spec: JobSpec, results: list[TaskResult], *, last: TaskResult | None = None) -> Verdict | None:
    """The verdict on a job attempt, or None while it is still undecided.

    `results` are in the order the tasks ended (active ones last). `last` is
    the task whose completion is being judged; it is the verdict's trigger
    when the rule that fired counted it (without it, the last such task in
    `results`)."""
    by_role: dict[str, list[TaskResult]] = {role.name: [] for role in spec.task_roles}
    for result in results:
        by_role.setdefault(result.role, []).append(result)
    return (_failed_by_count(spec, by_role, last) or _succeeded_by_count(spec, by_role, last)
            or _ended_by_kill_all(spec, results, last) or _all_completed(spec, results, last))


def _trigger(message: str, counted: list[TaskResult], last: TaskResult | None) -> Trigger:
    """`last` if the rule counted it, else the last task it counted."""
    named = next((r for r in counted if last is not None and (r.role, r.index) == (last.role, last.index)),
                 counted[-1])
    return Trigger(message, named.role, named.index)


def _failed_by_count(spec: JobSpec, by_role: dict[str, list[TaskResult]], last: TaskResult | None) -> Verdict | None:
    for role in spec.task_roles:
        failed = [r for r in by_role[role.name] if r.state == "FAILED"]
        if role.min_failed_task_count is None or len(failed) < role.min_failed_task_count:
            continue
        first = failed[0]
        if role.min_failed_task_count == 1:
            reason = f"task {first.role}-{first.index} failed: {first.reason}".rstrip(": ")
        else:
            reason = (f"{_plural(len(failed), 'task')} of role {role.name} failed "
                      f"(minFailedTaskCount is {role.min_failed_task_count}); first: {first.role}-{first.index}: {first.reason}")
        message = (f"minFailedTaskCount {role.min_failed_task_count} of role {role.name} reached: "
                   f"{_plural(len(failed), 'task')} failed")
        return Verdict(Outcome.FAILED, reason, _trigger(message, failed, last), first)
    return None


def _succeeded_by_count(spec: JobSpec, by_role: dict[str, list[TaskResult]], last: TaskResult | None) -> Verdict | None:
    for role in spec.task_roles:
        succeeded = [r for r in by_role[role.name] if r.state == "SUCCEEDED"]
        if role.min_succeeded_task_count is None or len(succeeded) < role.min_succeeded_task_count:
            continue
        message = (f"minSucceededTaskCount {role.min_succeeded_task_count} of role {role.name} reached: "
                   f"{_plural(len(succeeded), 'task')} succeeded")
        return Verdict(Outcome.SUCCEEDED, f"{_plural(len(succeeded), 'task')} of role {role.name} succeeded "
                                          f"(minSucceededTaskCount is {role.min_succeeded_task_count})",
                       _trigger(message, succeeded, last))
    return None


def _ended_by_kill_all(spec: JobSpec, results: list[TaskResult], last: TaskResult | None) -> Verdict | None:
    completed = [r for r in results if r.state in ("SUCCEEDED", "FAILED")]
    kill_all = spec.kill_all_on_completed_task_number
    if not kill_all or len(completed) < kill_all:
        return None
    message = f"killAllOnCompletedTaskNumber {kill_all} reached: {_plural(len(completed), 'task')} completed"
    return Verdict(Outcome.SUCCEEDED, f"{_plural(len(completed), 'task')} completed "
                                      f"(killAllOnCompletedTaskNumber is {kill_all})",
                   _trigger(message, completed, last))


def _all_completed(spec: JobSpec, results: list[TaskResult], last: TaskResult | None) -> Verdict | None:
    if len(results) < spec.total_tasks or any(r.state is None for r in results):
        return None
    trigger = _trigger(_all_completed_message(results), results, last)
    ignored = [r for r in results if r.state == "FAILED"]
    if ignored:
        names = ", ".join(f"{r.role}-{r.index}" for r in ignored[:5])
        return Verdict(Outcome.SUCCEEDED, f"all tasks completed; {_plural(len(ignored), 'task')} failed ({names}) "
                                          f"without failing the job because {_why_failures_were_kept(spec, ignored)}",
                       trigger)
    return Verdict(Outcome.SUCCEEDED, "all tasks succeeded", trigger)


def _all_completed_message(results: list[TaskResult]) -> str:
    """'all tasks completed: 3 of 4 succeeded, 1 failed without reaching a
    minFailedTaskCount'. Stopped tasks, which a running job should not
    have, are counted apart rather than left out of the sum."""
    counts = {state: sum(1 for r in results if r.state == state) for state in ("SUCCEEDED", "FAILED", "STOPPED")}
    words = f"all tasks completed: {counts['SUCCEEDED']} of {len(results)} succeeded"
    if counts["FAILED"]:
        words += f", {counts['FAILED']} failed without reaching a minFailedTaskCount"
    if counts["STOPPED"]:
        words += f", {counts['STOPPED']} stopped"
    return words


def _why_failures_were_kept(spec: JobSpec, failed: list[TaskResult]) -> str:
    """Each failing role's own rule: null, or a count its failures stayed below."""
    reasons = []
    for role in spec.task_roles:
        count = sum(1 for r in failed if r.role == role.name)
        if not count:
            continue
        if role.min_failed_task_count is None:
            reasons.append("minFailedTaskCount is null" if len(spec.task_roles) == 1
                           else f"role {role.name}'s minFailedTaskCount is null")
        else:
            reasons.append(f"{_plural(count, 'failure')} of role {role.name} stayed below its "
                           f"minFailedTaskCount ({role.min_failed_task_count})")
    return "; ".join(reasons)
