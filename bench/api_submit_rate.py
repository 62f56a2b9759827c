#!/usr/bin/env python
"""Job submission throughput through the REST API, against Slurm's sbatch.

    .venv/bin/python bench/api_submit_rate.py [--jobs 1000] [--clients 8]

1. The portal as the README runs it (bench/stack.py: gunicorn with uvicorn
   workers as scripts/run starts it, Redis, one node agent, SQLite): 8
   clients, each on its own keep-alive connection with a bearer token, POST
   1,000 one-task busybox configs to /api/v1/user/<u>/jobs; every answer
   must be 202. The jobs go to a virtual cluster with no share of the
   cluster, so they are accepted, stored and announced to the scheduler
   (which runs its passes meanwhile) but never start: the figure is how fast
   the portal takes jobs, not how fast one small machine starts 1,000
   containers. With --run the jobs go to "default" instead and run on the
   node (`true`), while submissions go on.
2. Slurm on the same machine (bench/api_slurm.py: Debian's munged,
   slurmctld and slurmd, one node on 127.0.0.1, started here and stopped
   afterwards): 8 clients run `sbatch --wrap true` 1,000 times in all. Slurm
   starts those jobs as they come, as it would.

The two take turns (--rounds, 3 by default), each round on a fresh set-up,
because a shared 2-core machine's speed drifts by a fifth from minute to
minute. Prints each round, both medians and
`submit_rate_ratio=<portal jobs/s / sbatch jobs/s>` (issue 18: at least 1.5).
Installs slurm-wlm and munge when missing. Not part of the test suite.

With --baseline REV, each round also runs the portal side of commit REV
(`git archive`d under var/bench, with this interpreter and its packages),
and prints `portal_vs_baseline=` before the final line: whether a change
made submissions slower, measured in the same minutes. Slurm's rate moves
with the machine far more than the portal's (109 to 410 jobs/s on this
machine's different days), so the ratio alone cannot tell.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.api_slurm import Slurm, missing_programs  # noqa: E402
from bench.stack import ROOT, Stack, stack_folder  # noqa: E402

IMAGE = "pai-local/busybox:latest"
USER, PASSWORD, HOLD_VC = "bench", "bench-Password-1", "bench_hold"


def _setup_portal(stack: Stack) -> None:
    script = (
        "from jobs.models import User, VirtualCluster\n"
        f"user = User.objects.create_user({USER!r}, password={PASSWORD!r})\n"
        f"VirtualCluster.objects.create(name={HOLD_VC!r}, capacity=0.0).users.add(user)\n"
    )
    subprocess.run([sys.executable, "manage.py", "shell", "-v", "0", "-c", script], cwd=ROOT,
                   env=stack.env, check=True)


class Client:
    """One API client on one keep-alive HTTP connection."""

    def __init__(self, base_url: str, token: str = "") -> None:
        parts = urlsplit(base_url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body: dict) -> tuple[int, bytes]:
        self.connection.request(method, path, body=json.dumps(body), headers=self.headers)
        response = self.connection.getresponse()
        return response.status, response.read()


def _config(name: str, vc: str) -> dict:
    return {"jobName": name, "image": IMAGE, "virtualCluster": vc,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128, "gpuNumber": 0,
                           "command": "true"}]}


def _cpu_seconds(pid: int) -> float:
    """CPU time of a process and all its descendants (gunicorn's workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _in_parallel(clients: int, jobs: int, work: Callable[[int, list[int]], None]) -> float:
    """Run `work(client, job numbers)` in `clients` threads that start
    together; the seconds from the start to the last job."""
    shares = [list(range(i, jobs, clients)) for i in range(clients)]
    start = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        start.wait()
        try:
            work(index, shares[index])
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return elapsed


def _stack_name(round_number: int) -> str:
    return f"api-submit-rate-{round_number}"


def portal_rate(jobs: int, clients: int, *, run_jobs: bool, round_number: int = 1) -> float:
    # A folder per round, all removed at the end: each job's outputDir is a
    # new folder, and ext4 makes new inodes slowly for a minute after
    # thousands were deleted (an earlier round's), which would be measured.
    stack = Stack(_stack_name(round_number))
    # One token sends every job: its submissions per minute must not be what is measured.
    stack.env.setdefault("API_SUBMISSIONS_PER_MINUTE", str(jobs + clients))
    try:
        stack.start(agent_args=["--cpus", "4", "--memory-mb", "8192", "--ports", "18000-18999"])
        _setup_portal(stack)
        status, body = Client(stack.base_url).call("POST", "/api/v1/token", {"username": USER, "password": PASSWORD})
        assert status == 200, body
        token = json.loads(body)["token"]
        vc = "default" if run_jobs else HOLD_VC
        connections = [Client(stack.base_url, token) for _ in range(clients)]
        for i, client in enumerate(connections):  # warm every worker and connection; not counted
            status, body = client.call("POST", f"/api/v1/user/{USER}/jobs", _config(f"warm-{i}", HOLD_VC))
            assert status == 202, body

        def submit(index: int, numbers: list[int]) -> None:
            for number in numbers:
                status, body = connections[index].call("POST", f"/api/v1/user/{USER}/jobs", _config(f"job-{number}", vc))
                if status != 202:
                    raise RuntimeError(f"job-{number}: {status} {body[:300]!r}")

        pids = {name: process.pid for name, process in stack.processes.items()}
        before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        elapsed = _in_parallel(clients, jobs, submit)
        used = {name: (_cpu_seconds(pid) - before[name]) * 1000 / jobs for name, pid in pids.items()}
        stored = _count_jobs(stack.base_url, token)
        assert stored == jobs + clients, f"{stored} jobs stored, expected {jobs + clients}"
        # Where the machine's time went: the web workers take the requests,
        # the node agent runs the scheduling passes they trigger.
        print("portal CPU per job: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in used.items()))
        return jobs / elapsed
    finally:
        stack.stop()


def baseline_source(rev: str) -> Path:
    """The portal's code at commit `rev`, unpacked beside this checkout's."""
    folder = stack_folder("baseline-source")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"--baseline {rev}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def baseline_rate(source: Path, jobs: int, clients: int, *, run_jobs: bool) -> float:
    """The portal side of the code in `source`, run by its own bench module
    in a process of its own (its modules, settings and migrations)."""
    script = ("import sys; from bench.api_submit_rate import portal_rate; "
              "print('jobs/s', portal_rate(int(sys.argv[1]), int(sys.argv[2]), run_jobs=sys.argv[3] == 'run'))")
    done = subprocess.run([sys.executable, "-c", script, str(jobs), str(clients), "run" if run_jobs else "hold"],
                          cwd=source, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith("jobs/s "):
        raise RuntimeError(f"the baseline's portal side failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    for line in lines[:-1]:
        print(f"  baseline {line}")
    return float(lines[-1].split()[1])


def _count_jobs(base_url: str, token: str) -> int:
    client = Client(base_url, token)
    client.connection.request("GET", f"/api/v1/user/{USER}/jobs?limit=1", headers=client.headers)
    response = client.connection.getresponse()
    response.read()
    return int(response.headers["X-Total-Count"])


def sbatch_rate(jobs: int, clients: int) -> float:
    slurm = Slurm()
    try:
        slurm.start()
        for _ in range(clients):  # warm up, as for the portal; not counted
            assert slurm.sbatch(), "sbatch failed; see the Slurm logs"

        def submit(index: int, numbers: list[int]) -> None:
            for number in numbers:
                if not slurm.sbatch():
                    raise RuntimeError(f"sbatch {number} failed")

        elapsed = _in_parallel(clients, jobs, submit)
        return jobs / elapsed
    finally:
        slurm.stop()


def _ensure_slurm() -> None:
    """Install Debian's Slurm and munge when missing (as scripts/ install
    everything else: without starting their services)."""
    if not missing_programs():
        return
    if os.geteuid() != 0:
        sys.exit("missing Slurm: run as root, or apt-get install slurm-wlm munge")
    script = ROOT / "scripts" / "lib.sh"
    subprocess.run(["bash", "-c", f'source "{script}" && install_packages slurm-wlm munge'], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3,
                        help="portal and Slurm take turns this many times, each on a fresh set-up; the medians count")
    parser.add_argument("--run", action="store_true", help='submit to "default", where the jobs run (`true`)')
    parser.add_argument("--baseline", metavar="REV",
                        help="also run the portal side of this commit in every round, for portal_vs_baseline=")
    args = parser.parse_args()
    _ensure_slurm()

    portal_rates, slurm_rates, baseline_rates = [], [], []
    source = baseline_source(args.baseline) if args.baseline else None
    try:
        for round_number in range(1, args.rounds + 1):
            if source is not None:
                baseline_rates.append(baseline_rate(source, args.jobs, args.clients, run_jobs=args.run))
            portal_rates.append(portal_rate(args.jobs, args.clients, run_jobs=args.run, round_number=round_number))
            slurm_rates.append(sbatch_rate(args.jobs, args.clients))
            baseline = f", baseline {baseline_rates[-1]:.1f} jobs/s" if baseline_rates else ""
            print(f"round {round_number}: portal {portal_rates[-1]:.1f} jobs/s{baseline}, slurm {slurm_rates[-1]:.1f} "
                  "jobs/s", flush=True)
    finally:
        for round_number in range(1, args.rounds + 1):
            shutil.rmtree(stack_folder(_stack_name(round_number)), ignore_errors=True)
        if source is not None:
            shutil.rmtree(source, ignore_errors=True)
    portal, slurm = statistics.median(portal_rates), statistics.median(slurm_rates)
    print(f"portal: {args.jobs} jobs from {args.clients} clients through POST /api/v1/user/<u>/jobs: "
          f"{portal:.1f} jobs/s (median of {args.rounds})")
    print(f"slurm:  {args.jobs} jobs from {args.clients} clients with sbatch --wrap true: {slurm:.1f} jobs/s "
          f"(median of {args.rounds})")
    if baseline_rates:
        baseline = statistics.median(baseline_rates)
        print(f"baseline {args.baseline}: {baseline:.1f} jobs/s (median of {args.rounds}); "
              f"against slurm {baseline / slurm:.2f}")
        print(f"portal_vs_baseline={portal / baseline:.2f}")
    print(f"submit_rate_ratio={portal / slurm:.2f}")


if __name__ == "__main__":
    main()
