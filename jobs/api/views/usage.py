"""Usage samples of a job's tasks: CPU, memory, network, block I/O and GPUs
(jobs/services/usage.py). For the job's owner and admins; anyone else gets
the same 404 as for a job that does not exist, anonymous callers a 401.

- v1: `user/{user}/jobs/{name}/tasks/{role}/{index}/metrics` (and v2's
  `jobs/{user}~{name}/tasks/...`) -> one task's samples (what the job page
  of a big job draws for the task picked in its menu);
- v2: `jobs/{user}~{name}/metrics` -> every task of the job's current attempt
  (what the job page's graphs of a small job draw);
- v2: `jobs/{user}~{name}/metrics/summary` -> the attempt's tasks added up
  per time bucket over a `window` of seconds (jobs/services/usage_series.py;
  what the job page's job-wide graphs of a big job draw).

All take `since` (ISO-8601): only samples (buckets) after it, so a client
that polls passes the time of the last one it has.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.dateparse import parse_datetime

from jobs.api.auth import Access
from jobs.formatting import utc_millis
from jobs.api.errors import invalid
from jobs.api.http import handler, ok, optional_int_param, resource
from jobs.api.views.jobs import find_job
from jobs.api.views.tasks import _asked_attempt, _task
from jobs.models import TaskAttempt, TaskUsage
from jobs.services import usage, usage_series


def _since(request: HttpRequest) -> datetime | None:
    raw = request.GET.get("since", "").strip()
    if not raw:
        return None
    try:
        parsed = parse_datetime(raw.replace(" ", "+"))  # a "+" left unescaped in a query string arrives as " "
    except ValueError:
        parsed = None
    if parsed is None:
        raise invalid(f"since must be an ISO-8601 time such as 2026-05-04T10:11:12Z, got {raw!r}.")
    try:
        return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except OverflowError:  # 9999-12-31T23:59-01:00 is after the last moment a time can hold
        raise invalid(f"since must be a time between the years 1 and 9999 in UTC, got {raw!r}.") from None


@handler(Access.USER)
def _task_metrics(request: HttpRequest, username: str, name: str, role: str, index: str) -> HttpResponse:
    job = find_job(request, username, name)
    task = _task(job.pk, role, index)
    since = _since(request)
    attempt = _asked_attempt(request, task)
    if attempt is None:
        return ok({"attempt": None, "taskState": "WAITING", "samples": []})
    samples = usage.task_samples(attempt.pk, since=since)
    return ok({"attempt": attempt.number, "taskState": attempt.state,
               "samples": [usage.sample_json(row) for row in samples]})


def _task_json(attempt: TaskAttempt, samples: list[TaskUsage], idle: set[int]) -> dict[str, Any]:
    return {
        "taskRole": attempt.task.role, "taskIndex": attempt.task.index, "attempt": attempt.number,
        "state": attempt.state, "node": attempt.node_name, "gpus": attempt.gpus,
        # Simulated GPUs are scheduled but report nothing: no GPU figures, ever.
        "gpusSimulated": bool(attempt.node and attempt.node.gpus_simulated),
        "idleGpus": attempt.pk in idle,
        "samples": [usage.sample_json(row) for row in samples],
    }


@handler(Access.USER)
def _job_metrics(request: HttpRequest, username: str, name: str) -> HttpResponse:
    job = find_job(request, username, name)
    since = _since(request)
    number = optional_int_param(request.GET, "attempt", minimum=1, maximum=10**6) or job.attempt_number
    attempts = list(TaskAttempt.objects.filter(job=job, number=number).select_related("task", "node")
                    .order_by("task__role", "task__index"))
    idle = usage.idle_attempt_ids(a.pk for a in attempts)
    limit = usage.samples_per_task(len(attempts))
    samples = usage.tasks_samples([a.pk for a in attempts], since=since, limit=limit)
    return ok({"job": f"{job.owner.username}~{job.name}", "state": job.state, "attempt": number,
               "sampleSeconds": usage.sample_seconds(), "samplesPerTask": limit,
               "tasks": [_task_json(attempt, samples[attempt.pk], idle) for attempt in attempts]})


def _spread_json(spread: usage_series.Spread | None) -> dict[str, float] | None:
    if spread is None:
        return None
    return {"mean": round(spread.mean, 2), "min": round(spread.least, 2), "max": round(spread.most, 2)}


def _bucket_json(bucket: usage_series.Bucket) -> dict[str, Any]:
    return {"time": utc_millis(bucket.start), "tasks": bucket.tasks, "cpuCores": round(bucket.cpu_cores, 3),
            "cpuPercent": _spread_json(bucket.cpu_percent), "memoryBytes": bucket.memory_bytes,
            "gpus": bucket.gpus, "gpuPercent": _spread_json(bucket.gpu_percent)}


@handler(Access.USER)
def _job_metrics_summary(request: HttpRequest, username: str, name: str) -> HttpResponse:
    job = find_job(request, username, name)
    since = _since(request)
    window = optional_int_param(request.GET, "window", minimum=usage_series.MIN_WINDOW,
                                maximum=usage_series.max_window_seconds())
    number = optional_int_param(request.GET, "attempt", minimum=1, maximum=10**6) or job.attempt_number
    tasks = TaskAttempt.objects.filter(job=job, number=number).count()
    window = window or usage_series.DEFAULT_WINDOW
    series = usage_series.job_series(job_id=job.pk, number=number, window_seconds=window, since=since, tasks=tasks)
    return ok({"job": f"{job.owner.username}~{job.name}", "state": job.state, "attempt": number,
               "taskCount": tasks, "maxWindow": usage_series.max_window_seconds(),
               "sampleSeconds": usage.sample_seconds(), "window": window, "bucketSeconds": series.width,
               "from": utc_millis(series.start), "until": utc_millis(series.end),
               "buckets": [_bucket_json(bucket) for bucket in series.buckets]})


task_metrics = resource(GET=_task_metrics)
job_metrics = resource(GET=_job_metrics)
job_metrics_summary = resource(GET=_job_metrics_summary)
