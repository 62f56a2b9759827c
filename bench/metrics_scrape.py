#!/usr/bin/env python
"""A Prometheus scrape of /metrics with 1,000 running tasks on 100 nodes.

    .venv/bin/python bench/metrics_scrape.py [--tasks 1000] [--nodes 100] [--finished 20000] [--repeat 50]
    .venv/bin/python bench/metrics_scrape.py --database postgres

Fills a scratch database of its own (never the portal's or the tests'):
SQLite in var/bench/metrics_scrape/, or with `--database postgres` a
PostgreSQL 15 server of its own (tests/postgres_server.py; data in
var/bench/metrics_scrape_postgres/, started and stopped by PID), with 100 nodes of 16 GPUs (two types), 1,000
running jobs of one task each holding GPUs (with ten minutes of usage
samples each, 120,000 rows), 20,000 finished jobs and some log rows, and starts a Redis of its own on a unix socket there (the scrape
reads queue depths and pass timings from it), stopped by PID at the end.
Then it scrapes /metrics through Django's test client as an admin, the
whole request included, and prints p50/p95/max, the queries one scrape ran,
the database's plan for the per-task usage query (the one whose cost grows
with the cluster), and last `metrics_scrape_p95_ms=<N>` (target: at most 100;
the same name for both databases: the run's first lines say which).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.stack import configure_django, percentile, postgres_server  # noqa: E402

VAR = ROOT / "var" / "bench" / "metrics_scrape"
PG_VAR = ROOT / "var" / "bench" / "metrics_scrape_postgres"
PG_DATABASE = "bench_metrics_scrape"
TARGET_MS = 100.0
GPU_TYPES = ("V100", "A100")
GPUS_PER_NODE = 16


def start_redis() -> subprocess.Popen:
    socket_path = VAR / "redis.sock"
    process = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm",
                                "700", "--save", "", "--appendonly", "no", "--dir", str(VAR)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not socket_path.exists():
        if time.monotonic() > deadline or process.poll() is not None:
            raise SystemExit("redis-server did not start")
        time.sleep(0.05)
    os.environ["REDIS_URL"] = f"unix://{socket_path}?db=0"
    return process


def configure(database_url: str | None = None) -> None:
    configure_django(VAR, "bench-metrics-scrape", **({"DATABASE_URL": database_url} if database_url else {}))


def empty_postgres():
    """The bench's own PostgreSQL, started, with an empty database."""
    server = postgres_server(PG_VAR)
    server.drop_database(PG_DATABASE)
    server.create_database(PG_DATABASE)
    return server


def _nodes(count: int) -> list:
    from django.utils import timezone

    from jobs.models import Node

    now = timezone.now()
    Node.objects.bulk_create([
        Node(name=f"gpu-{i:03d}", address=f"10.0.{i // 250}.{i % 250 + 1}", docker_host="unix:///nonexistent",
             cpus=64, memory_mb=512_000, gpus=[{"index": g, "type": GPU_TYPES[i % 2]} for g in range(GPUS_PER_NODE)],
             last_heartbeat=now - timedelta(seconds=i % 5), agent_pid=1000 + i,
             status=Node.Status.READY if i % 50 else Node.Status.LOST)
        for i in range(count)])
    return list(Node.objects.order_by("name"))


def fill(tasks: int, node_count: int, finished: int) -> None:
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    from jobs.models import GpuAllocation, Job, JobAttempt, LogLine, Task, TaskAttempt, TaskUsage, User, VirtualCluster

    call_command("migrate", verbosity=0)
    call_command("ensure_defaults", verbosity=0)
    vcs = [VirtualCluster.objects.get(name="default")] + [
        VirtualCluster.objects.create(name=name, capacity=20.0, open_to_all=True) for name in ("vision", "nlp")]
    users = User.objects.bulk_create([User(username=f"user{i:02d}", password="!") for i in range(50)])
    User.objects.create(username="boss", password="!", is_superuser=True, is_staff=True)
    nodes = _nodes(node_count)
    rng = random.Random(3)
    now = timezone.now()
    config = {"jobName": "x", "image": "busybox", "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
              "memoryMB": 1024, "gpuNumber": 1, "command": "python train.py"}]}
    with transaction.atomic():
        states = ["SUCCEEDED", "FAILED", "STOPPED"]
        Job.objects.bulk_create([
            Job(owner=rng.choice(users), name=f"old_{i}", virtual_cluster=rng.choice(vcs), state=rng.choice(states),
                config_raw="{}", config=config, submitted_at=now - timedelta(minutes=i), total_tasks=1)
            for i in range(finished)], batch_size=2000)
        Job.objects.bulk_create([
            Job(owner=rng.choice(users), name=f"wait_{i}", virtual_cluster=rng.choice(vcs), state="WAITING",
                config_raw="{}", config=config, total_tasks=1) for i in range(200)])
        running = Job.objects.bulk_create([
            Job(owner=rng.choice(users), name=f"run_{i}", virtual_cluster=rng.choice(vcs), state="RUNNING",
                config_raw="{}", config=config, started_at=now, total_tasks=1, total_gpus=1) for i in range(tasks)])
        attempts = JobAttempt.objects.bulk_create([JobAttempt(job=job, number=1, state="RUNNING") for job in running])
        task_rows = Task.objects.bulk_create([Task(job=job, role="main", index=0) for job in running])
        free = [(node, g) for node in nodes for g in range(GPUS_PER_NODE)]
        rng.shuffle(free)
        placed = []
        for i, (job, attempt, task) in enumerate(zip(running, attempts, task_rows)):
            node, gpu = free[i]
            placed.append(TaskAttempt(task=task, job_attempt=attempt, job=job, number=1, node=node,
                                      node_name=node.name, state="RUNNING", gpus=[gpu],
                                      gpu_type=node.gpus[0]["type"], container_id=f"c{i:063d}", started_at=now))
        placed = TaskAttempt.objects.bulk_create(placed, batch_size=1000)
        GpuAllocation.objects.bulk_create([GpuAllocation(node=a.node, index=a.gpus[0], attempt=a) for a in placed])
        LogLine.objects.bulk_create([LogLine(attempt=placed[i % len(placed)], stream=1, seq=i // len(placed),
                                             text=f"step {i}") for i in range(20_000)], batch_size=5000)
        # Ten minutes of usage samples every 5 s per task, with GPU figures:
        # the scrape reads only the newest (jobs/services/usage.py).
        TaskUsage.objects.bulk_create([
            TaskUsage(attempt=a, at=now - timedelta(seconds=5 * k), cpu_percent=rng.uniform(0, 800),
                      memory_bytes=rng.randrange(1 << 34), network_rx_bytes=k, network_tx_bytes=k,
                      gpus=[{"index": a.gpus[0], "utilPercent": rng.uniform(0, 100), "memoryUsedBytes": 1 << 33}])
            for k in range(120) for a in placed], batch_size=5000)
    with connection.cursor() as cursor:
        # PostgreSQL: VACUUM too, as autovacuum soon does for these rows that no
        # longer change (visibility map set: index-only scans, as in production).
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")


def measure(repeat: int) -> float:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from jobs import queues
    from jobs.models import TaskAttempt, User

    from django.db.models import F, Max
    from django.utils import timezone

    from jobs.models import TaskUsage

    def refresh_samples() -> None:
        """Move the samples so the newest are as fresh as an agent's (outside the timing)."""
        TaskUsage.objects.update(at=F("at") + (timezone.now() - TaskUsage.objects.aggregate(at=Max("at"))["at"]))
        if connection.vendor == "postgresql":  # the update's dead rows gone, as autovacuum would
            with connection.cursor() as cursor:
                cursor.execute("VACUUM jobs_taskusage")

    for seconds in (0.004, 0.02, 0.02, 0.08, 0.3, 1.2):  # some passes, as agents record them
        queues.record_pass_duration(seconds)
    client = Client()
    client.force_login(User.objects.get(username="boss"))
    for _ in range(3):  # warm the connection and the page cache
        assert client.get("/metrics").status_code == 200
    times, cpu = [], []
    for _ in range(repeat):
        refresh_samples()
        started, cpu_started = time.perf_counter(), time.process_time()
        response = client.get("/metrics")
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
        assert response.status_code == 200, response.status_code
    refresh_samples()
    with CaptureQueriesContext(connection) as queries:
        body = client.get("/metrics").content
    running = TaskAttempt.objects.filter(state="RUNNING").count()
    lines = body.count(b"\n")
    print(f"running task attempts: {running:,}; response {len(body):,} bytes, {lines:,} lines; "
          f"{len(queries)} queries per scrape (session and user included)")
    usage_sql = next(q["sql"] for q in queries.captured_queries if "jobs_taskusage" in q["sql"])
    explain = "EXPLAIN ANALYZE " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "
    with connection.cursor() as cursor:
        cursor.execute(explain + usage_sql)
        plan = [" ".join(str(part) for part in row) for row in cursor.fetchall()]
    print("plan of the per-task usage query:\n  " + "\n  ".join(plan))
    p50, p95 = statistics.median(times), percentile(times, 95)
    print(f"/metrics over {repeat} scrapes: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {max(times):.1f} ms "
          f"(target p95 <= {TARGET_MS:.0f} ms); load average {os.getloadavg()[0]:.2f}")
    # Less bent by other work on the machine than the wall clock (SQLite's
    # work is in this process; PostgreSQL's server is not counted).
    print(f"CPU time of this process per scrape: p50 {statistics.median(cpu):.1f} ms")
    return p95


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--finished", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    if args.tasks > args.nodes * GPUS_PER_NODE:
        raise SystemExit(f"--tasks: at most {GPUS_PER_NODE} per node (one GPU each)")

    shutil.rmtree(VAR, ignore_errors=True)
    VAR.mkdir(parents=True)
    redis = start_redis()
    server = None
    try:
        if args.database == "postgres":
            server = empty_postgres()
            configure(server.url(PG_DATABASE))
            where = f"PostgreSQL 15, database {PG_DATABASE}"
        else:
            configure()
            where = f"SQLite, {VAR / 'portal.sqlite3'}"
        started = time.perf_counter()
        fill(args.tasks, args.nodes, args.finished)
        print(f"filled {args.nodes} nodes, {args.tasks:,} running tasks, {args.finished:,} finished jobs in "
              f"{time.perf_counter() - started:.1f} s ({where})")
        p95 = measure(args.repeat)
    finally:
        redis.send_signal(signal.SIGTERM)
        redis.wait(10)
        if server is not None:
            from django.db import connections

            connections.close_all()
            server.stop()
    print(f"metrics_scrape_p95_ms={p95:.1f}")


if __name__ == "__main__":
    main()
