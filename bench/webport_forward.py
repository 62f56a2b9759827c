#!/usr/bin/env python
"""What the node's web-port forwarder costs (jobs/node/webforward.py).

    .venv/bin/python bench/webport_forward.py [--requests 200] [--megabytes 32]

A throwaway portal (bench/stack.py) runs a busybox httpd task on a web
port. The portal's proxy reaches web ports only through the node agent's
forwarder; this bench compares that hop with connecting to the task's port
on the node's loopback directly, one against the other, alternately:

1. Latency: a fresh connection and `GET /` (a 6-byte page), to EOF, as the
   proxy does per request. For the forwarder this includes the proof line,
   its check (HMAC, nonce, one database read) and the forwarder's own
   connection to the port.
2. Throughput: `GET /big` (--megabytes of zeros), to EOF.

Prints p50/p95 of both, MB/s of both, and last
`webport_forward_overhead_p50_ms=<forwarder p50 - direct p50>`.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.stack import Stack, percentile  # noqa: E402
from bench.submit_to_running import Api, create_user, wait  # noqa: E402

NODE = "bench-node"
HTTPD = ("mkdir -p /www && echo hello > /www/index.html && dd if=/dev/zero of=/www/big bs=1M count={mb} 2>/dev/null "
         "&& echo serving && exec httpd -f -p $PAI_CONTAINER_HOST_http_PORT_LIST -h /www")


def _get(sock: socket.socket, path: str) -> int:
    sock.sendall(f"GET {path} HTTP/1.0\r\nHost: task\r\n\r\n".encode())
    received = 0
    while chunk := sock.recv(256 * 1024):
        received += len(chunk)
    return received


def direct(port: int, path: str) -> int:
    with socket.create_connection(("127.0.0.3", port), timeout=30) as sock:
        return _get(sock, path)


def forwarded(attempt_id: int, port: int, path: str) -> int:
    from jobs.services import webports

    with socket.create_connection(("127.0.0.2", webports.forward_port_of(NODE)), timeout=30) as sock:
        sock.sendall(webports.forward_proof_line(node_name=NODE, attempt_id=attempt_id, port=port))
        answer = b""
        while not answer.endswith(b"\n"):
            answer += sock.recv(1)
        assert answer == b"OK\n", answer
        return _get(sock, path)


def running_task(stack: Stack) -> tuple[int, int]:
    def found():
        with sqlite3.connect(f"file:{stack.var / 'portal.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
            row = db.execute("SELECT a.id, a.ports FROM jobs_taskattempt a JOIN jobs_logline l ON l.attempt_id = a.id "
                             "WHERE a.state = 'RUNNING' AND l.text = 'serving'").fetchone()
        return row and (row[0], json.loads(row[1])["http"][0])

    return wait(found, timeout=120, interval=0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--megabytes", type=int, default=32)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # through `finally`: the stack goes too
    stack = Stack("webport-forward")
    try:
        stack.start(agent_args=["--cpus", "4", "--memory-mb", "4096", "--ports", "17300-17399"])
        api = Api(stack.base_url, "bench", create_user(stack))
        api.call("POST", "/user/bench/jobs", {
            "jobName": "httpd", "image": "pai-local/busybox:latest",
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 0,
                           "command": HTTPD.format(mb=args.megabytes),
                           "portList": [{"label": "http", "beginAt": 0, "portNumber": 1}]}],
        })
        attempt_id, port = running_task(stack)
        stack.apply_env()
        import django

        django.setup()
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        times: dict[str, list[float]] = {"direct": [], "forwarder": []}
        for _ in range(args.requests):
            for name, call in (("direct", lambda: direct(port, "/")), ("forwarder", lambda: forwarded(attempt_id, port, "/"))):
                started = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - started)
        for name, values in times.items():
            print(f"GET / {name}: p50={percentile(values, 50) * 1000:.2f} ms p95={percentile(values, 95) * 1000:.2f} ms")
        rates: dict[str, list[float]] = {"direct": [], "forwarder": []}
        for _ in range(3):
            for name, call in (("direct", lambda: direct(port, "/big")),
                               ("forwarder", lambda: forwarded(attempt_id, port, "/big"))):
                started = time.perf_counter()
                size = call()
                rates[name].append(size / 2**20 / (time.perf_counter() - started))
        for name, values in rates.items():
            print(f"GET /big ({args.megabytes} MB) {name}: {max(values):.0f} MB/s best of 3")
        print(f"(load before: {load}, after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])})")
        overhead = percentile(times["forwarder"], 50) - percentile(times["direct"], 50)
        print(f"webport_forward_overhead_p50_ms={overhead * 1000:.2f}")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
