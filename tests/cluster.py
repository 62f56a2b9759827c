"""A real test cluster: node agents and the portal under gunicorn, as
separate processes sharing the session's database, Redis and Docker engine.

Everything started here is stopped by PID at the end of the session, and
every container and network it made is removed by label.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.settings import PORT_BASE, TEST_ENV, TEST_VAR

ROOT = Path(__file__).resolve().parent.parent
LOGS = TEST_VAR / "logs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], object], *, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Poll until `predicate()` is truthy; return its value or fail loudly."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the thing polled may not exist yet
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


def process_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # only for the test process (tests/settings.py)
    env.update(TEST_ENV)
    env["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if not self.alive():
            return
        self.popen.send_signal(sig)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Cluster:
    base_url: str = ""
    processes: dict[str, Process] = field(default_factory=dict)

    def _spawn(self, name: str, args: list[str], **env: str) -> Process:
        # One process a name: one left running by a test that failed before
        # stopping it would otherwise be forgotten here, and outlive the run
        # (stop_all stops what this holds).
        earlier = self.processes.get(name)
        if earlier is not None:
            earlier.stop()
        LOGS.mkdir(parents=True, exist_ok=True)
        log_path = LOGS / f"{name}.log"
        log_file = open(log_path, "ab")
        popen = subprocess.Popen(args, cwd=ROOT, env=process_env(**env), stdout=log_file, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        process = Process(name, popen, log_path)
        self.processes[name] = process
        return process

    # ----------------------------------------------------------- node agents

    @staticmethod
    def port_range(slot: int) -> str:
        """Host ports of this test run: slot 0..5, 100 ports each."""
        start = PORT_BASE + slot * 100
        return f"{start}-{start + 99}"

    def start_agent(self, name: str, *, ports: str, cpus: int = 16, memory_mb: int = 32768, gpus: int = 0,
                    gpu_type: str = "SIM", wait: bool = True, env: dict[str, str] | None = None) -> Process:
        args = [sys.executable, "manage.py", "node_agent", "--name", name, "--ports", ports, "--cpus", str(cpus),
                "--memory-mb", str(memory_mb), "--address", "127.0.0.2"]
        if gpus:
            args += ["--gpus", str(gpus), "--gpu-type", gpu_type]
        process = self._spawn(f"agent-{name}", args, **(env or {}))
        if wait:
            self.wait_node_ready(name, process)
        return process

    def wait_node_ready(self, name: str, process: Process | None = None) -> None:
        from django.utils import timezone

        from jobs.models import Node

        started = timezone.now()

        def ready() -> bool:
            if process is not None and not process.alive():
                raise AssertionError(f"agent {name} exited:\n{process.log_tail()}")
            return Node.objects.filter(name=name, status=Node.Status.READY, last_heartbeat__gte=started).exists()

        wait_for(ready, timeout=30, what=f"node {name} to be ready")

    def agent(self, name: str) -> Process:
        return self.processes[f"agent-{name}"]

    # --------------------------------------------------------------- portal

    def start_portal(self, *, name: str = "gunicorn", env: dict[str, str] | None = None, workers: int = 2) -> None:
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        process = self._spawn(name, [
            sys.executable, "-m", "gunicorn", "-c", "portal/gunicorn.conf.py", "-w", str(workers), "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "5",
        ], **(env or {}))

        def answers() -> bool:
            if not process.alive():
                raise AssertionError(f"gunicorn exited:\n{process.log_tail()}")
            return requests.get(f"{self.base_url}/login/", timeout=5).status_code == 200

        wait_for(answers, timeout=60, what="gunicorn to answer")

    # -------------------------------------------------------------- cleanup

    def stop_all(self) -> None:
        for process in list(self.processes.values()):
            process.stop()
        self.processes.clear()


def remove_test_containers() -> None:
    """Remove every container and network labelled with the test instance,
    and the task firewall rules of agents that are gone."""
    import docker

    client = docker.from_env()
    label = f"pai.instance={TEST_ENV['PAI_INSTANCE']}"
    for container in client.containers.list(all=True, filters={"label": label}):
        container.remove(force=True)
    for network in client.networks.list(filters={"label": label}):
        try:
            network.remove()
        except docker.errors.APIError:
            pass
    # Firewall rules of agents that are gone (SIGKILLed in a test); live
    # agents' rules (another test run's) stay. See jobs/node/launcher/firewall.py.
    from jobs.node.launcher import firewall

    firewall.remove_stale()
