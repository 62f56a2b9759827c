"""Our models in OpenPAI's v1 shapes.

Times are milliseconds since the epoch, as OpenPAI sent them. `subState`
says more than `state`: QUEUED or RETRY_WAITING while waiting, LAUNCHING or
RUNNING while running, STOPPING, and for a finished job how it ended
(SUCCEEDED, USER_EXIT, OOM, IMAGE_PULL, NODE_LOST, USER_STOP, PLATFORM).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from jobs import exit_spec
from jobs.models import FINAL_STATES, ExitType, Job, JobAttempt, State, Task, TaskAttempt, User
from jobs.services.cluster import Amount, SkuType, VcUsage

# The fields a job list needs; the heavy ones (config, keys) stay in the database.
LIST_FIELDS = (
    "id", "name", "state", "attempt_number", "submitted_at", "finished_at", "started_at", "exit_code", "exit_type",
    "stop_requested_at", "total_gpus", "total_tasks", "total_roles", "owner__username", "virtual_cluster__name",
)


def millis(moment: datetime | None) -> int | None:
    return int(moment.timestamp() * 1000) if moment else None


def sub_state(job: Job, *, launching: bool = False) -> str:
    if job.state == State.WAITING:
        return "RETRY_WAITING" if job.attempt_number > 1 else "QUEUED"
    if job.state == State.RUNNING:
        return "LAUNCHING" if launching else "RUNNING"
    if job.state == State.STOPPING:
        return "STOPPING"
    return job.exit_type or job.state


def execution_type(job: Job) -> str:
    stopped = job.stop_requested_at is not None or job.exit_type == ExitType.USER_STOP
    return "STOP" if stopped else "START"


def jobs_for_list(jobs: QuerySet[Job]) -> QuerySet[Job]:
    return jobs.select_related("owner", "virtual_cluster").only(*LIST_FIELDS)


def job_summary(job: Job) -> dict[str, Any]:
    return {
        "name": job.name,
        "username": job.owner.username,
        "state": job.state,
        "subState": sub_state(job),
        "executionType": execution_type(job),
        "retries": job.retries,
        "createdTime": millis(job.submitted_at),
        "completedTime": millis(job.finished_at),
        "appExitCode": job.exit_code,
        "virtualCluster": job.virtual_cluster.name,
        "totalGpuNumber": job.total_gpus,
        "totalTaskNumber": job.total_tasks,
        "totalTaskRoleNumber": job.total_roles,
    }


def gpu_bitmap(indices: list[int]) -> int:
    """OpenPAI's containerGpus: bit i set when GPU i is the task's."""
    bitmap = 0
    for index in indices:
        bitmap |= 1 << int(index)
    return bitmap


def latest_attempts(job: Job) -> dict[int, TaskAttempt]:
    """Each task's container in the job's current attempt (or, while a retry
    waits to be placed, in the latest attempt that has one), by task id.

    Only the newest two job attempts that have containers are read: a job
    is placed whole, so they hold every task's latest, and a job of 1,000
    tasks and 100 retries is not read whole on each status call."""
    attempts = TaskAttempt.objects.filter(job=job)
    numbers = list(attempts.order_by("-number").values_list("number", flat=True).distinct()[:2])
    latest: dict[int, TaskAttempt] = {}
    if not numbers:  # never placed yet
        return latest
    for attempt in attempts.filter(number__in=numbers).order_by("number", "id"):
        latest[attempt.task_id] = attempt
    return latest


# OpenPAI's task states are WAITING, RUNNING, STOPPING, STOPPED, SUCCEEDED,
# FAILED and UNKNOWN: a task placed but not started yet is WAITING there
# (the job's subState says LAUNCHING).
API_TASK_STATE = {"ASSIGNED": "WAITING", "LAUNCHING": "WAITING"}


def task_status(task: Task, attempt: TaskAttempt | None, log_url: str) -> dict[str, Any]:
    if attempt is None:
        return {
            "taskIndex": task.index, "taskState": "WAITING", "containerId": None, "containerIp": None,
            "containerNodeName": None, "containerPorts": {}, "containerGpus": 0, "containerLog": log_url,
            "containerExitCode": None, "containerExitSpec": None, "containerExitDiagnostics": None,
            "createdTime": None, "launchedTime": None, "completedTime": None, "attempt": None,
        }
    return {
        "taskIndex": task.index,
        "taskState": API_TASK_STATE.get(attempt.state, attempt.state),
        "containerId": attempt.container_id or None,
        "containerIp": attempt.host_ip or None,
        "containerNodeName": attempt.node_name or None,
        "containerPorts": {label: ",".join(str(p) for p in ports) for label, ports in sorted(attempt.ports.items())},
        "containerGpus": gpu_bitmap(attempt.gpus),
        "containerLog": log_url,
        "containerExitCode": attempt.exit_code,
        "containerExitSpec": exit_spec.as_openpai(attempt.exit_type, attempt.exit_code),
        "containerExitDiagnostics": attempt.exit_reason or None,
        "createdTime": millis(attempt.assigned_at),
        "launchedTime": millis(attempt.started_at),
        "completedTime": millis(attempt.finished_at),
        "attempt": attempt.number,
    }


def job_status(job: Job, task_roles: dict[str, Any], *, retried_exit_types: list[str],
               page_url: str) -> dict[str, Any]:
    """A job's status; `retried_exit_types` are how its earlier attempts
    ended, `page_url` its page (OpenPAI's appTrackingUrl: where to follow
    the job in a browser)."""
    launching = any(
        status["taskState"] not in ("RUNNING", "SUCCEEDED", "FAILED", "STOPPED")
        for role in task_roles.values() for status in role["taskStatuses"]
    )
    return {
        "name": job.name,
        "jobStatus": {
            "username": job.owner.username,
            "state": job.state,
            "subState": sub_state(job, launching=launching),
            "executionType": execution_type(job),
            "retries": job.retries,
            "retryDetails": exit_spec.retry_details(retried_exit_types),
            "createdTime": millis(job.submitted_at),
            "completedTime": millis(job.finished_at),
            "appId": f"{job.pk}-{job.attempt_number}",  # the current attempt's
            "appProgress": 1 if job.is_final else 0,
            "appTrackingUrl": page_url,
            "appLaunchedTime": millis(job.started_at),
            "appCompletedTime": millis(job.finished_at),
            "appExitCode": job.exit_code,
            "appExitSpec": exit_spec.as_openpai(job.exit_type, job.exit_code),
            "appExitDiagnostics": job.exit_reason or job.waiting_reason or "",
            **exit_trigger(job),
            "appExitMessages": exit_messages(job),
            "appExitType": job.exit_type or None,
            "virtualCluster": job.virtual_cluster.name,
        },
        "taskRoles": task_roles,
    }


def exit_trigger(ended: Job | JobAttempt) -> dict[str, Any]:
    """OpenPAI's appExitTrigger* of a job or job attempt: the completion rule
    that ended it and the task that fired it (no task for a stop). All null
    until it ends, and for one that ended before they were recorded."""
    return {
        "appExitTriggerMessage": ended.exit_trigger_message or None,
        "appExitTriggerTaskRoleName": ended.exit_trigger_role or None,
        "appExitTriggerTaskIndex": ended.exit_trigger_index,  # 0 is a task's index, not "none"
    }


def exit_messages(ended: Job | JobAttempt) -> dict[str, Any] | None:
    """OpenPAI's appExitMessages of a job or job attempt, which its clients
    and its job page read: null until it ends. `launcher` says why in words
    (as appExitDiagnostics); `runtime` gives the exit code of the user's
    command when a task's command exiting non-zero ended it (OpenPAI's
    originalUserExitCode); `container` is null, as OpenPAI's own REST server
    answers it (a task's output is its log)."""
    if ended.state not in FINAL_STATES:
        return None
    user_exit = ended.exit_type == ExitType.USER_EXIT and ended.exit_code is not None
    return {
        "container": None,
        "runtime": {"originalUserExitCode": ended.exit_code} if user_exit else None,
        "launcher": ended.exit_reason or None,
    }


def _amount(amount: Amount) -> tuple[float, float]:
    return round(amount.used, 3), round(amount.total, 3)


def virtual_cluster(usage: VcUsage, *, allowed: bool) -> dict[str, Any]:
    cpus_used, cpus_total = _amount(usage.cpus)
    memory_used, memory_total = _amount(usage.memory_mb)
    gpus = {kind: {"used": _amount(a)[0], "total": _amount(a)[1]} for kind, a in usage.gpus.items()}
    shares = [a.used / a.total for a in (usage.cpus, usage.memory_mb, *usage.gpus.values()) if a.total > 0]
    return {
        "name": usage.name,
        "description": usage.description,
        "status": "RUNNING",
        "capacity": round(usage.capacity, 3),
        "maxCapacity": round(usage.capacity, 3),
        # The share in use of the resource this virtual cluster uses most of.
        "usedCapacity": round(100.0 * max(shares, default=0.0), 3),
        "numActiveJobs": usage.running_jobs,
        "numPendingJobs": usage.waiting_jobs,
        "numJobs": usage.running_jobs + usage.waiting_jobs,
        "resourcesUsed": {"memory": memory_used, "vCores": cpus_used, "GPUs": sum(g["used"] for g in gpus.values())},
        "resourcesTotal": {"memory": memory_total, "vCores": cpus_total, "GPUs": sum(g["total"] for g in gpus.values())},
        "gpuTypes": gpus,
        "allowed": allowed,
    }


def user(user: User, usable: list[str]) -> dict[str, Any]:
    """OpenPAI's user, whose `virtualCluster` lists every virtual cluster the
    user may submit to, comma-separated, "default" first (OpenPAI's SDK
    splits it to find where a user can run)."""
    # hasGithubPAT: OpenPAI's v1 user entries said whether a GitHub token
    # was set (PUT .../githubPAT); the portal keeps none.
    return {**user_v2(user, usable), "virtualCluster": ",".join(_default_first(usable)), "hasGithubPAT": False}


def user_v2(user: User, usable: list[str]) -> dict[str, Any]:
    """OpenPAI's v2 user: `virtualCluster` is a list (its JS SDK's IUser)."""
    return {
        "username": user.username,
        "admin": user.is_admin,
        "active": user.is_active,
        "virtualCluster": _default_first(usable),
    }


def _default_first(names: list[str]) -> list[str]:
    return sorted(names, key=lambda name: (name != "default", name))


def sku_type(unit: SkuType) -> dict[str, int]:
    """OpenPAI's resource unit: CPUs, memory in MB and GPUs of one SKU."""
    return {"cpu": unit.cpus, "memory": unit.memory_mb, "gpu": unit.gpus}
