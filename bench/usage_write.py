#!/usr/bin/env python
"""What storing a node's round of usage samples costs, with the roll-up's
marks and without.

    .venv/bin/python bench/usage_write.py [--tasks 10] [--rounds 300] [--database postgres]

A scratch database of its own (SQLite in var/bench/usage_write/, or with
`--database postgres` a PostgreSQL 15 server of its own, data in
var/bench/usage_write_postgres/), one running job of 1,000 tasks. A node
agent stores each round of its tasks' samples (`--tasks` of them, 10 by
default: a 1,000-task job over 100 nodes) with usage.samples_record: one
INSERT and, in the same transaction, one upsert of the job attempt's
minute mark (jobs/services/usage_rollup.py). Times `--rounds` rounds that
way, then as many storing the same rows with the INSERT alone (what
samples_record did before the marks), alternating so the machine's load
weighs on both alike. Prints p50/p95 milliseconds per round for each and
`usage_write_mark_p50_ms=<added by the marks>`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.stack import percentile, scratch_django  # noqa: E402

VAR = ROOT / "var" / "bench" / "usage_write"
PG_VAR = ROOT / "var" / "bench" / "usage_write_postgres"
PG_DATABASE = "bench_usage_write"


def run(tasks: int, rounds: int) -> None:
    from django.core.management import call_command
    from django.utils import timezone

    from jobs.models import TaskAttempt, TaskUsage, User
    from jobs.services import usage
    from tests.test_big_job_queries import big_job, idle_node

    call_command("migrate", verbosity=0)
    call_command("ensure_defaults", verbosity=0)
    owner = User.objects.create_user("bench", password="bench-Password-1")
    job = big_job(owner, next(idle_node()), tasks=1000, attempts=1, samples=0)
    ids = list(TaskAttempt.objects.filter(job=job).order_by("pk").values_list("pk", flat=True))[:tasks]
    start = timezone.now() - timedelta(hours=2)

    def round_of(k: int) -> list[usage.Sample]:
        at = start + timedelta(seconds=5 * k)  # a new minute every 12 rounds, as a node's
        gpus = [{"index": 0, "utilPercent": 80.0, "memoryUsedBytes": 1}]
        return [usage.Sample(attempt_id=pk, at=at, cpu_percent=50.0, memory_bytes=2**30, gpus=gpus) for pk in ids]

    def insert_only(samples: list[usage.Sample]) -> None:
        TaskUsage.objects.bulk_create([TaskUsage(attempt_id=s.attempt_id, at=s.at, cpu_percent=s.cpu_percent,
                                                 memory_bytes=s.memory_bytes, gpus=s.gpus) for s in samples])

    marked, plain = [], []
    for k in range(rounds):
        for store, times in ((usage.samples_record, marked), (insert_only, plain)):
            samples = round_of(k)
            started = time.perf_counter()
            store(samples)
            times.append((time.perf_counter() - started) * 1000)
    print(f"rounds of {tasks} samples, {rounds} each; load average {os.getloadavg()[0]:.2f}")
    for name, times in (("with the mark", marked), ("INSERT alone", plain)):
        print(f"{name:14} p50 {statistics.median(times):6.2f} ms  p95 {percentile(times, 95):6.2f} ms")
    print(f"usage_write_mark_p50_ms={statistics.median(marked) - statistics.median(plain):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    with scratch_django(VAR, "bench-usage-write", database=args.database, pg_var=PG_VAR, pg_database=PG_DATABASE):
        run(args.tasks, args.rounds)


if __name__ == "__main__":
    main()
