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
class Verdict:
    outcome: Outcome
    reason: str
    # The task whose failure decided the job, for the job's exit code.
    deciding: TaskResult | None = None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def judge(spec: JobSpec, results: list[TaskResult]) -> Verdict | None:
    """The verdict on a job attempt, or None while it is still undecided."""
    by_role: dict[str, list[TaskResult]] = {role.name: [] for role in spec.task_roles}
    for result in results:
        by_role.setdefault(result.role, []).append(result)

    for role in spec.task_roles:
        failed = [r for r in by_role[role.name] if r.state == "FAILED"]
        if role.min_failed_task_count is not None and len(failed) >= role.min_failed_task_count:
            first = failed[0]
            if role.min_failed_task_count == 1:
                reason = f"task {first.role}-{first.index} failed: {first.reason}".rstrip(": ")
            else:
                reason = (f"{_plural(len(failed), 'task')} of role {role.name} failed "
                          f"(minFailedTaskCount is {role.min_failed_task_count}); first: {first.role}-{first.index}: {first.reason}")
            return Verdict(Outcome.FAILED, reason, first)

    for role in spec.task_roles:
        succeeded = [r for r in by_role[role.name] if r.state == "SUCCEEDED"]
        if role.min_succeeded_task_count is not None and len(succeeded) >= role.min_succeeded_task_count:
            return Verdict(Outcome.SUCCEEDED, f"{_plural(len(succeeded), 'task')} of role {role.name} succeeded "
                                              f"(minSucceededTaskCount is {role.min_succeeded_task_count})")

    completed = [r for r in results if r.state in ("SUCCEEDED", "FAILED")]
    kill_all = spec.kill_all_on_completed_task_number
    if kill_all and len(completed) >= kill_all:
        return Verdict(Outcome.SUCCEEDED, f"{_plural(len(completed), 'task')} completed "
                                          f"(killAllOnCompletedTaskNumber is {kill_all})")

    if len(results) >= spec.total_tasks and all(r.state is not None for r in results):
        ignored = [r for r in results if r.state == "FAILED"]
        if ignored:
            names = ", ".join(f"{r.role}-{r.index}" for r in ignored[:5])
            return Verdict(Outcome.SUCCEEDED, f"all tasks completed; {_plural(len(ignored), 'task')} failed ({names}) "
                                              f"without failing the job because {_why_failures_were_kept(spec, ignored)}")
        return Verdict(Outcome.SUCCEEDED, "all tasks succeeded")
    return None


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
