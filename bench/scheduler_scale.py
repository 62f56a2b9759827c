#!/usr/bin/env python
"""The scheduler at scale: 1,000 nodes of 8 GPUs, 10,000 waiting jobs.

    .venv/bin/python bench/scheduler_scale.py [--rounds 3] [--databases sqlite,postgres]
                                              [--nodes 1000] [--jobs 10000] [--profile]

The nodes are database rows only (READY, fresh heartbeats, simulated GPUs of
two types, their own addresses and port ranges); no agent runs. The jobs are
stored as submissions store them (job, first attempt, tasks, the normalized
config) over four virtual clusters, with gangs of 1, 2, 4, 8 and 16 GPUs,
some of several task roles (a parameter server beside its workers), some
asking for a GPU type.

Each round, for each database, a fresh child process fills a fresh database
and measures full scheduling passes (jobs/services/scheduling.py's
`schedule_pass`, from reading the queue to committed placements and the
launch requests sent to Redis):

- placing: the jobs wait while every node is away (a first pass reads
  them and says so), then the nodes come back and passes run until one
  places nothing; tasks placed per second over those passes (a placement
  is one task on one node, as a pod is for kube-scheduler), counted to the
  commit of the placements as the issue defines it, and also with the
  launch requests each pass then sends to the nodes' Redis queues;
- nothing fits: the queue topped up to 10,000 waiting jobs on the full
  cluster, then passes that place nothing; the median pass time (the first
  pass of a fresh process, which reads every job's config once, is printed
  apart).

Each figure also comes as CPU seconds of the scheduling process (SQLite's
work included, the PostgreSQL server's not): on a machine busy with other
work, wall-clock times grow with its load and these much less.

Rounds alternate the databases; medians over the rounds are printed, then
`placements_per_s=<N>`, the median over every round and database of tasks
placed per second to commit (higher is better). Targets: a pass over 10,000
waiting jobs when nothing fits <= 200 ms, placing >= 5,000 tasks/s.

SQLite lives in var/bench/scheduler_scale/; PostgreSQL is a server of the
bench's own (tests/postgres_server.py) with its data there too, and Redis a
server of its own on a loopback port; both are stopped by PID at the end.
`--profile` writes a cProfile of each child's passes beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.stack import configure_django, free_port  # noqa: E402

VAR = ROOT / "var" / "bench" / "scheduler_scale"
PASS_TARGET_MS = 200.0
PLACEMENT_TARGET = 5000.0
# Shares of the cluster, in percent; "default" gets the rest (25).
VCS = {"vision": 30.0, "nlp": 30.0, "research": 15.0}
USERS = 100
GPUS_PER_NODE = 8
MEASURED_IDLE_PASSES = 5


# ---------------------------------------------------------------- job shapes
def _role(name: str, tasks: int, gpus: int, cpus: int = 4, memory: int = 16000) -> dict:
    return {"name": name, "taskNumber": tasks, "cpuNumber": cpus, "memoryMB": memory, "gpuNumber": gpus,
            "command": "python train.py"}


# (weight, task roles): gangs of 1, 2, 4, 8 and 16 GPUs, some of several roles.
SHAPES: list[tuple[float, list[dict]]] = [
    (0.35, [_role("main", 1, 1)]),
    (0.10, [_role("main", 1, 2)]),
    (0.10, [_role("worker", 2, 1)]),
    (0.10, [_role("worker", 4, 1)]),
    (0.10, [_role("main", 1, 4)]),
    (0.07, [_role("main", 1, 8)]),
    (0.08, [_role("chief", 1, 2), _role("worker", 3, 2)]),
    (0.05, [_role("worker", 2, 8)]),
    (0.05, [_role("ps", 2, 0, cpus=8, memory=32000), _role("worker", 4, 4)]),
]
# gpuType asked for: mostly any type.
GPU_TYPES = [(0.8, ""), (0.15, "V100"), (0.05, "A100")]


# ------------------------------------------------------------------- parent
def _child(database: str, url: str, redis_url: str, args: argparse.Namespace, round_no: int) -> dict:
    command = [sys.executable, __file__, "--child", database, "--nodes", str(args.nodes), "--jobs", str(args.jobs),
               "--round", str(round_no)] + (["--profile"] if args.profile else [])
    env = {**os.environ, "BENCH_DATABASE_URL": url, "BENCH_REDIS_URL": redis_url}
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"the {database} round failed:\n{done.stdout}\n{done.stderr}")
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"the {database} round printed no result:\n{done.stdout}\n{done.stderr}")


def _start_redis() -> tuple[subprocess.Popen, str]:
    port, password = free_port(), secrets.token_hex(8)
    log = open(VAR / "redis.log", "ab")
    process = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--requirepass", password,
                                "--save", "", "--appendonly", "no"], stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ping = subprocess.run(["redis-cli", "-p", str(port), "--no-auth-warning", "-a", password, "ping"],
                              capture_output=True, text=True)
        if ping.stdout.strip() == "PONG":
            return process, f"redis://:{password}@127.0.0.1:{port}/0"
        time.sleep(0.1)
    process.kill()
    raise SystemExit("the bench's Redis did not start")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _postgres():
    from tests.postgres_server import PostgresServer

    server = PostgresServer(VAR / "pg", port=free_port(), password=secrets.token_hex(12))
    server.start()
    return server


def _row(label: str, values: list[float], unit: str, fmt: str = "{:.1f}") -> str:
    shown = " ".join(fmt.format(v) for v in values)
    return f"  {label:44} median {fmt.format(statistics.median(values))} {unit}   (rounds: {shown})"


def main(args: argparse.Namespace) -> None:
    shutil.rmtree(VAR, ignore_errors=True)
    VAR.mkdir(parents=True)
    databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    redis, redis_url = _start_redis()
    postgres = None
    results: dict[str, list[dict]] = {d: [] for d in databases}
    try:
        if "postgres" in databases:
            postgres = _postgres()
        for round_no in range(args.rounds):
            for database in databases if round_no % 2 == 0 else list(reversed(databases)):
                if database == "postgres":
                    name = f"sched_{round_no}"
                    postgres.create_database(name)
                    url = postgres.url(name)
                else:
                    url = f"sqlite:///{VAR / f'round{round_no}.sqlite3'}"
                result = _child(database, url, redis_url, args, round_no)
                results[database].append(result)
                print(f"round {round_no + 1} {database}: {json.dumps(result)}", flush=True)
    finally:
        if postgres is not None:
            postgres.stop()
        _stop(redis)
    _report(results, args)


def _report(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    print(f"\n{args.nodes:,} nodes x {GPUS_PER_NODE} GPUs, {args.jobs:,} waiting jobs, {args.rounds} rounds; "
          f"medians (targets: idle pass <= {PASS_TARGET_MS:.0f} ms, placing >= {PLACEMENT_TARGET:,.0f} tasks/s)")
    every_rate: list[float] = []
    every_cpu_rate: list[float] = []
    for database, rounds in results.items():
        first = rounds[0]
        print(f"{database}: placed {first['jobs_placed']:,} jobs / {first['tasks_placed']:,} tasks in "
              f"{first['placing_passes']} passes; then {first['idle_waiting']:,} waiting jobs on the full cluster")
        print(_row("pass over the queue, nothing fits", [r["idle_pass_ms"] for r in rounds], "ms"))
        # CPU seconds of this process (SQLite's work included, PostgreSQL's
        # server not): on a machine busy with other work the wall-clock
        # figures grow with the load, these much less.
        print(_row("  same, CPU time of the scheduling process", [r["idle_pass_cpu_ms"] for r in rounds], "ms"))
        print(_row("  same, first pass of a fresh process", [r["idle_first_pass_ms"] for r in rounds], "ms"))
        print(_row("placing: tasks placed per second", [r["tasks_per_s"] for r in rounds], "/s", "{:.0f}"))
        print(_row("  same, with the launch requests sent", [r["tasks_per_s_launched"] for r in rounds], "/s",
                   "{:.0f}"))
        print(_row("  same, per CPU second, to commit",
                   [r["tasks_placed"] / r["placing_cpu_s"] for r in rounds], "/s", "{:.0f}"))
        print(_row("placing: jobs placed per second", [r["jobs_per_s"] for r in rounds], "/s", "{:.0f}"))
        print(_row("placing: longest pass, to commit", [r["longest_placing_pass_ms"] for r in rounds], "ms"))
        every_rate += [r["tasks_per_s"] for r in rounds]
        every_cpu_rate += [r["tasks_placed"] / r["placing_cpu_s"] for r in rounds]
    print(f"tasks placed per CPU second of the scheduling process, to commit: median {statistics.median(every_cpu_rate):.0f}")
    print(f"placements_per_s={statistics.median(every_rate):.0f}")


# -------------------------------------------------------------------- child
def _shape_configs(rng: random.Random) -> list[tuple[str, dict]]:
    """(virtual cluster, normalized config) for each kind of job, as a
    submission stores it."""
    from django.conf import settings

    from jobs.spec import parse_config_text

    kinds = []
    for vc in ["default", *VCS]:
        for _weight, roles in SHAPES:
            for _w, gpu_type in GPU_TYPES:
                text = json.dumps({"jobName": "x", "image": "busybox", "virtualCluster": vc, "gpuType": gpu_type,
                                   "taskRoles": roles})
                spec = parse_config_text(text, user_name="user000", default_fs_uri=settings.PAI_DEFAULT_FS_URI).spec
                kinds.append((vc, spec.to_config(), spec))
    return kinds


def _fill_nodes(count: int) -> None:
    """`count` nodes, not heard from for an hour: away until `_heartbeat`."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import Node

    now = timezone.now() - timedelta(hours=1)
    Node.objects.bulk_create([
        Node(name=f"gpu-{i:04d}", address=f"10.{i // 250}.{i % 250}.10", docker_host="unix:///nowhere",
             cpus=64, memory_mb=512_000, gpus_simulated=True, port_start=20000, port_end=20999,
             gpus=[{"index": g, "type": "V100" if i % 4 else "A100"} for g in range(GPUS_PER_NODE)],
             status=Node.Status.READY, schedulable=True, last_heartbeat=now, agent_pid=1000 + i, agent_host="bench")
        for i in range(count)
    ], batch_size=500)


def _fill_jobs(count: int, rng: random.Random, kinds: list, start: int) -> None:
    """`count` waiting jobs, stored as job_store stores a submission."""
    from django.db import transaction

    from jobs.models import Job, JobAttempt, State, Task, User, VirtualCluster

    users = list(User.objects.filter(username__startswith="user").values_list("pk", flat=True))
    vcs = dict(VirtualCluster.objects.values_list("name", "pk"))
    by_vc: dict[str, list] = {}
    for vc, config, spec in kinds:
        by_vc.setdefault(vc, []).append((config, spec))
    weights = [w * t for w, _ in SHAPES for t, _ in GPU_TYPES]
    for first in range(start, start + count, 2000):
        batch = []
        for i in range(first, min(start + count, first + 2000)):
            vc = rng.choice(list(by_vc))
            config, spec = rng.choices(by_vc[vc], weights)[0]
            config = {**config, "jobName": f"job_{i}"}
            batch.append((Job(owner_id=rng.choice(users), name=f"job_{i}", virtual_cluster_id=vcs[vc],
                              state=State.WAITING, config_raw="{}", config=config, total_tasks=spec.total_tasks,
                              total_gpus=spec.total_gpus, total_roles=len(spec.task_roles),
                              gpu_type=spec.gpu_type or "", waiting_reason="waiting for the scheduler"), spec))
        with transaction.atomic():
            jobs = Job.objects.bulk_create([job for job, _ in batch])
            JobAttempt.objects.bulk_create([JobAttempt(job=job, number=1) for job in jobs])
            Task.objects.bulk_create([Task(job=job, role=role.name, index=index) for job, spec in batch
                                      for role in spec.task_roles for index in range(role.task_number)])


def _fill(nodes: int, jobs: int, rng: random.Random) -> list:
    from django.core.management import call_command

    from jobs.models import User, VirtualCluster

    call_command("migrate", verbosity=0)
    call_command("ensure_defaults", verbosity=0)
    for name, capacity in VCS.items():
        VirtualCluster.objects.update_or_create(name=name, defaults={"capacity": capacity, "open_to_all": True})
    User.objects.bulk_create([User(username=f"user{i:03d}", password="!") for i in range(USERS)])
    kinds = _shape_configs(rng)
    _fill_nodes(nodes)
    _fill_jobs(jobs, rng, kinds, 0)
    _analyze()
    return kinds


def _analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _heartbeat() -> None:
    """Every node heard from just now, as its agent's heartbeat does it
    (services/nodes.py: a lost node that is heard from is ready again);
    untimed."""
    from django.utils import timezone

    from jobs.models import Node

    Node.objects.update(last_heartbeat=timezone.now(), status=Node.Status.READY)


def _forget_specs() -> None:
    """As in a fresh process: no job's config read yet."""
    from jobs import models
    from jobs.services import scheduling

    scheduling._roles_cache.clear()
    models._spec_memo = models._SpecMemo()


class _LaunchClock:
    """Time spent sending launch requests (queues.enqueue_launches), which a
    pass does after its placements are committed."""

    def __init__(self) -> None:
        from jobs import queues

        self.seconds = self.cpu = 0.0
        send = queues.enqueue_launches

        def timed(launches: list) -> None:
            started, cpu = time.perf_counter(), time.process_time()
            try:
                send(launches)
            finally:
                self.seconds += time.perf_counter() - started
                self.cpu += time.process_time() - cpu

        queues.enqueue_launches = timed


def _timed_pass(profiler, clock: _LaunchClock, *, heartbeat: bool = True) -> tuple[int, float, float, float]:
    """(tasks placed, seconds to commit, seconds with the launch requests,
    CPU seconds of this process to commit)."""
    from jobs.services.scheduling import schedule_pass

    if heartbeat:
        _heartbeat()
    if profiler is not None:
        profiler.enable()
    clock.seconds = clock.cpu = 0.0
    cpu = time.process_time()
    started = time.perf_counter()
    placed = schedule_pass()
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if profiler is not None:
        profiler.disable()
    return placed, seconds - clock.seconds, seconds, cpu - clock.cpu


def child(args: argparse.Namespace) -> None:
    database_url, redis_url = os.environ["BENCH_DATABASE_URL"], os.environ["BENCH_REDIS_URL"]
    instance = f"bench-sched-{args.child}-{args.round}"
    configure_django(VAR / f"{args.child}-{args.round}", instance, DATABASE_URL=database_url, REDIS_URL=redis_url,
                     # room for a job network per multi-task job of a 1,000-node cluster
                     JOB_SUBNET_POOL="10.192.0.0/12")
    import cProfile

    from jobs.models import Job, State, TaskAttempt

    rng = random.Random(13 + args.round)
    started = time.perf_counter()
    kinds = _fill(args.nodes, args.jobs, rng)
    print(f"filled in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    clock = _LaunchClock()
    # The jobs wait while the nodes are away; this pass reads them and says so.
    assert _timed_pass(None, clock, heartbeat=False)[0] == 0
    placing = cProfile.Profile() if args.profile else None
    # Placing: the nodes are back; passes until one places nothing.
    pass_times, launched_times, placing_cpu = [], [], 0.0
    while True:
        placed, seconds, with_launches, cpu = _timed_pass(placing, clock)  # `placed`: tasks sent to their nodes
        if not placed:
            break
        pass_times.append(seconds)
        launched_times.append(with_launches)
        placing_cpu += cpu
    tasks_placed = TaskAttempt.objects.count()
    jobs_placed = Job.objects.filter(state=State.RUNNING).count()
    placing_seconds = sum(pass_times)
    # Nothing fits: the queue topped up to `--jobs` waiting on the full cluster.
    waiting = Job.objects.filter(state=State.WAITING).count()
    _fill_jobs(args.jobs - waiting, rng, kinds, args.jobs)
    _analyze()
    _forget_specs()
    first_placed, first_seconds, _, _ = _timed_pass(None, clock)
    idle = cProfile.Profile() if args.profile else None
    idle_times, idle_cpu = [], []
    for _ in range(MEASURED_IDLE_PASSES):
        placed, seconds, _, cpu = _timed_pass(idle, clock)
        assert placed == 0, "a pass on the full cluster placed a job"
        idle_times.append(seconds)
        idle_cpu.append(cpu)
    if args.profile:
        placing.dump_stats(str(VAR / f"placing-{args.child}-{args.round}.prof"))
        idle.dump_stats(str(VAR / f"idle-{args.child}-{args.round}.prof"))
    print(json.dumps({
        "jobs_placed": jobs_placed, "tasks_placed": tasks_placed, "placing_passes": len(pass_times),
        "tasks_per_s": round(tasks_placed / placing_seconds), "jobs_per_s": round(jobs_placed / placing_seconds),
        "tasks_per_s_launched": round(tasks_placed / sum(launched_times)),
        "longest_placing_pass_ms": round(max(pass_times) * 1000, 1),
        "idle_waiting": Job.objects.filter(state=State.WAITING).count(),
        "idle_first_pass_ms": round(first_seconds * 1000, 1), "idle_first_pass_placed": first_placed,
        "idle_pass_ms": round(statistics.median(idle_times) * 1000, 1),
        "idle_pass_cpu_ms": round(statistics.median(idle_cpu) * 1000, 1),
        "placing_cpu_s": round(placing_cpu, 3),
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--databases", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true", help="write a cProfile of the passes under var/bench")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.child:
        child(parsed)
    else:
        main(parsed)
