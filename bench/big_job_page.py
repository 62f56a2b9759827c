#!/usr/bin/env python
"""A job of 1,000 tasks on the pages and API answers its owner keeps open.

    .venv/bin/python bench/big_job_page.py [--tasks 1000] [--attempts 10] [--repeat 10] [--database postgres]

Fills a scratch SQLite database of its own (var/bench/big_job_page/, never
the portal's or the tests'; with `--database postgres` a PostgreSQL 15 server
of its own, data in var/bench/big_job_page_postgres/) with one running job of `--tasks` one-GPU
Jupyter tasks on its attempt `--attempts` (every earlier attempt failed,
each with all its task containers), the way tests/test_big_job_queries.py
makes it, then times through Django's test client, the whole request
included: the job page, the live part the page polls every 2 s (the first
page of tasks, and filtered to the failed ones), v1 and v2 status, the
v2 metrics of every task (whole, and a poll after the newest round: what
a big job's page read before its picker read one task's), one task's
metrics as the picker reads them (whole, and a poll), and the job-wide
summary over the window menu's hour, 6 hours and day, then as the page
polls it (the buckets after the newest one it has). Samples every 5 s for
an hour are rolled up as the node agents do (usage_rollup, timed per
minute), and the 23 hours before hold the roll-up's rows of a steady job
(a copy of the newest minute's each minute: rolling up 17 million samples
here would take longer than it tells); past USAGE_SUMMARY_MAX_SAMPLES the
summary reads those rows, and raw samples only for the minutes not rolled
up yet. Prints p50/p95 wall and CPU milliseconds
and the answer's size per call, then `big_job_live_poll_ms=<p95 of the live
part>`: what each open job page costs the portal every 2 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.stack import percentile, scratch_django  # noqa: E402

VAR = ROOT / "var" / "bench" / "big_job_page"
PG_VAR = ROOT / "var" / "bench" / "big_job_page_postgres"
PG_DATABASE = "bench_big_job_page"


def fill(tasks: int, attempts: int):
    from django.core.management import call_command

    from jobs.models import TaskAttempt, TaskState, User
    from jobs.services import usage_rollup
    from tests.test_big_job_queries import big_job, idle_node
    from tests.test_usage_series import hour_of_samples

    call_command("migrate", verbosity=0)
    call_command("ensure_defaults", verbosity=0)
    owner = User.objects.create_user("bench", password="bench-Password-1")
    job = big_job(owner, next(idle_node()), tasks=tasks, attempts=attempts, jupyter=True)
    newest = hour_of_samples(job)
    started = time.perf_counter()
    minutes = usage_rollup.usage_rollup(max_minutes=120)
    took = (time.perf_counter() - started) * 1000
    print(f"rolled up {minutes} minutes of {tasks:,} tasks in {took:.0f} ms: {took / max(1, minutes):.1f} ms a minute")
    day_of_minutes(job)
    # A few failed tasks, for the filter.
    TaskAttempt.objects.filter(job=job, number=attempts, task__index__in=[7, tasks // 2, tasks - 1]).update(
        state=TaskState.FAILED, exit_code=1)
    return owner, job, newest


def day_of_minutes(job) -> None:
    """The roll-up's rows for the 23 hours before the hour of samples: the
    oldest rolled-up minute's figures, once a minute."""
    from jobs.models import JobUsageMinute

    oldest = JobUsageMinute.objects.filter(job=job).order_by("minute").first()
    JobUsageMinute.objects.bulk_create([
        JobUsageMinute(job=job, number=oldest.number, minute=oldest.minute - k, tasks=oldest.tasks,
                       cpu_sum=oldest.cpu_sum, cpu_min=oldest.cpu_min, cpu_max=oldest.cpu_max,
                       memory_sum=oldest.memory_sum, gpus=oldest.gpus, gpu_sum=oldest.gpu_sum,
                       gpu_min=oldest.gpu_min, gpu_max=oldest.gpu_max) for k in range(1, 23 * 60 + 1)],
        batch_size=500)


def measure(client, path: str, repeat: int) -> tuple[list[float], list[float], int]:
    walls, cpus, size = [], [], 0
    client.get(path)  # warm the connection, the templates and the caches
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        response = client.get(path)
        cpus.append((time.process_time() - cpu) * 1000)
        walls.append((time.perf_counter() - wall) * 1000)
        assert response.status_code == 200, (path, response.status_code)
        size = len(response.content)
    return walls, cpus, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    with scratch_django(VAR, "bench-big-job-page", database=args.database, pg_var=PG_VAR, pg_database=PG_DATABASE):
        run(args)


def run(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from django.test import Client, override_settings

    from jobs.services import tokens

    started = time.perf_counter()
    owner, job, newest = fill(args.tasks, args.attempts)
    print(f"filled a job of {args.tasks:,} tasks and {args.attempts} attempts in {time.perf_counter() - started:.1f} s")
    browser = Client()
    browser.force_login(owner)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=owner, lifetime=timedelta(hours=1)).key}")
    summary = f"/api/v2/jobs/{owner.username}~{job.name}/metrics/summary"
    poll_since = api.get(summary).json()["buckets"][-2]["time"]  # what a page polling every bucket asks
    # A poll asks after the newest sample it has: the round before the newest.
    round_since = quote((newest - timedelta(seconds=5)).isoformat())
    metrics = f"/api/v2/jobs/{owner.username}~{job.name}/metrics"
    task = job.task_attempts.filter(number=job.attempt_number).select_related("task").first().task
    task_metrics = f"/api/v2/jobs/{owner.username}~{job.name}/tasks/{task.role}/{task.index}/metrics?attempt={args.attempts}"
    calls = [
        ("job page", browser, f"/jobs/{job.pk}/"),
        ("live part", browser, f"/jobs/{job.pk}/live/"),
        ("live part, failed tasks", browser, f"/jobs/{job.pk}/live/?task_state=FAILED"),
        ("v1 status", api, f"/api/v1/user/{owner.username}/jobs/{job.name}"),
        ("v2 status", api, f"/api/v2/jobs/{owner.username}~{job.name}"),
        ("v2 metrics", api, metrics),
        ("v2 metrics, a poll", api, f"{metrics}?since={round_since}"),
        ("v2 task metrics", api, task_metrics),
        ("v2 task metrics, a poll", api, f"{task_metrics}&since={round_since}"),
        ("v2 summary, an hour", api, f"{summary}?window=3600"),
        ("v2 summary, 6 hours", api, f"{summary}?window=21600"),
        ("v2 summary, a day", api, f"{summary}?window=86400"),
        ("v2 summary, a poll", api, f"{summary}?since={quote(poll_since)}"),
    ]
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'call':26} {'wall p50':>9} {'wall p95':>9} {'CPU p50':>8} {'bytes':>10}")
    live = 0.0
    # Static files by name, as the test settings serve them: no manifest to build.
    static = {"staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    for name, client, path in calls:
        with override_settings(STORAGES={"default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
                                         **static}):
            walls, cpus, size = measure(client, path, args.repeat)
        print(f"{name:26} {statistics.median(walls):8.1f}ms {percentile(walls, 95):8.1f}ms "
              f"{statistics.median(cpus):7.1f}ms {size:>10,}")
        if name == "live part":
            live = percentile(walls, 95)
    print(f"big_job_live_poll_ms={live:.1f}")


if __name__ == "__main__":
    main()
