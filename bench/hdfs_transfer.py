#!/usr/bin/env python
"""Uploading and downloading a 200 MB file on HDFS through the portal's
storage page, against the same transfer straight to WebHDFS with HdfsCLI.

    .venv/bin/python bench/hdfs_transfer.py [--mb 200] [--rounds 3]

Starts its own HDFS (scripts/hdfs-minicluster, files under
var/bench/hdfs_transfer/) and a throwaway portal on it (bench/stack.py:
gunicorn as scripts/run starts it), on loopback only, and stops both by PID.
Each round uploads the file through POST /storage/upload/ (a streamed
multipart body, as a browser sends it) and downloads it from
/storage/download/, and does the same with HdfsCLI's InsecureClient as the
same user; the two sides take turns going first. Prints each round, the
medians and `hdfs_upload_ratio=` / `hdfs_download_ratio=` (portal time / direct time;
target: at most 1.3 each).

Wall times on a busy 2-core machine swing by 2x from one transfer to the
next, so each round also counts CPU seconds (from /proc): the portal's
gunicorn workers, the minicluster's JVM and this process, against the JVM
and this process for the direct transfer. Their ratios
(`hdfs_upload_cpu_ratio`, `hdfs_download_cpu_ratio`) say what the portal's
relay costs whatever else the machine is doing. The load average is printed
before and after.

Both sides' upload times used to be bimodal: HDFS sometimes added 0.4 s when
closing the new file (the datanode's client waiting for the namenode to hear
of the last block; see hadoop/minicluster's MiniHdfs.java). The minicluster
now retries after 25 ms, so both sides got faster (and the ratio no longer
hides the portal's own cost behind that shared delay).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.stack import Stack, free_port, stack_folder  # noqa: E402

NAME = "hdfs_transfer"
USER, PASSWORD = "bench", "bench-Password-1"
CHUNK = 1024 * 1024


class Hdfs:
    """scripts/hdfs-minicluster on ports of its own, with its own var dir."""

    def __init__(self) -> None:
        self.var = stack_folder(NAME + "-hdfs")
        self.rpc_port, self.http_port = free_port(), free_port()
        self.env = {**os.environ, "PORTAL_VAR_DIR": str(self.var), "HDFS_RPC_PORT": str(self.rpc_port),
                    "HDFS_HTTP_PORT": str(self.http_port), "WEBHDFS_USER": "pai"}

    def run(self, command: str) -> None:
        subprocess.run([str(ROOT / "scripts" / "hdfs-minicluster"), command], env=self.env, check=True,
                       stdout=subprocess.DEVNULL)

    def pid(self) -> int:
        return int((self.var / "run" / "hdfs-minicluster.pid").read_text())

    def settings(self) -> dict[str, str]:
        return {"STORAGE_BACKEND": "webhdfs", "WEBHDFS_URL": f"http://127.0.0.1:{self.http_port}", "WEBHDFS_USER": "pai",
                "PAI_DEFAULT_FS_URI": f"hdfs://127.0.0.1:{self.rpc_port}"}


class _Streamed:
    """An iterable body with a length: requests then sends a Content-Length,
    not chunks (as a browser sends a file)."""

    def __init__(self, chunks: Iterator[bytes], length: int) -> None:
        self._chunks, self._length = chunks, length

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def __len__(self) -> int:
        return self._length


def _multipart(path: Path, folder: str, boundary: str) -> _Streamed:
    """A multipart/form-data body streamed from disk."""
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"path\"\r\n\r\n{folder}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"overwrite\"\r\n\r\n1\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{path.name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def body() -> Iterator[bytes]:
        yield head
        with open(path, "rb") as stream:
            while chunk := stream.read(CHUNK):
                yield chunk
        yield tail

    return _Streamed(body(), len(head) + path.stat().st_size + len(tail))


def login(base_url: str) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    page = session.get(f"{base_url}/login/", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    answer = session.post(f"{base_url}/login/", data={"username": USER, "password": PASSWORD, "csrfmiddlewaretoken": token},
                          headers={"Referer": f"{base_url}/login/"}, allow_redirects=False, timeout=30)
    assert answer.status_code == 302, "login failed"
    session.get(f"{base_url}/storage/", timeout=60)  # makes the home, and a CSRF cookie
    return session


def portal_upload(session: requests.Session, base_url: str, path: Path) -> float:
    boundary = "----bench" + os.urandom(8).hex()
    body = _multipart(path, f"/{USER}", boundary)
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}",
               "Accept": "application/json", "X-CSRFToken": session.cookies["csrftoken"], "Referer": f"{base_url}/storage/"}
    started = time.perf_counter()
    answer = session.post(f"{base_url}/storage/upload/", data=body, headers=headers, timeout=600)
    elapsed = time.perf_counter() - started
    assert answer.status_code == 200, answer.text[:300]
    return elapsed


def portal_download(session: requests.Session, base_url: str, name: str, size: int) -> float:
    started = time.perf_counter()
    with session.get(f"{base_url}/storage/download/", params={"path": f"/{USER}/{name}"}, stream=True, timeout=600) as answer:
        answer.raise_for_status()
        got = sum(len(chunk) for chunk in answer.iter_content(CHUNK))
    elapsed = time.perf_counter() - started
    assert got == size
    return elapsed


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def workers_cpu(master: int) -> float:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return sum(cpu_seconds(int(child)) for child in children)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def direct_upload(client, path: Path) -> float:
    started = time.perf_counter()
    with open(path, "rb") as stream:
        client.write(f"/{USER}/direct-{path.name}", data=stream, overwrite=True)
    return time.perf_counter() - started


def direct_download(client, name: str, size: int) -> float:
    started = time.perf_counter()
    with client.read(f"/{USER}/direct-{name}", chunk_size=CHUNK) as chunks:
        got = sum(len(chunk) for chunk in chunks)
    elapsed = time.perf_counter() - started
    assert got == size
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    # With one warm-up round, the JVM's C2 compiler threads still took 0.3-0.6 s
    # of CPU in each of the next two rounds (per-thread CPU from /proc), on
    # whichever side ran then.
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first (the JVM compiles its hot paths)")
    options = parser.parse_args()

    from hdfs import InsecureClient

    hdfs = Hdfs()
    stack = Stack(NAME)
    stack.env.update(hdfs.settings())
    data = stack.var / "payload.bin"
    with open(data, "wb") as out:
        for _ in range(options.mb):
            out.write(os.urandom(CHUNK))
    size = data.stat().st_size
    hdfs.run("start")
    try:
        stack.start(agent_args=["--ports", "24000-24010"])
        subprocess.run([sys.executable, "manage.py", "shell", "-v", "0", "-c",
                        f"from jobs.models import User; User.objects.create_user({USER!r}, password={PASSWORD!r})"],
                       cwd=ROOT, env=stack.env, check=True)
        session = login(stack.base_url)
        # The same user HDFS-wise: the service user acting for "bench", as the portal does.
        session_direct = requests.Session()
        session_direct.params = {"doas": USER}
        direct = InsecureClient(hdfs.settings()["WEBHDFS_URL"], user="pai", session=session_direct)
        master, jvm = stack.processes["gunicorn"].pid, hdfs.pid()

        def measured(transfer, *, portal: bool) -> tuple[float, float]:
            """(seconds, CPU seconds of everything taking part)."""
            def cpu() -> float:
                mine = sum(os.times()[:2])
                return mine + cpu_seconds(jvm) + (workers_cpu(master) if portal else 0.0)
            before = cpu()
            elapsed = transfer()
            return elapsed, cpu() - before

        steps = {
            "portal_upload": (lambda: portal_upload(session, stack.base_url, data), True),
            "direct_upload": (lambda: direct_upload(direct, data), False),
            "portal_download": (lambda: portal_download(session, stack.base_url, data.name, size), True),
            "direct_download": (lambda: direct_download(direct, data.name, size), False),
        }
        times: dict[str, list[float]] = {key: [] for key in steps}
        cpus: dict[str, list[float]] = {key: [] for key in steps}
        for _ in range(options.warmup):
            for transfer, _portal in steps.values():
                transfer()
        print(f"load average before: {load()}", flush=True)
        for number in range(1, options.rounds + 1):
            # The two sides take turns going first: the one after the other
            # meets a warmer page cache and a JVM that has just been busy.
            order = list(steps) if number % 2 else [
                "direct_upload", "portal_upload", "direct_download", "portal_download"]
            for key in order:
                transfer, portal = steps[key]
                elapsed, used = measured(transfer, portal=portal)
                times[key].append(elapsed)
                cpus[key].append(used)
            print(f"round {number}: " + "  ".join(f"{key}={times[key][-1]:.2f}s (cpu {cpus[key][-1]:.2f}s)"
                                                  for key in steps), flush=True)
        print(f"load average after: {load()}")
        medians = {key: statistics.median(values) for key, values in times.items()}
        cpu_medians = {key: statistics.median(values) for key, values in cpus.items()}
        mb = size / CHUNK
        for key, value in medians.items():
            print(f"{key}_s={value:.2f} ({mb / value:.0f} MB/s, cpu {cpu_medians[key]:.2f}s)")
        print(f"hdfs_upload_cpu_ratio={cpu_medians['portal_upload'] / cpu_medians['direct_upload']:.2f}")
        print(f"hdfs_download_cpu_ratio={cpu_medians['portal_download'] / cpu_medians['direct_download']:.2f}")
        print(f"hdfs_upload_ratio={medians['portal_upload'] / medians['direct_upload']:.2f}")
        print(f"hdfs_download_ratio={medians['portal_download'] / medians['direct_download']:.2f}")
    finally:
        stack.stop()
        hdfs.run("stop")


if __name__ == "__main__":
    main()
