#!/usr/bin/env python
"""Log latency and ingestion: from a task's print to the job page's log API.

    .venv/bin/python bench/log_latency.py [--lines 150] [--flood-seconds 10]

A throwaway portal (bench/stack.py), logged in as its user in a browser
session would be (the login form, a session cookie):

1. Latency. A task prints `<n> <the moment, $EPOCHREALTIME>` every 100 ms.
   The bench asks the endpoint the job page's log viewer polls
   (GET /jobs/<job>/logs/<attempt>/stdout/?after=<cursor>, an HTML
   fragment) every 20 ms and notes when each line first appears there.
   The page itself asks once a second, which adds up to a second on top on
   screen: this is the portal's part. Prints p50/p95 and
   `log_latency_p95_ms=<N>` (issue 18's target: <= 1000).
2. Ingestion. A task prints numbered lines as fast as it can for
   --flood-seconds. `docker logs -f` follows the same container meanwhile.
   Lines per second: the lines over the time from the container's start to
   the moment the last of them was stored (portal) or read (docker logs).
   Every number 1..N must be stored once, in order. Prints both rates and
   `log_ingest_ratio=<portal / docker logs>` (target: >= 0.5).

The last line printed is the ingestion ratio; the latency line comes before.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.stack import Stack, percentile  # noqa: E402
from bench.submit_to_running import Api, create_user, started_at, wait  # noqa: E402

LINE_RE = re.compile(r'<div class="log-line" data-seq="(\d+)">.*?<span class="lt">(.*?)</span>')
NEXT_RE = re.compile(r'data-next="(-?\d+)"')


class WebSession:
    """The job page's side: a logged-in browser session (cookies, CSRF)."""

    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base = base_url
        jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = self.opener.open(f"{base_url}/login/", timeout=30).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(f"{base_url}/login/", data=form, headers={"Referer": f"{base_url}/login/"})
        self.opener.open(request, timeout=30).read()
        if not any(cookie.name == "sessionid" for cookie in jar):
            raise RuntimeError("could not log in to the benchmark portal")

    def lines_after(self, job_id: int, attempt_id: int, after: int) -> tuple[list[str], int]:
        html = self.opener.open(f"{self.base}/jobs/{job_id}/logs/{attempt_id}/stdout/?after={after}",
                                timeout=30).read().decode()
        texts = [text for _seq, text in LINE_RE.findall(html)]
        return texts, int(NEXT_RE.search(html).group(1))


def attempt_of(stack: Stack, job_name: str) -> tuple[int, int]:
    """(job id, task attempt id) once the task has an attempt, from the stack's database."""
    def find() -> tuple[int, int] | None:
        with sqlite3.connect(f"file:{stack.var / 'portal.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
            return db.execute("SELECT a.job_id, a.id FROM jobs_taskattempt a JOIN jobs_job j ON j.id = a.job_id "
                              "WHERE j.name = ? ORDER BY a.id DESC LIMIT 1", (job_name,)).fetchone()
    return wait(find, timeout=300, interval=0.02)


def stored_lines(stack: Stack, attempt_id: int) -> list[str]:
    with sqlite3.connect(f"file:{stack.var / 'portal.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
        return [row[0] for row in db.execute(
            "SELECT text FROM jobs_logline WHERE attempt_id = ? AND stream = 1 ORDER BY seq", (attempt_id,))]


def stored_count(stack: Stack, attempt_id: int) -> int:
    with sqlite3.connect(f"file:{stack.var / 'portal.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
        return db.execute("SELECT COUNT(*) FROM jobs_logline WHERE attempt_id = ? AND stream = 1",
                          (attempt_id,)).fetchone()[0]


def latency(stack: Stack, api: Api, web: WebSession, count: int) -> list[float]:
    command = (f'i=0; while [ $i -lt {count} ]; do i=$((i+1)); echo "$i $EPOCHREALTIME"; sleep 0.1; done')
    api.submit("latency", command)
    job_id, attempt_id = attempt_of(stack, "latency")
    seen: list[float] = []
    cursor = -1
    deadline = time.monotonic() + count * 0.1 + 120
    while len(seen) < count and time.monotonic() < deadline:
        texts, cursor = web.lines_after(job_id, attempt_id, cursor)
        now = time.time()
        seen += [now - float(text.split()[1]) for text in texts]
        time.sleep(0.02)
    if len(seen) < count:
        raise RuntimeError(f"only {len(seen)} of {count} lines came through the log API")
    return seen


def ingestion(stack: Stack, api: Api, seconds: int) -> tuple[float, float, int]:
    """(portal lines/s, docker logs lines/s, lines printed)."""
    command = (f"end=$(( ${{EPOCHREALTIME%.*}} + {seconds} )); i=0; "
               "while [ ${EPOCHREALTIME%.*} -lt $end ]; do i=$((i+1)); echo $i; done")
    api.submit("flood", command)
    _job_id, attempt_id = attempt_of(stack, "flood")
    container = wait(lambda: api.container("flood"), timeout=120, interval=0.01)
    reader = subprocess.Popen(["docker", "logs", "-f", container], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    docker_lines, docker_last = 0, [0.0]

    def read_docker() -> None:
        nonlocal docker_lines
        for _line in reader.stdout:
            docker_lines += 1
            docker_last[0] = time.time()

    follower = threading.Thread(target=read_docker, daemon=True)
    follower.start()
    follower.join(timeout=seconds + 600)
    reader.wait(timeout=30)
    start = started_at(container)
    # What was printed: the last number docker stored (a follower may stop short of it).
    printed = int(subprocess.run(["docker", "logs", "--tail", "1", container], capture_output=True, text=True,
                                 check=True).stdout.split()[-1])
    stored, portal_last = 0, 0.0
    deadline = time.monotonic() + 600
    while stored < printed and time.monotonic() < deadline:
        count = stored_count(stack, attempt_id)
        if count != stored:
            stored, portal_last = count, time.time()
        time.sleep(0.05)
    texts = stored_lines(stack, attempt_id)
    if texts != [str(i) for i in range(1, printed + 1)]:
        missing = len(set(map(str, range(1, printed + 1))) - set(texts))
        raise RuntimeError(f"stored {len(texts)} lines for {printed} printed: {missing} lost, or some out of order")
    print(f"flood: {printed} lines in {seconds} s, every one stored once and in order "
          f"(docker logs -f read {docker_lines})")
    return stored / (portal_last - start), docker_lines / (docker_last[0] - start), printed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=150)
    parser.add_argument("--flood-seconds", type=int, default=10)
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # through `finally`: the stack goes too
    stack = Stack("log-latency")
    try:
        stack.start(agent_args=["--cpus", "8", "--memory-mb", "8192", "--ports", "17100-17199"])
        password = create_user(stack)
        api = Api(stack.base_url, "bench", password)
        web = WebSession(stack.base_url, "bench", password)
        load = Path("/proc/loadavg").read_text().split()[:3]
        seen = latency(stack, api, web, args.lines)
        print(f"latency print -> log API over {len(seen)} lines: p50={percentile(seen, 50) * 1000:.0f} ms "
              f"p95={percentile(seen, 95) * 1000:.0f} ms max={max(seen) * 1000:.0f} ms (load before: {' '.join(load)})")
        print(f"log_latency_p95_ms={percentile(seen, 95) * 1000:.0f}", flush=True)
        load = Path("/proc/loadavg").read_text().split()[:3]
        portal, docker, _count = ingestion(stack, api, args.flood_seconds)
        print(f"ingestion: portal stored {portal:.0f} lines/s, docker logs read {docker:.0f} lines/s "
              f"(load before: {' '.join(load)})")
        print(f"log_ingest_ratio={portal / docker:.2f}")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
