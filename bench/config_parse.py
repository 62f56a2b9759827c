#!/usr/bin/env python
"""Parsing job configs of adversarial shapes at the size limit.

    .venv/bin/python bench/config_parse.py [--repeat 5]

Builds one config per shape at the 256 KB limit (a long key over a long
list, many small objects, nesting to the deepest the reader takes (MAX_DEPTH)
with long keys and as bare lists, many unknown keys, many bad task roles,
comments between every two tokens, long comments and one comment as long as
the config: the shapes tests/security/test_config_parser_memory.py holds to
50 MB) and parses each `--repeat` times with the one parser the Submit page,
its live check and the REST API use (parse_config_text). Prints, per shape, the
median wall and CPU time and the peak extra memory (tracemalloc, in a
separate run so it does not slow the timed ones), then
`config_parse_ratio=<worst median wall ms / 500 ms target>` (at most 1.0
meets the target). No database, no services: pure Python.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.spec import MAX_CONFIG_BYTES, SpecError, parse_config_text  # noqa: E402
from tests.security.test_config_parser_memory import adversarial  # noqa: E402

# (shape, key or comment length): the worst of each as the test builds them.
SHAPES = [("long key times long list", 4000), ("many small objects", 4000), ("deep nesting", 1),
          ("deepest nesting of lists", 1), ("many unknown keys", 4000), ("many bad task roles", 60),
          ("comments between every token", 1), ("long comments", 4000), ("long comments", 300_000)]
TARGET_MS = 500.0


def parse(text: str) -> None:
    try:
        parse_config_text(text, user_name="alice", default_fs_uri="file://")
    except SpecError:
        pass


def measure(text: str, repeat: int) -> tuple[float, float, float]:
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        parse(text)
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    tracemalloc.start()
    parse(text)
    peak = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    return statistics.median(walls), statistics.median(cpus), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; limit {MAX_CONFIG_BYTES // 1024} KB; median of {args.repeat}")
    worst = 0.0
    worst_shape = ""
    for shape, key_length in SHAPES:
        text = adversarial(shape, key_length, MAX_CONFIG_BYTES - 512)
        wall, cpu, peak = measure(text, args.repeat)
        name = f"{shape} ({key_length})"
        if wall > worst:
            worst, worst_shape = wall, name
        print(f"{name:38s} {len(text.encode()) // 1024:4d} KB  wall {wall:7.1f} ms  cpu {cpu:7.1f} ms  "
              f"peak {peak:6.1f} MB")
    print(f"worst: {worst_shape}, {worst:.1f} ms")
    print(f"config_parse_ratio={worst / TARGET_MS:.2f}")


if __name__ == "__main__":
    main()
