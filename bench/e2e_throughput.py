#!/usr/bin/env python
"""Container jobs end to end: the portal against Slurm running the same containers.

    .venv/bin/python bench/e2e_throughput.py [--jobs 1000] [--clients 8] [--rounds 1]

1. The portal (bench/stack.py: gunicorn, Redis, one node agent, SQLite),
   its node offering this machine's CPUs: 8 clients, each on a keep-alive
   connection with a bearer token, POST --jobs one-task jobs (1 CPU, the
   busybox image's `true`) to /api/v1/user/<u>/jobs. The wall time runs
   from the first request to the moment every job is SUCCEEDED (any other
   end fails the bench).
2. Slurm on the same machine (bench/api_slurm.py: one node with the same
   CPUs): 8 clients run `sbatch --wrap 'docker run --rm <image> true'`
   --jobs times in all; from the first sbatch until its queue is empty, and
   every job's output file must be empty (docker prints nothing for `true`
   unless it fails).

With --rounds > 1 the sides take turns, each round on a fresh set-up, and
the medians count. Prints both wall times and
`e2e_throughput_ratio=<Slurm seconds / portal seconds>` (issue 18's target:
>= 1.0). Installs slurm-wlm and munge when missing (as api_submit_rate.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.api_slurm import Slurm, _path  # noqa: E402
from bench.api_submit_rate import Client, _ensure_slurm, _in_parallel  # noqa: E402
from bench.stack import Stack, stack_folder  # noqa: E402
from bench.submit_to_running import create_user  # noqa: E402

IMAGE = "pai-local/busybox:latest"
SLURM_LABEL = "pai.instance=bench-e2e-slurm"


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _config(name: str) -> dict:
    return {"jobName": name, "image": IMAGE,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 100, "gpuNumber": 0,
                           "command": "true"}]}


def _job_states(stack: Stack) -> dict[str, int]:
    with sqlite3.connect(f"file:{stack.var / 'portal.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
        return dict(db.execute("SELECT state, COUNT(*) FROM jobs_job WHERE name LIKE 'e2e-%' GROUP BY state"))


def portal_seconds(jobs: int, clients: int, cpus: int, round_number: int) -> float:
    stack = Stack(f"e2e-{round_number}")
    stack.env["API_SUBMISSIONS_PER_MINUTE"] = str(jobs + clients + 10)
    try:
        stack.start(agent_args=["--cpus", str(cpus), "--memory-mb", "8192", "--ports", "19000-19999"])
        password = create_user(stack)
        status, body = Client(stack.base_url).call("POST", "/api/v1/token", {"username": "bench", "password": password})
        assert status == 200, body
        token = json.loads(body)["token"]
        for i in range(clients):  # warm the workers, the image and the network; not counted
            status, body = Client(stack.base_url, token).call("POST", "/api/v1/user/bench/jobs", _config(f"warm-{i}"))
            assert status == 202, body
        _wait(lambda: _warm_done(stack, clients), 300, "the warm-up jobs")
        # Connected now: the server closes keep-alive connections left idle during the warm-up.
        connections = [Client(stack.base_url, token) for _ in range(clients)]

        def submit(index: int, numbers: list[int]) -> None:
            for number in numbers:
                status, body = connections[index].call("POST", "/api/v1/user/bench/jobs", _config(f"e2e-{number}"))
                if status != 202:
                    raise RuntimeError(f"e2e-{number}: {status} {body[:300]!r}")

        began = time.time()
        submitted = _in_parallel(clients, jobs, submit)
        _wait(lambda: sum(_job_states(stack).values()) == jobs and _finished(stack) == jobs, 3600, "every job to end")
        elapsed = time.time() - began
        states = _job_states(stack)
        if states.get("SUCCEEDED") != jobs:
            raise RuntimeError(f"not every job succeeded: {states}")
        print(f"  portal: submitted in {submitted:.1f} s, all {jobs} SUCCEEDED after {elapsed:.1f} s", flush=True)
        return elapsed
    finally:
        stack.stop()
        shutil.rmtree(stack_folder(f"e2e-{round_number}"), ignore_errors=True)


def _warm_done(stack: Stack, count: int) -> bool:
    with sqlite3.connect(f"file:{stack.var / 'portal.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
        return db.execute("SELECT COUNT(*) FROM jobs_job WHERE name LIKE 'warm-%' AND state = 'SUCCEEDED'").fetchone()[0] == count


def _finished(stack: Stack) -> int:
    states = _job_states(stack)
    return sum(n for state, n in states.items() if state in ("SUCCEEDED", "FAILED", "STOPPED"))


def slurm_seconds(jobs: int, clients: int) -> float:
    slurm = Slurm()
    try:
        slurm.start()
        command = f"docker run --rm --label {SLURM_LABEL} {IMAGE} true"

        def sbatch() -> bool:
            result = subprocess.run([_path("sbatch"), "--wrap", command], env=slurm.env, cwd=slurm.jobs_dir,
                                    capture_output=True, text=True, timeout=120)
            return result.returncode == 0 and result.stdout.startswith("Submitted batch job")

        for _ in range(clients):  # warm up, as for the portal; not counted
            assert sbatch(), "sbatch failed; see the Slurm logs"
        _wait(lambda: slurm.queued() == 0, 300, "the warm-up jobs")
        for out in slurm.jobs_dir.glob("slurm-*.out"):
            out.unlink()

        def submit(index: int, numbers: list[int]) -> None:
            for number in numbers:
                if not sbatch():
                    raise RuntimeError(f"sbatch {number} failed")

        began = time.time()
        submitted = _in_parallel(clients, jobs, submit)
        _wait(lambda: slurm.queued() == 0, 3600, "Slurm's queue to empty")
        elapsed = time.time() - began
        outputs = list(slurm.jobs_dir.glob("slurm-*.out"))
        failed = [out for out in outputs if out.stat().st_size]
        if len(outputs) != jobs or failed:
            raise RuntimeError(f"{len(outputs)} Slurm jobs wrote output files, {len(failed)} with errors, e.g. "
                               f"{failed[0].read_text()[:300] if failed else ''}")
        print(f"  slurm:  submitted in {submitted:.1f} s, all {jobs} done after {elapsed:.1f} s", flush=True)
        return elapsed
    finally:
        slurm.stop()
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={SLURM_LABEL}"], capture_output=True,
                             text=True).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)


_wait = Slurm._wait  # poll until true or fail saying what was awaited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    _ensure_slurm()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # through `finally`: stacks and daemons go too
    cpus = len(__import__("os").sched_getaffinity(0))

    portal_runs, slurm_runs = [], []
    for round_number in range(1, args.rounds + 1):
        print(f"round {round_number} (load {_load()}):", flush=True)
        portal_runs.append(portal_seconds(args.jobs, args.clients, cpus, round_number))
        print(f"  (load {_load()})", flush=True)
        slurm_runs.append(slurm_seconds(args.jobs, args.clients))
    portal, slurm = statistics.median(portal_runs), statistics.median(slurm_runs)
    print(f"portal: {args.jobs} container jobs from {args.clients} API clients to SUCCEEDED on one node "
          f"({cpus} CPUs): {portal:.1f} s, {args.jobs / portal:.1f} jobs/s (median of {args.rounds})")
    print(f"slurm:  {args.jobs} x sbatch --wrap 'docker run --rm {IMAGE} true' on one node ({cpus} CPUs): "
          f"{slurm:.1f} s, {args.jobs / slurm:.1f} jobs/s (median of {args.rounds})")
    print(f"e2e_throughput_ratio={slurm / portal:.2f}")


if __name__ == "__main__":
    main()
