#!/usr/bin/env python
"""The admin dashboard's figures over a busy lab's week.

    .venv/bin/python bench/dashboard.py [--jobs-per-day 20000] [--usage-share 0.1] [--repeat 5] [--reuse]
    .venv/bin/python bench/dashboard.py --database postgres --jobs-per-day 20000

Fills a scratch database of its own (never the portal's or the tests'):
SQLite in var/bench/dashboard/, or with `--database postgres` a PostgreSQL
15 server of its own (tests/postgres_server.py; data in
var/bench/dashboard_postgres/, started and stopped by PID, filled with COPY)
with eight days (`--days`) of jobs across 200 users and 4 virtual clusters: each job
waits a few minutes (some for hours), runs from seconds to days with 1 to
16 tasks of 0 to 8 GPUs, and the last ones still wait or run. A share of
the task attempts (`--usage-share`) carries usage samples as the portal
keeps them: one-minute averages older than a day, a detailed sample every
USAGE_SAMPLE_SECONDS within it.

Then times jobs.services.dashboard.cluster_over_time for each window
(WINDOWS), at the moment the data was filled for (so that two runs over one
database give the same figures: each window's digest is printed to compare
code before and after a change), and its peak memory under tracemalloc
(a run of its own: tracing slows the call). Also times the page's cached
call (dashboard_figures) when the code has one. Prints per window p50/p95/max,
peak MiB, rows of each table, and last `dashboard_p95_ms=<p95 of the widest
window>` (`dashboard_postgres_p95_ms` on PostgreSQL; lower is better).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone as dt_timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.stack import configure_django, percentile, postgres_server  # noqa: E402

VAR = ROOT / "var" / "bench" / "dashboard"
PG_VAR = ROOT / "var" / "bench" / "dashboard_postgres"
PG_DATABASE = "bench_dashboard"
RESULT_NAMES = {"sqlite": "dashboard_p95_ms", "postgres": "dashboard_postgres_p95_ms"}
VCS = {"default": 0.0, "vision": 30.0, "nlp": 30.0, "research": 10.0}
DAYS = 8  # a week in the widest window and a day before it (--days: more history)
NODES, GPUS_PER_NODE = 250, 8
TASKS = [1, 1, 1, 2, 4, 8, 16]
GPUS = [0, 1, 1, 2, 4, 8]


def _insert(model, rows: Iterable[dict]) -> int:
    """Every row of `model` at once, ids included: COPY on PostgreSQL,
    executemany on SQLite (both about 20 times faster than the ORM's
    objects); fields a row does not give get the model's defaults."""
    from django.db import connection, transaction

    fields = model._meta.concrete_fields
    defaults = {f.attname: f.get_default() for f in fields}
    count = 0
    with transaction.atomic():
        if connection.vendor == "postgresql":
            from psycopg import sql

            columns = sql.SQL(", ").join(sql.Identifier(f.column) for f in fields)
            statement = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(model._meta.db_table), columns)
            json_fields = {f.attname for f in fields if f.get_internal_type() == "JSONField"}
            connection.ensure_connection()
            with connection.connection.cursor() as cursor, cursor.copy(statement) as copy:
                for row in rows:
                    values = {**defaults, **row}
                    copy.write_row([json.dumps(values[f.attname]) if f.attname in json_fields else values[f.attname]
                                    for f in fields])
                    count += 1
            return count
        table = connection.ops.quote_name(model._meta.db_table)
        columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
        statement = f"INSERT INTO {table} ({columns}) VALUES ({', '.join('%s' for _ in fields)})"
        batch: list[list] = []
        with connection.cursor() as cursor:
            for row in rows:
                values = {**defaults, **row}
                batch.append([f.get_db_prep_save(values[f.attname], connection) for f in fields])
                if len(batch) == 20000:
                    cursor.executemany(statement, batch)
                    count += len(batch)
                    batch.clear()
            cursor.executemany(statement, batch)
    return count + len(batch)


def _week(jobs_per_day: int, days: int, users: list[int], vcs: list[int], now: datetime, rng: random.Random
          ) -> Iterator[dict]:
    """Each job's times and shape, oldest first."""
    count = jobs_per_day * days
    for i in range(count):
        created = now - timedelta(seconds=days * 86400 * (count - i) / count + rng.random())
        wait = rng.expovariate(1 / 7200 if rng.random() < 0.1 else 1 / 300)
        started = created + timedelta(seconds=wait)
        finished = started + timedelta(seconds=min(3 * 86400, rng.lognormvariate(7.1, 1.5)))  # median ~20 min
        owner = users[min(int(rng.paretovariate(1.2)) - 1, len(users) - 1)] if rng.random() < 0.5 else rng.choice(users)
        yield dict(id=i + 1, owner=owner, vc=rng.choice(vcs), created=created,
                   started=started if started < now else None, finished=finished if finished < now else None,
                   tasks=rng.choice(TASKS), gpus=rng.choice(GPUS))


def fill(jobs_per_day: int, days: int, usage_share: float, now: datetime) -> dict[str, int]:
    from django.core.management import call_command
    from django.db import connection

    from jobs.models import Job, JobAttempt, Node, Task, TaskAttempt, User, VirtualCluster

    call_command("migrate", verbosity=0)
    call_command("ensure_defaults", verbosity=0)
    for name, capacity in VCS.items():
        VirtualCluster.objects.update_or_create(name=name, defaults={"capacity": capacity, "open_to_all": True})
    User.objects.bulk_create([User(username=f"user{i:03d}", password="!") for i in range(200)])
    Node.objects.bulk_create([Node(name=f"node{i:03d}", address=f"10.0.{i // 200}.{i % 200}", docker_host="unix:///x",
                                   gpus=list(range(GPUS_PER_NODE)), cpus=64, memory_mb=512_000) for i in range(NODES)])
    users = list(User.objects.filter(username__startswith="user").values_list("pk", flat=True))
    vcs = list(VirtualCluster.objects.values_list("pk", flat=True))
    jobs = list(_week(jobs_per_day, days, users, vcs, now, random.Random(7)))
    counts = {"jobs": _insert(Job, ({
        "id": j["id"], "owner_id": j["owner"], "name": f"job_{j['id']}", "virtual_cluster_id": j["vc"],
        "state": "SUCCEEDED" if j["finished"] else "RUNNING" if j["started"] else "WAITING", "config_raw": "{}",
        "config": {}, "submitted_at": j["created"], "started_at": j["started"], "finished_at": j["finished"],
        "total_tasks": j["tasks"], "total_gpus": j["tasks"] * j["gpus"], "total_roles": 1} for j in jobs))}
    counts["job attempts"] = _insert(JobAttempt, ({
        "id": j["id"], "job_id": j["id"], "number": 1, "state": "SUCCEEDED" if j["finished"] else "RUNNING",
        "created_at": j["created"], "started_at": j["started"], "finished_at": j["finished"]} for j in jobs))
    tasks = [(j, n, j["id"] * 16 + n) for j in jobs for n in range(j["tasks"])]
    counts["tasks"] = _insert(Task, ({"id": pk, "job_id": j["id"], "role": "main", "index": n} for j, n, pk in tasks))
    counts["task attempts"] = _insert(TaskAttempt, (_task_attempt(j, pk, now) for j, n, pk in tasks if j["started"]))
    sampled = [(j, pk) for j, n, pk in tasks if j["started"] and random.Random(pk).random() < usage_share]
    counts["usage samples"] = _usage(sampled, now)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
    return counts


def _task_attempt(job: dict, pk: int, now: datetime) -> dict:
    started = job["started"] + timedelta(seconds=5 + pk % 50)
    return {"id": pk, "task_id": pk, "job_attempt_id": job["id"], "job_id": job["id"], "number": 1,
            "state": "SUCCEEDED" if job["finished"] else "RUNNING", "gpus": list(range(job["gpus"])),
            "assigned_at": job["started"], "started_at": started if started < now else None,
            "finished_at": job["finished"], "node_name": f"node{pk % NODES:03d}"}


def _usage(sampled: list[tuple[dict, int]], now: datetime) -> int:
    """One-minute averages before the last day, detailed samples within it."""
    from django.conf import settings

    from jobs.models import TaskUsage

    detail = timedelta(seconds=settings.USAGE_SAMPLE_SECONDS)
    since = now - timedelta(hours=settings.USAGE_DETAIL_HOURS)

    def rows() -> Iterator[dict]:
        pk = 0
        for job, attempt in sampled:
            at, until = job["started"], job["finished"] or now
            while at < until:
                averaged = at < since
                pk += 1
                yield {"id": pk, "attempt_id": attempt, "at": at, "averaged": averaged,
                       "cpu_percent": 50.0 + (pk % 700), "memory_bytes": (1 + pk % 64) * 2**28}
                at += timedelta(minutes=1) if averaged else detail

    return _insert(TaskUsage, rows())


def measure(now: datetime, repeat: int) -> tuple[float, list[str]]:
    from jobs import services
    from jobs.services import dashboard

    shares = {vc.name: sum(int(amount.total) for amount in vc.gpus.values()) for vc in services.vc_usage()}
    cached = getattr(dashboard, "dashboard_figures", None)
    print(f"{'window':>8} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9} {'peak MiB':>9}  digest")
    widest, digests = 0.0, []
    for hours in dashboard.WINDOWS:
        dashboard.cluster_over_time(hours=hours, vc_gpus=shares, now=now)  # warm the page cache
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            figures = dashboard.cluster_over_time(hours=hours, vc_gpus=shares, now=now)
            times.append((time.perf_counter() - started) * 1000)
        tracemalloc.start()
        dashboard.cluster_over_time(hours=hours, vc_gpus=shares, now=now)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        digest = hashlib.sha256(json.dumps(figures, sort_keys=True).encode()).hexdigest()[:12]
        digests.append(f"{hours}h:{digest}")
        p95 = percentile(times, 95)
        widest = p95
        print(f"{hours:>7}h {statistics.median(times):9.1f} {p95:9.1f} {max(times):9.1f} {peak:9.1f}  {digest}")
        if cached is not None:
            cached(hours=hours, vc_gpus=shares)  # fills the cache
            hits = []
            for _ in range(repeat):
                started = time.perf_counter()
                cached(hours=hours, vc_gpus=shares)
                hits.append((time.perf_counter() - started) * 1000)
            print(f"{'':>8} cached: p50 {statistics.median(hits):.2f} ms, max {max(hits):.2f} ms")
    return widest, digests


def _anchor(folder: Path, reuse: bool) -> tuple[datetime, bool]:
    """The moment the stored data was filled for, when it is kept."""
    saved = folder / "anchor.json"
    if reuse and saved.exists():
        return datetime.fromisoformat(json.loads(saved.read_text())["now"]), True
    now = datetime.now(dt_timezone.utc).replace(microsecond=0)
    return now, False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=sorted(RESULT_NAMES), default="sqlite")
    parser.add_argument("--jobs-per-day", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=DAYS,
                        help="days of history (a window's read should not grow with it)")
    parser.add_argument("--usage-share", type=float, default=0.1, help="share of task attempts with usage samples")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="keep the database of an earlier run of the same size")
    args = parser.parse_args()
    folder = VAR if args.database == "sqlite" else PG_VAR
    scale = {"jobs_per_day": args.jobs_per_day, "usage_share": args.usage_share}
    if args.days != DAYS:
        scale["days"] = args.days  # databases filled before --days keep their scale
    saved = folder / "anchor.json"
    reuse = args.reuse and saved.exists() and json.loads(saved.read_text()).get("scale") == scale
    if not reuse and args.database == "sqlite":
        shutil.rmtree(VAR, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    now, reuse = _anchor(folder, reuse)
    redis = _redis(folder)
    server = postgres_server(PG_VAR) if args.database == "postgres" else None
    try:
        extra = {"REDIS_URL": redis.url}
        if server is not None:
            if not reuse:
                server.drop_database(PG_DATABASE)
                server.create_database(PG_DATABASE)
            extra["DATABASE_URL"] = server.url(PG_DATABASE)
        # The portal's folder is not the PostgreSQL server's (see bench/job_list.py).
        configure_django(VAR, "bench-dashboard", **extra)
        if reuse:
            from django.core.management import call_command

            call_command("migrate", verbosity=0)
            print(f"reused the data filled for {now:%Y-%m-%d %H:%M:%S} UTC")
        else:
            started = time.perf_counter()
            counts = fill(args.jobs_per_day, args.days, args.usage_share, now)
            saved.write_text(json.dumps({"now": now.isoformat(), "scale": scale}))
            print(f"filled in {time.perf_counter() - started:.1f} s: "
                  + ", ".join(f"{n:,} {what}" for what, n in counts.items()))
        print(f"{args.jobs_per_day:,} jobs a day for {args.days} days, {args.usage_share:g} of task attempts sampled; "
              f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        widest, digests = measure(now, args.repeat)
        print("digests:", " ".join(digests))
        print(f"{RESULT_NAMES[args.database]}={widest:.1f}")
    finally:
        from django.db import connections

        connections.close_all()
        if server is not None:
            server.stop()
        redis.stop()


class _Redis:
    """A Redis of the bench's own on loopback (the cache), stopped by PID."""

    def __init__(self, folder: Path) -> None:
        import secrets
        import subprocess

        from bench.stack import free_port

        password = secrets.token_hex(8)
        port = free_port()
        self.url = f"redis://:{password}@127.0.0.1:{port}/0"
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--requirepass", password,
             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=folder, start_new_session=True)
        import redis

        client = redis.Redis.from_url(self.url)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("the bench's Redis did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def _redis(folder: Path) -> _Redis:
    return _Redis(folder)


if __name__ == "__main__":
    main()
