#!/usr/bin/env python
"""Submission to a running container, against a bare `docker run -d`, and
where the portal's time goes.

    .venv/bin/python bench/submit_to_running.py [--jobs 15] [--rounds 3]

On an idle node of a throwaway portal (bench/stack.py): each round submits
--jobs one-task busybox jobs one after another through the REST API, each
timed from the moment the request is sent to the container's StartedAt,
and alternates them one by one with a bare `docker run -d` of the same
image and command timed the same way, so that the machine's noise falls on
both sides. Medians over all rounds (the first job of a run warms caches
and is not counted). A third series, `docker run -d` with the options the
portal gives a task's container (its isolated network, two published
ports, init, limits), shows what of the difference is the container's
set-up rather than the portal. One-task jobs run on the engine's default
bridge when dockerd was started to isolate it (`--icc=false --bridge
pai-default`, as scripts/lib.sh starts it), else on a network of ours,
whose embedded DNS costs each start 50-80 ms: the bench prints which.

The breakdown of the portal's side comes from moments recorded on the way,
each a wall-clock time on this one machine:
  web request + commit   request sent -> the API's answer (the job is committed)
  wake-up                answer -> the scheduling pass starts (Redis' last-pass mark)
  scheduling pass        pass start -> the launch request is enqueued (RQ's enqueued_at)
  launch request         enqueued -> the node agent takes it (none when the
                         agent that ran the pass takes its own node's launch)
  agent                  taken -> the container is asked for (claim, spec, image, network)
  docker create+start    asked for -> create and start returned
  state recorded         -> the container inspected (its StartedAt) and RUNNING committed
The agent writes its moments only under PAI_BENCH_TIMING_FILE (runner.py's
LaunchTiming), which this bench sets. Prints p50/p95 of both sides, the
median of each step and `submit_to_running_ratio=<portal p50 / docker p50>`
(issue 18's target: <= 1.2, and p95 <= 1.5x the bare run's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.stack import Stack, percentile  # noqa: E402
from jobs.node import launcher  # noqa: E402

IMAGE = "pai-local/busybox:latest"
COMMAND = "sleep 5"
STEPS = ("web request + commit", "wake-up", "scheduling pass", "launch request", "agent", "docker create+start",
         "state recorded")


def started_at(container_id: str) -> float:
    out = subprocess.run(["docker", "inspect", "-f", "{{.State.StartedAt}}", container_id], capture_output=True,
                         text=True, check=True).stdout.strip()
    whole, _, fraction = out.rstrip("Z").partition(".")
    moment = datetime.fromisoformat(whole + "+00:00").timestamp()
    return moment + float("0." + (fraction or "0"))


class Api:
    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base = base_url + "/api/v1"
        self.user = username
        body = self.call("POST", "/token", {"username": username, "password": password, "expiration": 3600}, auth=False)
        self.token = body["token"]

    def call(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        if auth:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
        return json.loads(text) if text else {}

    def submit(self, name: str, command: str, cpus: int = 1, memory_mb: int = 100) -> None:
        self.call("POST", f"/user/{self.user}/jobs", {
            "jobName": name, "image": IMAGE,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": cpus, "memoryMB": memory_mb, "gpuNumber": 0,
                           "command": command}],
        })

    def container(self, name: str) -> str:
        status = self.call("GET", f"/user/{self.user}/jobs/{name}")
        for role in status.get("taskRoles", {}).values():
            for task in role.get("taskStatuses", []):
                if task.get("containerId"):
                    return task["containerId"]
        return ""


def create_user(stack: Stack, username: str = "bench") -> str:
    """A user of the stack; returns its password."""
    password = "bench-password-1"
    subprocess.run([sys.executable, "manage.py", "shell", "-v", "0", "-c",
                    f"from jobs.models import User; User.objects.create_user({username!r}, password={password!r})"],
                   cwd=Path(__file__).resolve().parent.parent, env=stack.env, check=True)
    return password


def wait(predicate, timeout: float = 120.0, interval: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("timed out")


class Portal:
    """The portal's side: submit, see the container, collect the moments."""

    def __init__(self, stack: Stack, timing_file: Path) -> None:
        import redis

        self.stack = stack
        self.api = Api(stack.base_url, "bench", create_user(stack))
        self.db = sqlite3.connect(f"file:{stack.var / 'portal.sqlite3'}?mode=ro", uri=True, timeout=30,
                                  check_same_thread=False)
        self.redis = redis.Redis.from_url(stack.env["REDIS_URL"])
        self.pass_key = f"{stack.env['PAI_INSTANCE']}:last-pass-started"
        self.timing_file = timing_file

    def _running(self, name: str) -> tuple[int, str] | None:
        # The database, not the API: polling through the web workers would
        # take the CPU the portal's own steps need.
        return self.db.execute(
            "SELECT a.id, a.container_id FROM jobs_taskattempt a JOIN jobs_job j ON j.id = a.job_id "
            "WHERE j.name = ? AND a.state = 'RUNNING' AND a.container_id != ''", (name,)).fetchone()

    def once(self, name: str) -> tuple[float, dict[str, float]]:
        """Seconds from the request to StartedAt, and the steps' seconds."""
        t0 = time.time()
        self.api.submit(name, COMMAND)
        answered = time.time()
        # The total is the engine's StartedAt, not when we notice it: look
        # every 50 ms, so the bench's own polling takes little of the CPU the
        # portal's steps and Docker share while this side is timed (the bare
        # side's `docker run -d` just blocks).
        attempt_id, container_id = wait(lambda: self._running(name), interval=0.05)
        total = started_at(container_id) - t0
        pass_started = float(self.redis.get(self.pass_key) or 0)
        marks = self._marks(attempt_id)
        steps: dict[str, float] = {"web request + commit": answered - t0}
        if marks:
            if answered - 1 < pass_started <= marks.get("enqueued", marks["dequeued"]):  # this job's pass
                steps["wake-up"] = pass_started - answered
                steps["scheduling pass"] = marks["enqueued"] - pass_started
            steps["launch request"] = marks["dequeued"] - marks.get("enqueued", marks["dequeued"])
            steps["agent"] = marks["prepared"] - marks["dequeued"]
            steps["docker create+start"] = marks["run"] - marks["prepared"]
            steps["state recorded"] = marks["recorded"] - marks["run"]
        return total, steps

    def _marks(self, attempt_id: int) -> dict[str, float]:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.timing_file.exists():
                for line in reversed(self.timing_file.read_text().splitlines()):
                    marks = json.loads(line)
                    if marks.get("attempt") == attempt_id and "recorded" in marks:
                        return marks
            time.sleep(0.01)
        return {}


def docker_once(options: list[str] | None = None) -> float:
    t0 = time.time()
    container = subprocess.run(["docker", "run", "-d", "--rm", "--label", "pai.instance=bench-latency", *(options or []),
                                IMAGE, *COMMAND.split()], capture_output=True, text=True, check=True).stdout.strip()
    return started_at(container) - t0


EQUAL_NETWORK = "bench-latency-equal"
_equal_ports = iter(range(10**9))


def equal_options(network: str) -> list[str]:
    """What the portal asks of Docker for such a task, on the bare side: a
    network with no traffic between its containers (the engine's default
    bridge if it isolates so, as the portal then takes it; else a bridge of
    our own), the two ports a task gets (ssh and its role's) published on
    the node's address, an init process, limits, dropped capabilities, log
    rotation."""
    first = 19800 + 2 * (next(_equal_ports) % 100)
    return ["--network", network, "-p", f"127.0.0.2:{first}:{first}", "-p", f"127.0.0.2:{first + 1}:{first + 1}",
            "--init", "--memory", "100m", "--memory-swap", "100m", "--cpus", "1", "--pids-limit", "4096",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
            "--log-opt", "max-size=200m", "--log-opt", "max-file=2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=15, help="jobs (and bare runs) per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # through `finally`: the stack goes too
    stack = Stack("latency")
    timing_file = stack.var / "launch-timing.jsonl"
    stack.env["PAI_BENCH_TIMING_FILE"] = str(timing_file)
    try:
        stack.start(agent_args=["--cpus", "256", "--memory-mb", "65536", "--ports", "19000-19799"])
        # The network the node agent picks for a one-task job on this engine.
        engine = launcher.engine_for(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
        equal_network = engine.isolating_default_network() or EQUAL_NETWORK
        print(f"one-task jobs run on {equal_network!r}", flush=True)
        subprocess.run(["docker", "network", "create", "--label", "pai.instance=bench-latency", "-o",
                        "com.docker.network.bridge.enable_icc=false", EQUAL_NETWORK], capture_output=True, check=True)
        portal = Portal(stack, timing_file)
        portal.once("warm")  # caches, connections, the shared network: not counted
        docker_once()
        portal_times: list[float] = []
        docker_times: list[float] = []
        equal_times: list[float] = []
        steps: dict[str, list[float]] = {step: [] for step in STEPS}
        for round_number in range(1, args.rounds + 1):
            load = Path("/proc/loadavg").read_text().split()[:3]
            mine, theirs = [], []
            for i in range(args.jobs):
                total, parts = portal.once(f"r{round_number}-{i}")
                mine.append(total)
                for step, seconds in parts.items():
                    steps[step].append(seconds)
                theirs.append(docker_once())
                equal_times.append(docker_once(equal_options(equal_network)))
            portal_times += mine
            docker_times += theirs
            print(f"round {round_number} (load {' '.join(load)}): portal p50 {statistics.median(mine) * 1000:.0f} ms, "
                  f"docker run -d p50 {statistics.median(theirs) * 1000:.0f} ms", flush=True)
        print(f"portal submit->running over {len(portal_times)} jobs: p50={percentile(portal_times, 50) * 1000:.0f} ms "
              f"p95={percentile(portal_times, 95) * 1000:.0f} ms")
        print(f"bare docker run -d over {len(docker_times)} runs:     p50={percentile(docker_times, 50) * 1000:.0f} ms "
              f"p95={percentile(docker_times, 95) * 1000:.0f} ms")
        print(f"docker run -d with the portal's container options: p50={percentile(equal_times, 50) * 1000:.0f} ms "
              f"p95={percentile(equal_times, 95) * 1000:.0f} ms (portal / this: "
              f"{percentile(portal_times, 50) / percentile(equal_times, 50):.2f} at p50)")
        print("where the portal's time goes (medians):")
        for step in STEPS:
            values = steps[step]
            if values:
                print(f"  {step:<22} {statistics.median(values) * 1000:7.1f} ms   (p95 {percentile(values, 95) * 1000:.1f} ms,"
                      f" {len(values)} jobs)")
        print(f"p95 ratio: {percentile(portal_times, 95) / percentile(docker_times, 95):.2f}")
        print(f"submit_to_running_ratio={percentile(portal_times, 50) / percentile(docker_times, 50):.2f}")
    finally:
        stack.stop()
        subprocess.run(["docker", "rm", "-f", *subprocess.run(
            ["docker", "ps", "-aq", "--filter", "label=pai.instance=bench-latency"], capture_output=True,
            text=True).stdout.split()], capture_output=True)


if __name__ == "__main__":
    main()
