"""Small helpers for tests that run jobs on the real test cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobs import services
from jobs.models import Job, LogLine, Stream, TaskAttempt
from tests.cluster import wait_for
from tests.services import BUSYBOX_IMAGE, DEBIAN_IMAGE

EXAMPLES = Path(__file__).parent / "data" / "examples"


def config(name: str, *roles: dict[str, Any], image: str = BUSYBOX_IMAGE, **top: Any) -> dict[str, Any]:
    return {"jobName": name, "image": image, "taskRoles": list(roles), **top}


def role(name: str = "main", command: str = "echo hello", *, tasks: int = 1, cpus: int = 1, memory: int = 256,
         gpus: int = 0, **extra: Any) -> dict[str, Any]:
    return {"name": name, "taskNumber": tasks, "cpuNumber": cpus, "memoryMB": memory, "gpuNumber": gpus,
            "command": command, **extra}


def submit(user, cfg: dict[str, Any] | str) -> Job:
    text = cfg if isinstance(cfg, str) else json.dumps(cfg)
    return services.job_submit(owner=user, config=text)


def wait_state(job: Job, *states: str, timeout: float = 60.0) -> Job:
    def reached() -> Job | None:
        job.refresh_from_db()
        return job if job.state in states else None

    try:
        return wait_for(reached, timeout=timeout, interval=0.2, what=f"job {job.name} to be {'/'.join(states)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it is {job.state}: {job.exit_reason or job.waiting_reason}\n{describe(job)}") from None


def describe(job: Job) -> str:
    lines = []
    for attempt in TaskAttempt.objects.filter(job=job).select_related("task"):
        lines.append(f"  {attempt.task} #{attempt.number} on {attempt.node_name}: {attempt.state} {attempt.exit_reason}")
        for log in LogLine.objects.filter(attempt=attempt).order_by("stream", "seq")[:20]:
            lines.append(f"    [{Stream(log.stream).label}] {log.text}")
    return "\n".join(lines)


def lines(job: Job, stream: int = Stream.STDOUT, *, role: str | None = None, index: int = 0, number: int | None = None) -> list[str]:
    attempts = TaskAttempt.objects.filter(job=job)
    if role is not None:
        attempts = attempts.filter(task__role=role, task__index=index)
    if number is not None:
        attempts = attempts.filter(number=number)
    attempt = attempts.order_by("-number", "id").first()
    assert attempt is not None, f"job {job.name} has no task attempt"
    return list(LogLine.objects.filter(attempt=attempt, stream=stream).order_by("seq").values_list("text", flat=True))


def example(name: str, **replace: Any) -> dict[str, Any]:
    """A reference example as a dict (comments stripped by our parser)."""
    from jobs import jsonc

    value = jsonc.loads((EXAMPLES / name).read_text()).value
    value.update(replace)
    return value


__all__ = ["BUSYBOX_IMAGE", "DEBIAN_IMAGE", "config", "role", "submit", "wait_state", "lines", "describe", "example"]
