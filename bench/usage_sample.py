#!/usr/bin/env python
"""What one usage sample of a running task costs the node agent, read two ways.

    .venv/bin/python bench/usage_sample.py [--containers 10] [--rounds 20]

Starts a few idle busybox containers on the local Docker engine (labelled
pai.instance=bench-usage-<pid>, removed at the end), then reads their
counters through DockerEngine.usage() as the sampler does:

- from the cgroup v1 files and /proc/<pid>/net/dev (the agent's way when
  the engine runs on its machine);
- through the Engine API's one-shot stats endpoint (the fallback, forced
  here by pointing the engine at a cgroup root that does not exist).

Prints milliseconds per container for each, and last
`usage_sample_ms_per_task=<N>` (the cgroup files' figure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IMAGE = "pai-local/busybox:latest"


def per_container_ms(engine, ids: list[str], rounds: int) -> float:
    engine.usage(ids)  # find each container's cgroup once, as the sampler does
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        found = engine.usage(ids)
        times.append((time.perf_counter() - started) * 1000 / len(ids))
        assert len(found) == len(ids), f"read {len(found)} of {len(ids)} containers"
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--containers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    import docker

    from jobs.node.launcher.docker import DockerEngine

    url = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    client = docker.DockerClient(base_url=url)
    label = {"pai.instance": f"bench-usage-{os.getpid()}"}
    made = []
    try:
        for _ in range(args.containers):
            made.append(client.containers.run(IMAGE, ["sleep", "600"], detach=True, labels=label))
        ids = [c.id for c in made]
        files = per_container_ms(DockerEngine(url), ids, args.rounds)
        api = DockerEngine(url)
        api.cgroup_root = Path("/nonexistent")
        stats = per_container_ms(api, ids[:3], max(1, args.rounds // 10))
        print(f"{args.containers} containers: cgroup files {files:.3f} ms per container (median of "
              f"{args.rounds} rounds); stats endpoint {stats:.1f} ms per container; load average "
              f"{os.getloadavg()[0]:.2f}")
        print(f"usage_sample_ms_per_task={files:.3f}")
    finally:
        for container in made:
            container.remove(force=True)


if __name__ == "__main__":
    main()
