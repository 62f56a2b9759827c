#!/usr/bin/env python
"""How many running tasks one node agent follows, and at what cost.

    .venv/bin/python bench/agent_scale.py [--steps 100,500,1000] [--every 20]

A throwaway portal (bench/stack.py) with one node agent; one-task busybox
jobs that sleep and print a line every --every seconds are submitted
through the REST API until --steps[i] tasks run at once. At each step,
once every task runs and has had a line stored (so its log is followed),
it prints the agent's RSS (the agent process and every process under it)
and its thread count. The final line is
`agent_rss_mb_at_<last step>_tasks=<MB>` (issue 18's target: <= 300 at 1,000).

Each container also costs the machine ~10 MB in containerd-shim memory: at
1,000 tasks about 10 GB. Every container of the run carries the stack's
instance label and is removed at the end, as is the stack.
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.stack import Stack, rss_mb, threads  # noqa: E402
from bench.submit_to_running import Api, create_user, wait  # noqa: E402

IMAGE = "pai-local/busybox:latest"


def tree_rss_mb(pid: int) -> float:
    """RSS of `pid` and of every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            total += rss_mb(current)
        except OSError:
            pass
    return total


def running_containers(stack: Stack) -> int:
    out = subprocess.run(["docker", "ps", "-q", "--filter", f"label=pai.instance={stack.env['PAI_INSTANCE']}"],
                         capture_output=True, text=True).stdout
    return len(out.split())


def followed_tasks(stack: Stack) -> int:
    """Task attempts that run and have at least one stdout line stored."""
    with sqlite3.connect(f"file:{stack.var / 'portal.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
        return db.execute(
            "SELECT COUNT(DISTINCT l.attempt_id) FROM jobs_logline l JOIN jobs_taskattempt a ON a.id = l.attempt_id "
            "WHERE l.stream = 1 AND a.state = 'RUNNING'").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="100,500,1000", help="task counts to measure at, comma-separated")
    parser.add_argument("--every", type=int, default=20, help="seconds between two lines of one task")
    args = parser.parse_args()
    steps = [int(step) for step in args.steps.split(",")]
    most = steps[-1]

    # SIGTERM ends the run through `finally`: the stack and its containers go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    stack = Stack("agent-scale")
    stack.env["API_SUBMISSIONS_PER_MINUTE"] = str(most + 10)
    command = f"i=0; while true; do i=$((i+1)); echo tick $i; sleep {args.every}; done"
    try:
        stack.start(agent_args=["--cpus", str(most + 8), "--memory-mb", str((most + 8) * 100), "--ports", "12000-14999"])
        api = Api(stack.base_url, "bench", create_user(stack))
        submitted = 0
        for step in steps:
            began = time.monotonic()
            while submitted < step:
                api.submit(f"scale{submitted}", command, memory_mb=100)
                submitted += 1
            wait(lambda: running_containers(stack) >= step, timeout=3600, interval=2)
            wait(lambda: followed_tasks(stack) >= step, timeout=600, interval=2)
            took = time.monotonic() - began
            time.sleep(3)  # settle: the last starts' helpers done, the writer idle
            pid = stack.agent_pid()
            load = Path("/proc/loadavg").read_text().split()[:3]
            print(f"{step} tasks running and followed (+{took:.0f} s): agent RSS {tree_rss_mb(pid):.0f} MB, "
                  f"{threads(pid)} threads (load {' '.join(load)})", flush=True)
        print(f"agent_rss_mb_at_{most}_tasks={tree_rss_mb(stack.agent_pid()):.0f}")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
