#!/usr/bin/env python
"""Submission to a running container, against a bare `docker run -d`.

    .venv/bin/python bench/submit_to_running.py [--jobs 30] [--capacity 200]

On an idle node of a throwaway portal (bench/stack.py): submits N one-task
busybox jobs one after another through the REST API and times each from the
moment the request is sent to the container's StartedAt; then times N bare
`docker run -d` of the same image and command the same way. Then it fills
the node with --capacity sleeping tasks and reports how many one node agent
keeps running at once and the agent's memory. Prints the figures and a final
line `submit_to_running_ratio=<portal p50 / docker p50>` (target: <= 1.5).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.stack import Stack, percentile, rss_mb, threads  # noqa: E402

IMAGE = "pai-local/busybox:latest"


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

    def submit(self, name: str, command: str, cpus: int = 1) -> None:
        self.call("POST", f"/user/{self.user}/jobs", {
            "jobName": name, "image": IMAGE,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": cpus, "memoryMB": 100, "gpuNumber": 0,
                           "command": command}],
        })

    def container(self, name: str) -> str:
        status = self.call("GET", f"/user/{self.user}/jobs/{name}")
        for role in status.get("taskRoles", {}).values():
            for task in role.get("taskStatuses", []):
                if task.get("containerId"):
                    return task["containerId"]
        return ""


def wait(predicate, timeout: float = 120.0, interval: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("timed out")


def portal_latencies(api: Api, count: int) -> list[float]:
    results = []
    for i in range(count + 1):
        name = f"lat{i}"
        t0 = time.time()
        api.submit(name, "sleep 2")
        container = wait(lambda: api.container(name))
        if i:  # the first one warms caches and is not counted
            results.append(started_at(container) - t0)
    return results


def docker_latencies(count: int) -> list[float]:
    results = []
    for _ in range(count):
        t0 = time.time()
        container = subprocess.run(["docker", "run", "-d", "--rm", IMAGE, "sleep", "2"], capture_output=True,
                                   text=True, check=True).stdout.strip()
        results.append(started_at(container) - t0)
    return results


def capacity(api: Api, stack: Stack, tasks: int) -> tuple[int, float, int]:
    for i in range(tasks):
        api.submit(f"cap{i}", "sleep 3600")
    label = f"label=pai.instance={stack.env['PAI_INSTANCE']}"

    def running() -> int:
        out = subprocess.run(["docker", "ps", "-q", "--filter", label], capture_output=True, text=True).stdout
        return len(out.split())

    wait(lambda: running() >= tasks, timeout=900, interval=1)
    time.sleep(5)  # let every watcher settle into following its logs
    return running(), rss_mb(stack.agent_pid()), threads(stack.agent_pid())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--capacity", type=int, default=200)
    args = parser.parse_args()

    stack = Stack("latency")
    try:
        stack.start(agent_args=["--cpus", str(max(64, args.capacity * 2)), "--memory-mb", str(max(65536, args.capacity * 256)),
                                "--ports", "19000-19999"])
        password = "bench-password-1"
        subprocess.run([sys.executable, "manage.py", "shell", "-c",
                        f"from jobs.models import User; User.objects.create_user('bench', password='{password}')"],
                       cwd=stack.var.parent.parent.parent, env=stack.env, check=True)
        api = Api(stack.base_url, "bench", password)

        portal = portal_latencies(api, args.jobs)
        docker = docker_latencies(args.jobs)
        print(f"portal submit->running over {len(portal)} jobs: p50={percentile(portal, 50) * 1000:.0f} ms "
              f"p95={percentile(portal, 95) * 1000:.0f} ms")
        print(f"bare docker run -d over {len(docker)} runs:     p50={percentile(docker, 50) * 1000:.0f} ms "
              f"p95={percentile(docker, 95) * 1000:.0f} ms")
        if args.capacity:
            running, memory, thread_count = capacity(api, stack, args.capacity)
            print(f"one node agent kept {running} tasks running at once; agent memory {memory:.0f} MB RSS "
                  f"({thread_count} threads) at {running} running tasks")
        print(f"submit_to_running_ratio={percentile(portal, 50) / percentile(docker, 50):.2f}")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
