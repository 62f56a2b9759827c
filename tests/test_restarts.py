"""The services a portal stands on restart under it; nothing is lost.

Issue 13's scenarios 3, 4 and 6, on a small cluster of this module's own:
a PostgreSQL (tests/postgres_server.py) and a Redis with a password, each
on a loopback port of the run's slot and restartable by PID, gunicorn
serving the portal against them and one node agent on the test Docker
engine (tests/cluster.py starts both, as for the other tests). It runs in
this machine's own network namespace, on loopback: what is tested is how
the processes live through their database and Redis going away and coming
back, not what crosses a network (tests/test_multihost.py does that).

- PostgreSQL stopped and started again while a job prints numbered lines:
  every line is stored exactly once, in order; the job succeeds; the web
  answers at once afterwards (connection health checks, portal/settings.py)
  and the agent goes on (its log writer keeps the lines while the database
  is away, and never stores a batch twice: jobs/node/logwriter.py).
- Redis shut down and started again, empty (no persistence, as the tests'
  and scripts/run's), while a job runs: the same, and a job submitted
  afterwards is scheduled and runs (the wake-up and the node's queue are
  rebuilt by the agent: jobs/node/agent.py).
- A gunicorn worker SIGKILLed during a burst of concurrent REST
  submissions: each client got its job or an error, and no job is stored
  in part (a job is stored with its attempt and tasks in one transaction:
  jobs/services/job_store.py).

The test process reads the cluster's database through a database alias of
its own ("restarts").
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.cluster import ROOT, Cluster, process_env, wait_for
from tests.helpers import config, hashed_password, role
from tests.postgres_server import PostgresServer
from tests.settings import PORT_BASE, RUN_ID, TEST_VAR
from tests import settings as test_settings

pytestmark = [pytest.mark.services, pytest.mark.multihost]

ALIAS = "restarts"
NODE = "r-node"
FOLDER = TEST_VAR / "restarts"
# The top of the slot's sixth agent range (tests/cluster.py: port_range(5)):
# this module's agent takes 50 ports, PostgreSQL and Redis one each.
AGENT_PORTS = f"{PORT_BASE + 500}-{PORT_BASE + 549}"
POSTGRES_PORT = PORT_BASE + 598
REDIS_PORT = PORT_BASE + 599
INSTANCE = f"pai-test-{RUN_ID}-restarts"  # its own containers, networks and queues
COUNTING = 'i=1; while [ $i -le {n} ]; do echo "line $i"; i=$((i+1)); sleep 0.05; done'


# ------------------------------------------------------------------ Redis


class RedisServer:
    """A Redis with a password on a loopback TCP port, stopped and started
    by PID. Like the suite's and scripts/run's, it keeps nothing on disk: a
    restart comes back empty."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port, self.password = folder, port, secrets.token_hex(12)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "redis.log", "ab")
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--requirepass", self.password,
             "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._answers, timeout=20, what=f"redis on port {self.port}")

    def _answers(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"redis-server exited; see {self.folder / 'redis.log'}")
        ping = subprocess.run(["redis-cli", "-p", str(self.port), "--no-auth-warning", "-a", self.password, "ping"],
                              capture_output=True, text=True, timeout=10)
        return ping.stdout.strip() == "PONG"

    def stop(self) -> None:
        """SIGTERM: Redis shuts down (it saves nothing: --save "")."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# ---------------------------------------------------------------- cluster


@dataclass
class Restarts:
    postgres: PostgresServer
    redis: RedisServer
    processes: Cluster
    env: dict[str, str]
    user: object
    token: str

    @property
    def base_url(self) -> str:
        return self.processes.base_url

    def api(self, method: str, path: str, body: object = None) -> requests.Response:
        with requests.Session() as http:
            http.trust_env = False  # loopback only, never a proxy
            return http.request(method, f"{self.base_url}/api/v1{path}", timeout=60,
                                data=None if body is None else json.dumps(body),
                                headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})

    def submit(self, name: str, command: str, **role_args: object) -> object:
        """Submit through the REST API; the stored job."""
        from jobs.models import Job

        response = self.api("POST", f"/user/{self.user.username}/jobs", config(name, role(command=command, **role_args)))
        assert response.status_code == 202, response.text
        return Job.objects.using(ALIAS).get(owner_id=self.user.pk, name=name)


def _use_database(url: str) -> None:
    """Make the cluster's database reachable from this process as ALIAS."""
    import dj_database_url
    from django.db import connections

    wanted = {"default": connections.settings["default"], ALIAS: dj_database_url.parse(url, conn_health_checks=True)}
    connections.settings[ALIAS] = connections.configure_settings(wanted)[ALIAS]


def _forget_database() -> None:
    from django.db import connections

    connections[ALIAS].close()
    del connections.settings[ALIAS]


def _reconnect() -> None:
    """This process's own connection did not live through the restart."""
    from django.db import connections

    connections[ALIAS].close()


def _manage(env: dict[str, str], *command: str) -> None:
    subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=process_env(**env), check=True, timeout=600)


def _wait_node_ready(processes: Cluster) -> None:
    from jobs.models import Node

    def ready() -> bool:
        agent = processes.agent(NODE)
        if not agent.alive():
            raise AssertionError(f"agent {NODE} exited:\n{agent.log_tail()}")
        return Node.objects.using(ALIAS).filter(name=NODE, status=Node.Status.READY).exists()

    wait_for(ready, timeout=60, what=f"node {NODE} to be ready")


def _remove_containers() -> None:
    import docker

    client = docker.from_env()
    for container in client.containers.list(all=True, filters={"label": f"pai.instance={INSTANCE}"}):
        container.remove(force=True)
    for network in client.networks.list(filters={"label": f"pai.instance={INSTANCE}"}):
        try:
            network.remove()
        except docker.errors.APIError:
            pass


@pytest.fixture(scope="module")
def restarts(docker_engine, static_files) -> Iterator[Restarts]:
    from jobs.models import User

    postgres = PostgresServer(FOLDER / "postgres", port=POSTGRES_PORT, password=secrets.token_hex(12))
    redis = RedisServer(FOLDER / "redis", REDIS_PORT)
    processes = Cluster()
    database = f"portal_restarts_{RUN_ID}"
    try:
        postgres.start()
        postgres.drop_database(database)  # an earlier run's, killed before it could drop it
        postgres.create_database(database)
        redis.start()
        env = {
            "DATABASE_URL": postgres.url(database), "REDIS_URL": redis.url, "PAI_INSTANCE": INSTANCE,
            "JOB_SUBNET_POOL": f"10.{180 + test_settings._slot}.0.0/16",
            # Shorter than the outage: the database stays away for 10 s or more
            # here, and no heartbeat can be stored meanwhile. The first check
            # after it must not take that silence for lost nodes (it did, and
            # failed the running job: services/nodes._Watch).
            "NODE_LOST_AFTER_SECONDS": "8",
        }
        _manage(env, "migrate", "-v0")
        _manage(env, "ensure_defaults", "-v0")
        _use_database(env["DATABASE_URL"])
        processes.start_portal(name="restarts-gunicorn", env=env)
        processes.start_agent(NODE, ports=AGENT_PORTS, env=env, wait=False)
        _wait_node_ready(processes)
        user = User.objects.db_manager(ALIAS).create_user(f"restarter_{RUN_ID}")
        user.password = hashed_password("pw-for-tests-1")
        user.save(using=ALIAS, update_fields=["password"])
        token = requests.post(f"{processes.base_url}/api/v1/token", timeout=60,
                              data=json.dumps({"username": user.username, "password": "pw-for-tests-1"}),
                              headers={"Content-Type": "application/json"})
        assert token.status_code == 200, token.text
        yield Restarts(postgres, redis, processes, env, user, token.json()["token"])
    finally:
        processes.stop_all()
        _remove_containers()
        from django.db import connections

        if ALIAS in connections.settings:
            _forget_database()
        redis.stop()
        try:
            if postgres.pid is not None:
                postgres.drop_database(database)
        finally:
            postgres.stop()


# ---------------------------------------------------------------- helpers


def _state(job) -> str:
    job.refresh_from_db(using=ALIAS)
    return job.state


def _wait_state(job, state: str, timeout: float = 180) -> None:
    def reached() -> bool:
        return _state(job) == state

    try:
        wait_for(reached, timeout=timeout, interval=0.3, what=f"job {job.name} to be {state}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it is {job.state}: {job.exit_reason or job.waiting_reason}") from None


def _attempt(job):
    from jobs.models import TaskAttempt

    return wait_for(lambda: TaskAttempt.objects.using(ALIAS).filter(job_id=job.pk, state="RUNNING")
                    .exclude(container_id="").first(), timeout=120, what=f"job {job.name} to run")


def _stored(attempt) -> list[tuple[int, str]]:
    from jobs.models import LogLine, Stream

    return list(LogLine.objects.using(ALIAS).filter(attempt_id=attempt.pk, stream=Stream.STDOUT)
                .order_by("seq").values_list("seq", "text"))


def _printed(container_id: str) -> int:
    """The last number the container has printed (the engine's own log)."""
    import docker

    tail = docker.from_env().containers.get(container_id).logs(tail=1).decode()
    found = re.search(r"line (\d+)", tail)
    return int(found.group(1)) if found else 0


def _printing_on(container_id: str, beyond: int) -> None:
    """Wait until the container has printed `beyond` lines or more: lines
    made while a service is away."""
    wait_for(lambda: _printed(container_id) >= beyond, timeout=120, interval=0.2,
             what=f"the task to print line {beyond}")


def _assert_every_line_once(attempt, count: int) -> None:
    stored = _stored(attempt)
    assert [seq for seq, _ in stored] == list(range(len(stored))), "sequence numbers with gaps or repeats"
    texts = [text for _, text in stored]
    missing = sorted(set(range(1, count + 1)) - {int(t.split()[1]) for t in texts if t.startswith("line ")})
    assert texts == [f"line {i}" for i in range(1, count + 1)], (
        f"{len(texts)} lines stored for {count} printed; missing {missing[:20]}; "
        f"repeated {sorted({t for t in texts if texts.count(t) > 1})[:20]}")


# ------------------------------------------------------------------ tests


def test_it_loses_and_repeats_no_log_line_when_postgresql_restarts_mid_job(restarts):
    lines = 900
    job = restarts.submit("pg_restart", COUNTING.format(n=lines))
    attempt = _attempt(job)
    wait_for(lambda: len(_stored(attempt)) >= 20, timeout=60, what="the first lines to be stored")
    restarts.postgres.stop()
    down_at = _printed(attempt.container_id)
    # Lines printed while the database is away must be kept by the agent,
    # however long it is away: 200 lines take more than the 10 s a write
    # used to be tried for before its lines were dropped.
    _printing_on(attempt.container_id, down_at + 200)
    restarts.postgres.start()
    _reconnect()
    back_at = _printed(attempt.container_id)
    assert back_at < lines, "the job ended before PostgreSQL came back: nothing was tested; make it longer"

    # The web answers at once: its kept connections are checked before use.
    answer = restarts.api("GET", "/jobs")
    assert answer.status_code == 200, answer.text[:500]
    # The agent's own connections were renewed: it schedules and launches a new job.
    after = restarts.submit("after_pg_restart", "echo after the restart")
    _wait_state(after, "SUCCEEDED", timeout=120)
    _wait_state(job, "SUCCEEDED")
    _assert_every_line_once(attempt, lines)
    assert restarts.processes.agent(NODE).alive()


def test_it_goes_on_and_schedules_new_jobs_when_redis_restarts_mid_job(restarts):
    lines = 400
    job = restarts.submit("redis_restart", COUNTING.format(n=lines))
    attempt = _attempt(job)
    wait_for(lambda: len(_stored(attempt)) >= 20, timeout=60, what="the first lines to be stored")
    restarts.redis.stop()
    _printing_on(attempt.container_id, _printed(attempt.container_id) + 40)
    restarts.redis.start()  # empty: every queue, flag and launch request is gone
    assert _printed(attempt.container_id) < lines, "the job ended before Redis came back: make it longer"

    answer = restarts.api("GET", "/jobs")
    assert answer.status_code == 200, answer.text[:500]
    _wait_state(job, "SUCCEEDED")
    _assert_every_line_once(attempt, lines)
    # After the restart: the scheduler is woken and the node's queue served.
    after = restarts.submit("after_redis_restart", "echo after the restart")
    _wait_state(after, "SUCCEEDED", timeout=120)
    assert restarts.processes.agent(NODE).alive()


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def test_a_worker_killed_during_a_burst_of_submissions_leaves_no_job_half_stored(restarts):
    from jobs.models import Job, JobAttempt, Task

    master = restarts.processes.processes["restarts-gunicorn"].popen.pid
    workers = _children(master)
    assert len(workers) >= 2, workers
    names = [f"burst_{i}" for i in range(40)]
    outcomes: dict[str, str] = {}
    lock = threading.Lock()
    accepted_some = threading.Event()

    def client(mine: list[str]) -> None:
        with requests.Session() as http:
            http.trust_env = False
            for name in mine:
                # Never fits (the node has no GPU): the jobs stay waiting.
                body = json.dumps(config(name, role(command="true", gpus=1)))
                try:
                    response = http.post(f"{restarts.base_url}/api/v1/user/{restarts.user.username}/jobs", data=body,
                                         timeout=120, headers={"Authorization": f"Bearer {restarts.token}",
                                                               "Content-Type": "application/json"})
                    outcome = ("accepted" if response.status_code == 202
                               else "error" if response.status_code >= 500 else f"HTTP {response.status_code}")
                except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                    # Killed before its answer (ConnectionError), or between the
                    # headers and the body gunicorn writes apart (ChunkedEncodingError):
                    # either way the client cannot know whether the job was stored.
                    outcome = "error"
                with lock:
                    outcomes[name] = outcome
                    if sum(1 for o in outcomes.values() if o == "accepted") >= 6:
                        accepted_some.set()

    threads = [threading.Thread(target=client, args=(names[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    assert accepted_some.wait(180), f"no submissions accepted: {outcomes}"
    os.kill(workers[0], signal.SIGKILL)
    for thread in threads:
        thread.join(300)
    assert not any(thread.is_alive() for thread in threads)

    assert set(outcomes) == set(names)
    assert set(outcomes.values()) <= {"accepted", "error"}, outcomes
    stored = {job.name: job for job in Job.objects.using(ALIAS).filter(owner_id=restarts.user.pk,
                                                                       name__startswith="burst_")}
    accepted = {name for name, outcome in outcomes.items() if outcome == "accepted"}
    assert accepted <= set(stored), f"accepted but not stored: {sorted(accepted - set(stored))}"
    for job in stored.values():  # a client that saw an error may still have its job: whole, though
        assert job.config["taskRoles"][0]["name"] == "main"
        assert list(JobAttempt.objects.using(ALIAS).filter(job_id=job.pk).values_list("number", flat=True)) == [1]
        assert Task.objects.using(ALIAS).filter(job_id=job.pk).count() == job.total_tasks == 1
    # The master replaced the killed worker, and the portal answers.
    wait_for(lambda: len(_children(master)) == len(workers) and workers[0] not in _children(master), timeout=60,
             what="gunicorn to replace the killed worker")
    assert restarts.api("GET", "/jobs").status_code == 200


# ---------------------------------------------- the log writer, at its seam
# Real database (the session's), no engine: what the writer does when a
# write fails because the database went away.


@pytest.fixture
def log_attempt(alice):
    from tests.helpers import rows_only_attempt

    return rows_only_attempt(alice, "restartlog")


def _lines(attempt) -> list[tuple[int, str]]:
    from jobs.models import LogLine, Stream

    return list(LogLine.objects.filter(attempt=attempt, stream=Stream.STDOUT).order_by("seq").values_list("seq", "text"))


def test_the_log_writer_keeps_trying_while_the_database_is_away(log_attempt, monkeypatch):
    from django.db import OperationalError

    from jobs.models import Stream
    from jobs.node import logwriter

    monkeypatch.setattr(logwriter.time, "sleep", lambda seconds: None)
    writer = logwriter.LogWriter(flush_seconds=0.05)
    writer.open(log_attempt.pk, Stream.STDOUT)
    write, failures = writer._write, []

    def away_for_a_while(items):
        if len(failures) < 12:  # more than the five tries a refused write gets
            failures.append(1)
            raise OperationalError("connection refused")
        write(items)

    monkeypatch.setattr(writer, "_write", away_for_a_while)
    writer._write_with_retry([logwriter._Batch(log_attempt.pk, Stream.STDOUT, ["a", "b"], (1, 2), size=2)])
    assert _lines(log_attempt) == [(0, "a"), (1, "b")]


def test_a_log_batch_committed_though_its_commit_seemed_to_fail_is_not_stored_again(log_attempt, monkeypatch):
    from django.db import OperationalError

    from jobs.models import Stream
    from jobs.node import logwriter

    monkeypatch.setattr(logwriter.time, "sleep", lambda seconds: None)
    writer = logwriter.LogWriter(flush_seconds=0.05)
    writer.open(log_attempt.pk, Stream.STDOUT)
    key = (log_attempt.pk, Stream.STDOUT)
    write, calls = writer._write, []

    def committed_but_unheard(items):
        before = logwriter._StreamState(**vars(writer._states[key]))
        calls.append(1)
        write(items)
        if len(calls) == 1:  # the connection dropped as COMMIT went through: we never heard back
            writer._states[key] = before
            raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(writer, "_write", committed_but_unheard)
    writer._write_with_retry([logwriter._Batch(log_attempt.pk, Stream.STDOUT, ["a", "b"], (1, 2), size=2)])
    writer._write_with_retry([logwriter._Batch(log_attempt.pk, Stream.STDOUT, ["c"], (2, 1), size=1)])
    assert _lines(log_attempt) == [(0, "a"), (1, "b"), (2, "c")]
