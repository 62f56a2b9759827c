"""What each way a job can end means, and what its user can do about it.

OpenPAI answers a job's status with an "exit spec" for its exit code
(`jobStatus.appExitSpec`: a phrase, who caused it, whether a retry can help,
and what to do), and its web portal shows it as the job's exit reason. This
portal records how a job ended as an ExitType rather than as a table of
platform codes, so the spec is keyed by that; `code` is the exit code the
task itself gave, when it gave one. The job page shows the same advice,
worded for the ended job it stands under (solution_on_job_page).

Pure: a table and lookups, no database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.models import ExitType

# OpenPAI's categories, which its clients (and retryDetails) group by.
USER_SUCCESS = "USER_SUCCESS"
USER_STOP = "USER_STOP"
USER_FAILURE = "USER_FAILURE"
PLATFORM_FAILURE = "PLATFORM_FAILURE"


@dataclass(frozen=True)
class ExitSpec:
    phrase: str
    type: str
    causer: str  # USER or PLATFORM: whose doing the end was
    stage: str  # LAUNCHING, RUNNING or COMPLETING
    behavior: str  # TRANSIENT (another try may pass), PERMANENT or UNKNOWN
    reaction: str  # what the portal does: RETRY_TO_MAX (up to retryCount) or NEVER_RETRY
    reason: str
    solution: tuple[str, ...] = ()


_RETRY_OR_RESUBMIT = "With a retryCount above 0 the job is tried again by itself; otherwise submit it again."
_READ_LOGS = "Read the failed task's stderr and stdout logs on the job page."
_FIX_AND_RESUBMIT = "Fix the command or its input and submit the job again."
_EXIT_MESSAGE = "The exit message says what failed."
_REGISTRY_ANSWER = "The exit message gives the registry's answer."

SPECS: dict[str, ExitSpec] = {
    ExitType.SUCCEEDED: ExitSpec(
        "Succeeded", USER_SUCCESS, "USER", "COMPLETING", "UNKNOWN", "NEVER_RETRY",
        "The tasks the job's completion policy waits for exited with code 0."),
    ExitType.USER_EXIT: ExitSpec(
        "CommandExitedNonZero", USER_FAILURE, "USER", "RUNNING", "UNKNOWN", "RETRY_TO_MAX",
        "A task's command exited with a non-zero code.",
        (_READ_LOGS, _FIX_AND_RESUBMIT)),
    # Never retried, as in OpenPAI (its exit code 196): the same memory limit
    # would kill the same program again.
    ExitType.OOM: ExitSpec(
        "ContainerOOMKilled", USER_FAILURE, "USER", "RUNNING", "PERMANENT", "NEVER_RETRY",
        "A task used more memory than its task role asks for and was killed.",
        ("Ask for more memory: memoryMB in the task role (resourcePerInstance.memoryMB or a larger skuType "
         "in protocol v2).",
         "Or make the program use less: a smaller batch or dataset shard.")),
    ExitType.IMAGE_PULL: ExitSpec(
        "ImagePullFailed", USER_FAILURE, "USER", "LAUNCHING", "UNKNOWN", "RETRY_TO_MAX",
        "The node could not pull the task's Docker image.",
        ("Check the image's name and tag.",
         "For a private registry, check its credentials (authFile, or the dockerimage prerequisite's auth).",
         _REGISTRY_ANSWER)),
    ExitType.NODE_LOST: ExitSpec(
        "NodeLost", PLATFORM_FAILURE, "PLATFORM", "RUNNING", "TRANSIENT", "RETRY_TO_MAX",
        "The node running a task stopped answering.",
        ("Nothing in the job needs changing.", _RETRY_OR_RESUBMIT)),
    ExitType.NODE_DRAINED: ExitSpec(
        "NodeDrained", PLATFORM_FAILURE, "PLATFORM", "RUNNING", "TRANSIENT", "RETRY_TO_MAX",
        "An admin took the node running a task out of service.",
        ("Nothing in the job needs changing.", _RETRY_OR_RESUBMIT)),
    ExitType.PLATFORM: ExitSpec(
        "PlatformError", PLATFORM_FAILURE, "PLATFORM", "LAUNCHING", "UNKNOWN", "RETRY_TO_MAX",
        "The portal or a node failed to start or follow a task.",
        (_EXIT_MESSAGE, _RETRY_OR_RESUBMIT,
         "If it happens again, tell the cluster's admin.")),
    ExitType.USER_STOP: ExitSpec(
        "StoppedByUser", USER_STOP, "USER", "RUNNING", "PERMANENT", "NEVER_RETRY",
        "The job's user or an admin stopped it."),
    ExitType.COMPLETED: ExitSpec(
        "StoppedAsJobCompleted", USER_SUCCESS, "USER", "COMPLETING", "PERMANENT", "NEVER_RETRY",
        "The task was stopped because its job's completion policy had already decided the job."),
    ExitType.IDLE_GPUS: ExitSpec(
        "IdleGpusReclaimed", USER_STOP, "USER", "RUNNING", "PERMANENT", "NEVER_RETRY",
        "The job's GPUs sat idle for longer than the cluster allows, so the portal stopped it.",
        ("Ask only for the GPUs the program uses (gpuNumber, or resourcePerInstance.gpu in protocol v2).",
         "Check that the program really runs on the GPU: a CPU-only framework build leaves it idle.")),
}


def spec_for(exit_type: str) -> ExitSpec | None:
    """The spec of an ended job, attempt or task; None while it has not ended."""
    return SPECS.get(exit_type) if exit_type else None


def retried(exit_type: str) -> bool:
    """Whether a job attempt that failed so is tried again (retryCount allowing)."""
    spec = spec_for(exit_type)
    return spec is None or spec.reaction == "RETRY_TO_MAX"


# The job page shows the steps under the ended job itself: its exit message
# is just above them, its logs below, and a Clone button at the top.
_ON_THE_JOB_PAGE = {
    _READ_LOGS: "Read the failed task's stderr and stdout in Logs below.",
    _FIX_AND_RESUBMIT: "Fix the command or its input, then Clone the job to submit it again.",
    _EXIT_MESSAGE: "The message above says what failed.",
    _REGISTRY_ANSWER: "The message above gives the registry's answer.",
}


def solution_on_job_page(exit_type: str, *, retries: int, retry_limit: int) -> tuple[str, ...]:
    """`solution` worded for the page of the job that ended so. Its retries
    are over by then, so "tried again by itself" becomes what happened to
    this job, and what to do now."""
    spec = spec_for(exit_type)
    if spec is None:
        return ()
    retry = _retry_on_job_page(retries, retry_limit)
    return tuple(retry if step == _RETRY_OR_RESUBMIT else _ON_THE_JOB_PAGE.get(step, step) for step in spec.solution)


def _retry_on_job_page(retries: int, retry_limit: int) -> str:
    if retries:
        times = "once" if retries == 1 else f"{retries} times"
        return f"It was already tried again {times}, as its retryCount allows; Clone the job to run it again."
    if retry_limit:
        return "Clone the job to run it again."
    return ("Clone the job to run it again. With a retryCount above 0, the portal tries a job again by itself "
            "after such a failure.")


def as_openpai(exit_type: str, exit_code: int | None) -> dict[str, Any] | None:
    """`appExitSpec` / `containerExitSpec` as OpenPAI's clients read it."""
    spec = spec_for(exit_type)
    if spec is None:
        return None
    return {
        "code": exit_code, "phrase": spec.phrase, "causer": spec.causer,
        "type": spec.type, "stage": spec.stage, "behavior": spec.behavior, "reaction": spec.reaction,
        "reason": spec.reason, "repro": [], "solution": list(spec.solution),
    }


def retry_details(retried_exit_types: list[str]) -> dict[str, int]:
    """OpenPAI's retryDetails from the exit types of the attempts that were
    retried: `user` counts those the user's job caused, `platform` the rest
    (every retry counts toward retryCount here, whichever it was)."""
    user = sum(1 for exit_type in retried_exit_types
               if (spec := spec_for(exit_type)) is not None and spec.type == USER_FAILURE)
    return {"user": user, "platform": len(retried_exit_types) - user, "resource": 0}
