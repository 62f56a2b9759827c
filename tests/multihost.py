"""Several hosts on this one machine, for tests of what crosses a network.

Each host is a Linux network namespace with one end of a veth pair inside
(named eth0 there) and the other end on a bridge this module creates, in a
private subnet taken from the test run's slot (10.<200+slot>.0.0/24), so two
test runs never share a name or an address. The machine itself gets .1 on
the bridge: the test process reaches every host from there.

    portal host (.2)   PostgreSQL, Redis (passwords, on its own address),
                       gunicorn serving the portal
    node hosts (.11..) each its own dockerd (data root, exec root, pidfile,
                       socket, bridge subnet, /etc/docker and host name:
                       its own engine identity) and its own node agent

Processes run inside a namespace through `nsenter --net=...` (which execs in
place, so the PID we hold is the program's), never `ip netns exec`, which
remounts /sys and hides the cgroup mounts dockerd needs (see the machine
notes). Docker sets the machine's FORWARD policy to DROP and bridged frames
pass through iptables, so one ACCEPT rule for the bridge lets the hosts talk.

Everything is undone by PID and by the names made here, in reverse order,
even when a test fails. Names left by a test run that was killed (those of
our slot, or of a slot no live run holds) are removed before anything is
made, with what still runs in those namespaces.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from tests import settings as test_settings
from tests.cluster import ROOT, process_env, wait_for
from tests.postgres_server import PostgresServer
from tests.services import BUSYBOX_IMAGE
from tests.settings import RUN_ID, SLOT_LOCKS, TEST_VAR

SLOT: int = test_settings._slot
PREFIX = f"pmh{SLOT}-"  # never "pai-": node agents' firewall matches bridges named pai-+
SUBNET = f"10.{200 + SLOT}.0"
BRIDGE = f"{PREFIX}br"
MACHINE_ADDRESS = f"{SUBNET}.1"
PORTAL_ADDRESS = f"{SUBNET}.2"
# Task networks (JOB_SUBNET_POOL) and engines' default bridges stay out of
# the hosts' /24.
JOB_SUBNET_POOL = f"10.{200 + SLOT}.128.0/17"
MH_ROOT = TEST_VAR / "multihost"
IMAGES_TAR = TEST_VAR / "multihost-images.tar"
LOGS = TEST_VAR / "multihost-logs"  # kept after the tear-down, for a failed test's reader
NODE_PORTS = "20000-20099"  # each node host has its own ports: they may overlap
# The multi-host portal's own timings: a node is lost after 6 s of silence.
PORTAL_TIMINGS = {
    "NODE_HEARTBEAT_SECONDS": "1",
    "NODE_LOST_AFTER_SECONDS": "6",
    "RECONCILE_SECONDS": "2",
    "SCHEDULE_REPAIR_SECONDS": "2",
    "STOP_GRACE_SECONDS": "2",
    "LOG_FLUSH_SECONDS": "0.2",
}


TIMINGS: list[tuple[str, float]] = []  # (step, seconds) of the build and tear-down, for the report


@contextmanager
def timed(step: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        TIMINGS.append((step, time.monotonic() - started))


def sh(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def in_netns(netns: str, command: list[str]) -> list[str]:
    return ["nsenter", f"--net=/var/run/netns/{netns}", "--", *command]


class Undo:
    """What was made, undone in reverse order; every step runs even when
    an earlier one fails (the failures are reported together)."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[[], None]]] = []
        self._lock = threading.Lock()

    def push(self, what: str, step: Callable[[], None]) -> None:
        with self._lock:
            self._steps.append((what, step))

    def run(self) -> None:
        failures = []
        while self._steps:
            what, step = self._steps.pop()
            started = time.monotonic()
            try:
                step()
            except Exception as exc:  # go on: the rest must be undone too
                failures.append(f"{what}: {exc}")
            TIMINGS.append((f"undo {what}", time.monotonic() - started))
        if failures:
            raise RuntimeError("tear-down left something behind:\n  " + "\n  ".join(failures))


# --------------------------------------------------------------- processes


@dataclass
class Spawned:
    """A process we started in its own session (process group)."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to its process group, SIGKILL to the group if it lingers."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def spawn(name: str, command: list[str], *, env: dict[str, str] | None = None) -> Spawned:
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{name}.log"
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    return Spawned(name, popen, log_path)


# ----------------------------------------------------------------- network


@dataclass
class Host:
    """One network namespace on the bridge."""

    name: str  # short: portal, n1, n2 ...
    address: str

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.name}"

    @property
    def veth(self) -> str:  # the machine's end, on the bridge (at most 15 characters)
        return f"{PREFIX}{self.name}"

    def wrap(self, command: list[str]) -> list[str]:
        return in_netns(self.netns, command)

    def link(self, up: bool) -> None:
        """Plug the host's cable in or pull it out (the machine's end)."""
        sh("ip", "link", "set", self.veth, "up" if up else "down")


def _create_bridge(undo: Undo) -> None:
    undo.push(f"bridge {BRIDGE}", lambda: sh("ip", "link", "del", BRIDGE, check=False))
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{MACHINE_ADDRESS}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    rule = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]
    sh("iptables", "-w", "10", "-I", *rule)
    undo.push("iptables rule", lambda: sh("iptables", "-w", "10", "-D", *rule))


def _create_host(host: Host, undo: Undo) -> None:
    undo.push(f"namespace {host.netns}", lambda: _delete_netns(host.netns))
    sh("ip", "netns", "add", host.netns)
    inner = f"{host.veth}i"
    sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", inner)
    undo.push(f"veth {host.veth}", lambda: sh("ip", "link", "del", host.veth, check=False))
    sh("ip", "link", "set", inner, "netns", host.netns)
    sh("ip", "link", "set", host.veth, "master", BRIDGE, "up")
    for command in (["ip", "link", "set", "lo", "up"], ["ip", "link", "set", inner, "name", "eth0"],
                    ["ip", "addr", "add", f"{host.address}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"]):
        sh(*host.wrap(command))


def _delete_netns(netns: str) -> None:
    """Kill what still runs in the namespace (only our processes live in
    a namespace we made), then delete it."""
    if not Path(f"/var/run/netns/{netns}").exists():
        return
    pids = sh("ip", "netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    sh("ip", "netns", "del", netns)


def remove_leftovers() -> None:
    """Names left behind by runs whose pytest was killed: those of our own
    slot (it is ours now) and of any slot no live test run holds."""
    stale = _free_slots()
    netns = Path("/var/run/netns")
    for entry in sorted(netns.iterdir()) if netns.is_dir() else []:
        if _slot_of(entry.name) in stale:
            _delete_netns(entry.name)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if _slot_of(name) in stale:
            sh("ip", "link", "del", name, check=False)
    for line in sh("iptables", "-w", "10", "-S", "FORWARD", check=False).stdout.splitlines():
        words = line.split()
        if words[:2] == ["-A", "FORWARD"] and "-i" in words and _slot_of(words[words.index("-i") + 1]) in stale:
            sh("iptables", "-w", "10", "-D", *words[1:], check=False)
    for folder in Path("/run").glob("pmh*-*"):
        if _slot_of(folder.name) in stale:
            shutil.rmtree(folder, ignore_errors=True)


def _slot_of(name: str) -> int | None:
    """The slot in a name made here (pmh<slot>-...), or None."""
    head, dash, _rest = name.partition("-")
    return int(head[3:]) if dash and head.startswith("pmh") and head[3:].isdigit() else None


def _free_slots() -> set[int]:
    """Our slot, and the slots whose lock no live test run holds."""
    import fcntl

    free = {SLOT}
    for lock in SLOT_LOCKS.glob("slot-*.lock"):
        number = lock.stem.removeprefix("slot-")
        if not number.isdigit() or int(number) == SLOT:
            continue
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live run holds it
            free.add(int(number))  # closing the file releases it
    return free


# ----------------------------------------------------------------- engines


def save_images() -> Path:
    """The local images, saved once per test run from the machine's engine."""
    if not IMAGES_TAR.exists():
        partial = IMAGES_TAR.with_suffix(".partial")
        sh("docker", "save", "-o", str(partial), BUSYBOX_IMAGE, timeout=300)
        partial.rename(IMAGES_TAR)
    return IMAGES_TAR


@dataclass
class Engine:
    """A dockerd of a node host, with an engine identity of its own: its
    own /etc/docker (so its own key.json, hence its own ID) and host name,
    through a private mount and UTS namespace."""

    host: Host
    index: int
    process: Spawned | None = None

    @property
    def run_dir(self) -> Path:  # short: the containerd socket lives under the exec root
        return Path("/run") / self.host.netns

    @property
    def socket(self) -> str:
        return f"unix://{self.run_dir / 'docker.sock'}"

    @property
    def data_dir(self) -> Path:
        return MH_ROOT / self.host.name

    def start(self, undo: Undo) -> None:
        etc = self.data_dir / "etc-docker"
        etc.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        undo.push(f"engine folders of {self.host.name}", self._remove_folders)
        dockerd = [
            "dockerd", "--data-root", str(self.data_dir / "docker"), "--exec-root", str(self.run_dir / "exec"),
            "--pidfile", str(self.run_dir / "docker.pid"), "-H", self.socket,
            "--bip", f"10.{200 + SLOT}.{64 + self.index}.1/24", "--shutdown-timeout", "2", "--log-level", "warn",
        ]
        inner = (f"mount --bind {etc} /etc/docker && hostname {self.host.netns} && exec "
                 + " ".join(dockerd))
        command = self.host.wrap(["unshare", "--uts", "--mount", "sh", "-c", inner])
        self.process = spawn(f"dockerd-{self.host.name}", command)
        undo.push(f"dockerd of {self.host.name}", self.stop)

    def wait_ready(self) -> None:
        import docker

        def answers() -> bool:
            if self.process is None or not self.process.alive():
                raise AssertionError(f"dockerd of {self.host.name} exited:\n"
                                     + (self.process.log_tail() if self.process else ""))
            return bool(docker.DockerClient(base_url=self.socket, timeout=5).ping())

        wait_for(answers, timeout=60, what=f"dockerd of {self.host.name}")

    def load(self, images: Path) -> subprocess.Popen:
        return subprocess.Popen(["docker", "-H", self.socket, "load", "-q", "-i", str(images)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.socket, timeout=30)

    def info(self) -> dict[str, Any]:
        return self.client().info()

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.alive():
            try:  # the engine is ours alone: every container on it is the test's
                for container in self.client().containers.list(all=True):
                    container.remove(force=True)
            except Exception:
                pass  # stopping the engine stops them anyway
        self.process.stop(timeout=30)

    def _remove_folders(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)


# ------------------------------------------------------------------ portal


class PortalDb:
    """Read-only SQL on the multi-host portal's PostgreSQL, for what the
    REST API does not show (timestamps, allocations, log rows)."""

    def __init__(self, server: PostgresServer, dbname: str) -> None:
        self.server = server
        self.dbname = dbname

    def rows(self, query: str, params: tuple | list = ()) -> list[dict[str, Any]]:
        from psycopg.rows import dict_row

        with self.server.connect(self.dbname, autocommit=True) as connection:
            connection.row_factory = dict_row
            return list(connection.execute(query, params).fetchall())

    def one(self, query: str, params: tuple | list = ()) -> dict[str, Any] | None:
        found = self.rows(query, params)
        return found[0] if found else None

    # The questions the tests ask.

    def node(self, name: str) -> dict[str, Any] | None:
        return self.one("SELECT * FROM jobs_node WHERE name = %s", [name])

    def job(self, owner: str, name: str) -> dict[str, Any] | None:
        return self.one("SELECT j.* FROM jobs_job j JOIN jobs_user u ON u.id = j.owner_id "
                        "WHERE u.username = %s AND j.name = %s", [owner, name])

    def task_attempts(self, job_id: int) -> list[dict[str, Any]]:
        return self.rows("SELECT a.*, t.role, t.index FROM jobs_taskattempt a JOIN jobs_task t ON t.id = a.task_id "
                         "WHERE a.job_id = %s ORDER BY a.number, t.role, t.index", [job_id])

    def log_lines(self, attempt_id: int, stream: int = 1) -> list[str]:
        return [row["text"] for row in self.rows(
            "SELECT text FROM jobs_logline WHERE attempt_id = %s AND stream = %s ORDER BY seq", [attempt_id, stream])]


class Api:
    """The portal's REST API (v1), as a script would use it, as one user."""

    def __init__(self, base_url: str, token: str, *, username: str, password: str) -> None:
        self.base_url = base_url
        self.username = username
        self.test_password = password  # for the web login form (tests/helpers.login)
        self.http = requests.Session()
        self.http.trust_env = False  # the portal host's address only, never a proxy
        self.http.headers["Authorization"] = f"Bearer {token}"

    def _job_url(self, name: str = "") -> str:
        return f"{self.base_url}/api/v1/user/{self.username}/jobs" + (f"/{name}" if name else "")

    def submit(self, config: dict[str, Any]) -> None:
        response = self.http.post(self._job_url(), json=config, timeout=30)
        assert response.status_code == 202, f"submit {config['jobName']}: {response.status_code} {response.text[:500]}"

    def job(self, name: str) -> dict[str, Any]:
        response = self.http.get(self._job_url(name), timeout=30)
        assert response.status_code == 200, f"job {name}: {response.status_code} {response.text[:300]}"
        return response.json()

    def stop(self, name: str) -> None:
        response = self.http.put(self._job_url(name) + "/executionType", json={"value": "STOP"}, timeout=30)
        assert response.status_code == 202, f"stop {name}: {response.status_code} {response.text[:300]}"

    def wait_state(self, name: str, *states: str, timeout: float = 90) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job = self.job(name)
            return job if job["jobStatus"]["state"] in states else None

        return wait_for(reached, timeout=timeout, interval=0.3, what=f"job {name} to be {'/'.join(states)}")


@dataclass
class PortalHost:
    host: Host
    db_password: str = field(default_factory=lambda: secrets.token_hex(12))
    redis_password: str = field(default_factory=lambda: secrets.token_hex(12))
    dbname: str = "portal"
    http_port: int = 8000
    redis_port: int = 6379
    postgres: PostgresServer | None = None
    redis: Spawned | None = None
    gunicorn: Spawned | None = None
    join_token: str = ""  # what an admin hands to node machines (manage.py node_token)

    @property
    def base_url(self) -> str:
        return f"http://{self.host.address}:{self.http_port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of every portal process (web and node agents):
        the test run's, pointed at this portal's PostgreSQL and Redis."""
        assert self.postgres is not None
        return process_env(
            DATABASE_URL=self.postgres.url(self.dbname),
            REDIS_URL=f"redis://:{self.redis_password}@{self.host.address}:{self.redis_port}/0",
            PORTAL_VAR_DIR=str(MH_ROOT / "var"),
            STORAGE_LOCAL_ROOT=str(MH_ROOT / "var" / "storage"),
            PORTAL_ALLOWED_HOSTS=self.host.address,
            JOB_SUBNET_POOL=JOB_SUBNET_POOL,
            PAI_INSTANCE=f"pai-test-{RUN_ID}",
            PORTAL_WORKERS="2",
            **PORTAL_TIMINGS,
            **extra,
        )

    def start_services(self, undo: Undo) -> None:
        """PostgreSQL and Redis, on the portal host's address."""
        self.postgres = PostgresServer(MH_ROOT / "postgres", host=self.host.address, port=5432,
                                       password=self.db_password, netns=self.host.netns,
                                       settings={"hba_file": str(self._hba_file())})
        undo.push("postgres", self.postgres.stop)
        self.postgres.start()
        self.postgres.create_database(self.dbname)
        redis_dir = MH_ROOT / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        self.redis = spawn("redis", self.host.wrap([
            "redis-server", "--bind", self.host.address, "--port", str(self.redis_port),
            "--requirepass", self.redis_password, "--save", "", "--appendonly", "no", "--dir", str(redis_dir),
        ]))
        undo.push("redis", self.redis.stop)

    def _hba_file(self) -> Path:
        """initdb's pg_hba.conf admits loopback only; the node hosts connect
        over the bridge, with the password (SCRAM)."""
        path = MH_ROOT / "pg_hba.conf"
        path.write_text("local all all scram-sha-256\n"
                        f"host all all {SUBNET}.0/24 scram-sha-256\n")
        path.chmod(0o644)
        return path

    def manage(self, *commands: list[str], timeout: float = 300) -> list[str]:
        """manage.py commands, run one after the other in one process with
        this portal's settings (a process start costs seconds on a busy
        machine); what each printed on stdout."""
        script = ("import io, json, sys, django\n"
                  "django.setup()\n"
                  "from django.core.management import call_command\n"
                  "printed = []\n"
                  "for args in json.loads(sys.argv[1]):\n"
                  "    out = io.StringIO()\n"
                  "    call_command(*args, stdout=out)\n"
                  "    printed.append(out.getvalue())\n"
                  "print(json.dumps(printed))\n")
        done = subprocess.run([sys.executable, "-c", script, json.dumps(commands)], cwd=ROOT, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {commands} failed:\n{done.stdout}{done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def start_web(self, undo: Undo, *, users: list[str]) -> dict[str, Api]:
        """gunicorn, started while the database is migrated; the join token;
        `users` made with createuser, each with an API client."""
        self.gunicorn = spawn("gunicorn", self.host.wrap([
            sys.executable, "-m", "gunicorn", "-c", "portal/gunicorn.conf.py", "-b",
            f"{self.host.address}:{self.http_port}", "--graceful-timeout", "5",
        ]), env=self.env())
        undo.push("gunicorn", self.gunicorn.stop)
        passwords = {user: secrets.token_urlsafe(16) for user in users}
        files = {user: MH_ROOT / f"password-{user}" for user in users}
        for user, path in files.items():
            path.write_text(passwords[user] + "\n")
        try:
            with timed("migrate, defaults, join token, users"):
                printed = self.manage(["migrate", "-v0"], ["ensure_defaults", "-v0"],
                                      ["node_token", "--ttl", "3600", "--label", "multi-host test"],
                                      ["collectstatic", "--noinput", "-v0"],  # pages (login) need the manifest
                                      *[["createuser", user, "--password-file", str(files[user])] for user in users])
        finally:
            for path in files.values():
                path.unlink()
        self.join_token = printed[2].strip()

        def answers() -> bool:
            assert self.gunicorn is not None
            if not self.gunicorn.alive():
                raise AssertionError(f"gunicorn exited:\n{self.gunicorn.log_tail()}")
            return requests.get(f"{self.base_url}/api/v1/", timeout=5).status_code == 200

        with timed("gunicorn answers"):
            wait_for(answers, timeout=90, what="the portal host's gunicorn")
        return {user: self.login(user, passwords[user]) for user in users}

    def login(self, username: str, password: str) -> Api:
        """An API client holding a token got from /api/v1/token."""
        response = requests.post(f"{self.base_url}/api/v1/token", json={"username": username, "password": password},
                                 timeout=30)
        assert response.status_code == 200, response.text
        return Api(self.base_url, response.json()["token"], username=username, password=password)


# ------------------------------------------------------------------- nodes


@dataclass
class NodeHost:
    host: Host
    engine: Engine
    node_name: str
    gpus: int = 1
    gpu_type: str = "MH"
    agent: Spawned | None = None

    def start_agent(self, portal: PortalHost, undo: Undo) -> Spawned:
        """The node joins as an admin's instructions say: `scripts/join-node
        <portal> <token> --foreground`, in a bare environment (no setting of
        the portal's is copied by hand: they come from the portal, with the
        token), which then runs the agent in place (same PID)."""
        assert portal.join_token, "the portal host made no join token"
        var = MH_ROOT / self.host.name / "var"
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": "/root", "LANG": "C.UTF-8",
               "PORTAL_VAR_DIR": str(var), "PYTHONUNBUFFERED": "1"}
        command = self.host.wrap([
            str(ROOT / "scripts" / "join-node"), portal.base_url, portal.join_token, "--foreground",
            "--name", self.node_name, "--address", self.host.address, "--docker-host", self.engine.socket,
            "--ports", NODE_PORTS, "--cpus", "4", "--memory-mb", "4096", "--gpus", str(self.gpus),
            "--gpu-type", self.gpu_type,
        ])
        self.agent = spawn(f"agent-{self.node_name}", command, env=env)
        undo.push(f"agent {self.node_name}", self.agent.stop)
        return self.agent


# ----------------------------------------------------------------- cluster


@dataclass
class MultiHostCluster:
    undo: Undo = field(default_factory=Undo)
    portal: PortalHost = field(default_factory=lambda: PortalHost(Host("portal", PORTAL_ADDRESS)))
    nodes: dict[str, NodeHost] = field(default_factory=dict)
    db: PortalDb | None = None
    apis: dict[str, Api] = field(default_factory=dict)  # the users' API clients, by username
    _web_error: BaseException | None = None

    def node_host(self, name: str, index: int, *, gpus: int = 1, gpu_type: str = "MH") -> NodeHost:
        """A node host's namespace and engine description (nothing started)."""
        host = Host(name, f"{SUBNET}.{10 + index}")
        node = NodeHost(host, Engine(host, index), node_name=f"mh-{name}", gpus=gpus, gpu_type=gpu_type)
        self.nodes[name] = node
        return node

    def build(self, node_names: list[str], *, late: list[str] = (), gpus: dict[str, int] | None = None,
              users: list[str] = ()) -> None:
        """The bridge, the portal host, the node hosts with their engines
        (started together), and the agents of `node_names`; the hosts in
        `late` get an engine but no agent (a test starts it). Each node
        offers one simulated GPU unless `gpus` says otherwise. `users` are
        made on the portal, with API clients in `apis`."""
        TIMINGS.clear()
        with timed("network and namespaces"):
            remove_leftovers()
            shutil.rmtree(LOGS, ignore_errors=True)
            MH_ROOT.mkdir(parents=True, exist_ok=True)
            images = save_images()
            _create_bridge(self.undo)
            _create_host(self.portal.host, self.undo)
            for index, name in enumerate([*node_names, *late], start=1):
                _create_host(self.node_host(name, index, gpus=(gpus or {}).get(name, 1)).host, self.undo)
        for node in self.nodes.values():
            node.engine.start(self.undo)
        # PostgreSQL, Redis, the migrations and gunicorn start while the
        # engines start and load the images.
        with timed("postgres and redis"):
            self.portal.start_services(self.undo)
        assert self.portal.postgres is not None
        self.db = PortalDb(self.portal.postgres, self.portal.dbname)
        web = threading.Thread(target=self._start_web_or_note, args=(list(users),))
        web.start()
        try:
            with timed("engines ready and images loaded"):
                loads = []
                for node in self.nodes.values():
                    node.engine.wait_ready()
                    loads.append((node, node.engine.load(images)))
                for node, load in loads:
                    _, errors = load.communicate(timeout=300)
                    assert load.returncode == 0, f"docker load on {node.host.name}: {errors}"
        finally:  # what it starts must be on the undo list before a tear-down
            with timed("waiting for the portal host"):
                web.join()
        if self._web_error:
            raise self._web_error
        ids = {node.engine.info()["ID"] for node in self.nodes.values()}
        assert len(ids) == len(self.nodes), f"engines share an identity: {ids}"
        with timed("nodes joined"):
            for name in node_names:
                self.start_agent(name)
            for name in node_names:
                self.wait_node_ready(name)

    def _start_web_or_note(self, users: list[str]) -> None:
        try:
            self.apis = self.portal.start_web(self.undo, users=users)
        except BaseException as exc:  # raised again in build()
            self._web_error = exc

    def start_agent(self, name: str) -> Spawned:
        return self.nodes[name].start_agent(self.portal, self.undo)

    def wait_node_ready(self, name: str, *, since: datetime | None = None) -> dict[str, Any]:
        node = self.nodes[name]
        assert self.db is not None

        def ready() -> dict[str, Any] | None:
            if node.agent is not None and not node.agent.alive():
                raise AssertionError(f"agent of {name} exited:\n{node.agent.log_tail()}")
            row = self.db.node(node.node_name)
            if row and row["status"] == "READY" and row["agent_pid"] and (since is None or row["last_heartbeat"] >= since):
                return row
            return None

        return wait_for(ready, timeout=60, what=f"node {node.node_name} to be ready")

    def teardown(self) -> None:
        # Agents and gunicorn take a few seconds each to stop: all at once.
        for process in [node.agent for node in self.nodes.values()] + [self.portal.gunicorn]:
            if process is not None and process.alive():
                _signal_group(process.popen.pid, signal.SIGTERM)
        self.undo.run()
        shutil.rmtree(MH_ROOT, ignore_errors=True)


@contextmanager
def multihost_cluster(node_names: list[str], *, late: list[str] = (), gpus: dict[str, int] | None = None,
                      users: list[str] = ()) -> Iterator[MultiHostCluster]:
    cluster = MultiHostCluster()
    try:
        cluster.build(node_names, late=list(late), gpus=gpus, users=list(users))
        yield cluster
    finally:
        cluster.teardown()
