"""A throwaway portal for benchmarks: its own var dir, Redis, node agent and
gunicorn, started exactly as scripts/run starts them, on loopback only, and
stopped by PID afterwards. Its containers carry their own instance label."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stack_folder(name: str) -> Path:
    """Where the stack `name` keeps its database, storage and logs."""
    return ROOT / "var" / "bench" / name


class Stack:
    def __init__(self, name: str) -> None:
        self.var = stack_folder(name)
        shutil.rmtree(self.var, ignore_errors=True)
        (self.var / "log").mkdir(parents=True)
        self.redis_port = free_port()
        password = secrets.token_hex(8)
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "PORTAL_SECRET_KEY": secrets.token_urlsafe(40),
            "PORTAL_VAR_DIR": str(self.var),
            "DATABASE_URL": f"sqlite:///{self.var / 'portal.sqlite3'}",
            "REDIS_URL": f"redis://:{password}@127.0.0.1:{self.redis_port}/0",
            "PAI_INSTANCE": f"bench-{name}",
            "JOB_SUBNET_POOL": "10.215.0.0/16",
            "PORTAL_LOG_LEVEL": "WARNING",
        }
        self.password = password
        self.processes: dict[str, subprocess.Popen] = {}
        self.base_url = ""

    def apply_env(self) -> None:
        """Point this process's Django at the stack (before django.setup())."""
        os.environ.update(self.env)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.var / "log" / f"{name}.log", "ab")
        process = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def start(self, *, agent_args: list[str], gunicorn: bool = True) -> None:
        self._spawn("redis", ["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port),
                              "--requirepass", self.password, "--save", "", "--appendonly", "no"])
        manage = [PY, str(ROOT / "manage.py")]
        for command in (["migrate", "-v0"], ["ensure_defaults", "-v0"], ["collectstatic", "--noinput", "-v0"]):
            subprocess.run(manage + command, cwd=ROOT, env=self.env, check=True)
        self._spawn("agent", manage + ["node_agent", "--name", "bench-node", "--address", "127.0.0.2"] + agent_args)
        if gunicorn:
            port = free_port()
            self.base_url = f"http://127.0.0.1:{port}"
            self._spawn("gunicorn", [PY, "-m", "gunicorn", "-c", str(ROOT / "portal" / "gunicorn.conf.py"),
                                     "-b", f"127.0.0.1:{port}"])
        self._wait_ready(gunicorn)

    def _wait_ready(self, gunicorn: bool) -> None:
        import urllib.request

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited; see {self.var / 'log' / (name + '.log')}")
            agent_up = "ready" in (self.var / "log" / "agent.log").read_text(errors="replace")
            web_up = True
            if gunicorn:
                try:
                    web_up = urllib.request.urlopen(f"{self.base_url}/login/", timeout=2).status == 200
                except OSError:
                    web_up = False
            if agent_up and web_up:
                return
            time.sleep(0.2)
        raise RuntimeError("the benchmark portal did not come up")

    def agent_pid(self) -> int:
        return self.processes["agent"].pid

    def stop(self) -> None:
        for name in ("gunicorn", "agent", "redis"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.remove_containers()

    def remove_containers(self) -> None:
        label = f"pai.instance={self.env['PAI_INSTANCE']}"
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True).stdout.split()
        for start in range(0, len(ids), 50):
            subprocess.run(["docker", "rm", "-f", *ids[start:start + 50]], capture_output=True)
        networks = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"label={label}"], capture_output=True,
                                  text=True).stdout.split()
        if networks:
            subprocess.run(["docker", "network", "rm", *networks], capture_output=True)


def configure_django(var: Path, instance: str, **extra: str) -> None:
    """Django set up in this process against a scratch SQLite database in
    `var` (never the portal's or the tests'), for benches that render pages
    through the test client."""
    (var / "staticfiles").mkdir(parents=True, exist_ok=True)  # whitenoise warns when it is missing
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "PORTAL_SECRET_KEY": secrets.token_urlsafe(40),
        "PORTAL_VAR_DIR": str(var),
        "DATABASE_URL": f"sqlite:///{var / 'portal.sqlite3'}",
        "PORTAL_ALLOWED_HOSTS": "testserver",
        "PORTAL_LOG_LEVEL": "WARNING",
        "PAI_INSTANCE": instance,
        **extra,
    })
    import django

    django.setup()


@contextlib.contextmanager
def scratch_django(var: Path, instance: str, *, database: str, pg_var: Path, pg_database: str) -> Iterator[None]:
    """Django in this process against a fresh scratch database: SQLite in
    `var`, or (`database` "postgres") database `pg_database` made anew on a
    bench's own PostgreSQL kept in `pg_var`, stopped afterwards."""
    shutil.rmtree(var, ignore_errors=True)
    server = postgres_server(pg_var) if database == "postgres" else None
    try:
        extra = {}
        if server is not None:
            server.drop_database(pg_database)
            server.create_database(pg_database)
            extra["DATABASE_URL"] = server.url(pg_database)
        configure_django(var, instance, **extra)
        yield
    finally:
        from django.db import connections

        connections.close_all()
        if server is not None:
            server.stop()


def postgres_server(folder: Path):
    """A bench's own PostgreSQL 15 (tests/postgres_server.py), started, its
    data and password kept in `folder` so that a later run can reuse them."""
    from tests.postgres_server import PostgresServer

    folder.mkdir(parents=True, exist_ok=True)
    password_file = folder / "password"
    if not password_file.exists():
        password_file.touch(mode=0o600)
        password_file.write_text(secrets.token_urlsafe(24))
    server = PostgresServer(folder / "data", port=free_port(), password=password_file.read_text())
    server.start()
    return server


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]
