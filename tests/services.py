"""Real services for the tests: a private Redis, the Docker engine, images.

A missing service skips the tests that need it when a developer runs pytest
by hand, and fails them when PORTAL_REQUIRE_SERVICES=1 (the README's test
command and CI set it), so CI never passes by skipping.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.settings import REDIS_PASSWORD, REDIS_SOCKET, TEST_VAR

BUSYBOX_IMAGE = os.environ.get("PAI_BUSYBOX_IMAGE", "pai-local/busybox:latest")
DEBIAN_IMAGE = os.environ.get("PAI_DEBIAN_IMAGE", "pai-local/debian:bookworm")

_REDIS_PIDFILE = TEST_VAR / "redis.pid"
_started: list[tuple[str, Path]] = []


def required() -> bool:
    return os.environ.get("PORTAL_REQUIRE_SERVICES", "").lower() in ("1", "true", "yes")


def unavailable(what: str) -> None:
    message = f"{what} is not available"
    if required():
        pytest.fail(message + " (PORTAL_REQUIRE_SERVICES=1: failing instead of skipping)", pytrace=False)
    pytest.skip(message)


def need(program: str) -> None:
    if shutil.which(program) is None:
        unavailable(program)


def _pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def start_redis() -> None:
    if _pid_alive(_REDIS_PIDFILE):
        return
    TEST_VAR.mkdir(parents=True, exist_ok=True)
    if REDIS_SOCKET.exists():
        REDIS_SOCKET.unlink()
    subprocess.run(
        [
            "redis-server", "--port", "0", "--unixsocket", str(REDIS_SOCKET), "--unixsocketperm", "700",
            "--requirepass", REDIS_PASSWORD, "--daemonize", "yes", "--pidfile", str(_REDIS_PIDFILE),
            "--save", "", "--appendonly", "no", "--dir", str(TEST_VAR),
            "--logfile", str(TEST_VAR / "redis.log"),
        ],
        check=True,
    )
    deadline = time.monotonic() + 10
    while not REDIS_SOCKET.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("test redis-server did not start; see var/test/redis.log")
        time.sleep(0.05)
    _started.append(("redis", _REDIS_PIDFILE))


def need_docker() -> None:
    import docker

    try:
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(BUSYBOX_IMAGE)
    except docker.errors.ImageNotFound:
        unavailable(f"the local image {BUSYBOX_IMAGE} (build it with scripts/build-images)")
    except Exception as exc:  # docker.errors.DockerException, requests errors
        unavailable(f"a Docker engine ({exc.__class__.__name__}: {exc})")


def stop_pidfile(pidfile: Path, timeout: float = 10.0) -> None:
    pid = _pid_alive(pidfile)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def remove_stale_runs() -> None:
    """Folders of earlier test runs whose pytest is gone."""
    for folder in TEST_VAR.parent.glob("run-*"):
        run_id = folder.name.removeprefix("run-")
        if folder == TEST_VAR or not run_id.isdigit():
            continue
        try:
            os.kill(int(run_id), 0)
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)


def stop_all() -> None:
    while _started:
        _name, pidfile = _started.pop()
        stop_pidfile(pidfile)
