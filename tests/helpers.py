"""Small helpers for tests that run jobs on the real test cluster."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

from jobs import services
from jobs.models import FINAL_STATES, Job, LogLine, Stream, TaskAttempt, User, VirtualCluster
from tests.cluster import wait_for
from tests.services import BUSYBOX_IMAGE, DEBIAN_IMAGE

EXAMPLES = Path(__file__).parent / "data" / "examples"


def config(name: str, *roles: dict[str, Any], image: str = BUSYBOX_IMAGE, **top: Any) -> dict[str, Any]:
    return {"jobName": name, "image": image, "taskRoles": list(roles), **top}


def hold_vc(name: str, *users) -> VirtualCluster:
    """A virtual cluster with no share of the cluster: its jobs wait forever
    (and block no one), for tests that need jobs that never start."""
    vc = VirtualCluster.objects.create(name=name, capacity=0.0)
    vc.users.add(*users)
    return vc


def role(name: str = "main", command: str = "echo hello", *, tasks: int = 1, cpus: int = 1, memory: int = 256,
         gpus: int = 0, **extra: Any) -> dict[str, Any]:
    return {"name": name, "taskNumber": tasks, "cpuNumber": cpus, "memoryMB": memory, "gpuNumber": gpus,
            "command": command, **extra}


def submit(user, cfg: dict[str, Any] | str) -> Job:
    text = cfg if isinstance(cfg, str) else json.dumps(cfg)
    return services.job_submit(owner=user, config=text)


def wait_state(job: Job, *states: str, timeout: float = 60.0) -> Job:
    def reached() -> Job | None:
        job.refresh_from_db()
        return job if job.state in states else None

    try:
        return wait_for(reached, timeout=timeout, interval=0.2, what=f"job {job.name} to be {'/'.join(states)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it is {job.state}: {job.exit_reason or job.waiting_reason}\n{describe(job)}") from None


def running_attempt(job: Job, timeout: float = 60) -> TaskAttempt:
    """The job's task attempt once it runs in a container."""
    return wait_for(lambda: TaskAttempt.objects.filter(job=job, state="RUNNING").exclude(container_id="").first(),
                    timeout=timeout, what="the task to run")


def describe(job: Job) -> str:
    lines = []
    for attempt in TaskAttempt.objects.filter(job=job).select_related("task"):
        lines.append(f"  {attempt.task} #{attempt.number} on {attempt.node_name}: {attempt.state} {attempt.exit_reason}")
        for log in LogLine.objects.filter(attempt=attempt).order_by("stream", "seq")[:20]:
            lines.append(f"    [{Stream(log.stream).label}] {log.text}")
    return "\n".join(lines)


def lines(job: Job, stream: int = Stream.STDOUT, *, role: str | None = None, index: int = 0, number: int | None = None) -> list[str]:
    attempts = TaskAttempt.objects.filter(job=job)
    if role is not None:
        attempts = attempts.filter(task__role=role, task__index=index)
    if number is not None:
        attempts = attempts.filter(number=number)
    attempt = attempts.order_by("-number", "id").first()
    assert attempt is not None, f"job {job.name} has no task attempt"
    return list(LogLine.objects.filter(attempt=attempt, stream=stream).order_by("seq").values_list("text", flat=True))


def example(name: str, **replace: Any) -> dict[str, Any]:
    """A reference example as a dict (comments stripped by our parser)."""
    from jobs import jsonc

    value = jsonc.loads((EXAMPLES / name).read_text()).value
    value.update(replace)
    return value


_counter = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{next(_counter)}_{uuid.uuid4().hex[:6]}"


def new_user(prefix: str = "user", *, admin: bool = False, password: str = "pw-for-tests-1") -> User:
    """A user of a test's own: a unique name, `password` (hashed once per
    run) kept as `test_password` for the login form."""
    user = User.objects.create_user(unique(prefix), is_staff=admin, is_superuser=admin)
    user.password = hashed_password(password)
    user.save(update_fields=["password"])
    user.test_password = password  # type: ignore[attr-defined]
    return user


@contextlib.contextmanager
def running_job_of(owner: User, job_config: dict, *, timeout: float = 60) -> Iterator[tuple[Job, TaskAttempt]]:
    """`job_config` submitted as `owner`, once its first task runs in a
    container; stopped afterwards unless it has ended, and waited for: a
    test's own node agent may be stopped next, and a container it left
    behind would hold its host ports against the next test's tasks."""
    job = submit(owner, job_config)
    try:
        yield job, running_attempt(job, timeout=timeout)
    finally:
        job.refresh_from_db()
        if not job.is_final:
            services.job_stop(job=job, by=owner)
            wait_state(job, *FINAL_STATES)


def stop_node_agent(cluster, name: str, *, timeout: float = 60) -> None:
    """Stop the unfinished jobs with tasks on node `name` and wait for them
    to end, then its agent: a container a stopped agent left running keeps
    its published host ports, which the next test's agent on the same port
    range is then refused by Docker."""
    try:
        unfinished = list(Job.objects.filter(task_attempts__node__name=name).exclude(state__in=FINAL_STATES)
                          .distinct())
        for job in unfinished:
            with contextlib.suppress(services.JobStateError):  # it ended since the query
                services.job_stop(job=job, by=job.owner)
        for job in unfinished:
            wait_state(job, *FINAL_STATES, timeout=timeout)
    finally:
        cluster.agent(name).stop()


@functools.cache
def hashed_password(password: str) -> str:
    """Hash each test password once: the real hasher takes ~1 s a call, and
    the portal's processes must verify these hashes with their own settings."""
    from django.contrib.auth.hashers import make_password

    return make_password(password)


def csrf_token(html: str) -> str:
    """The CSRF token of the form on a page."""
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def login(base_url: str, user) -> requests.Session:
    """A requests session logged in through the real login form."""
    session = requests.Session()
    session.trust_env = False  # loopback only, never a proxy
    page = session.get(f"{base_url}/login/")
    response = session.post(f"{base_url}/login/", data={"username": user.username, "password": user.test_password,
                                                       "csrfmiddlewaretoken": csrf_token(page.text)},
                            headers={"Referer": f"{base_url}/login/"}, allow_redirects=False)
    assert response.status_code == 302 and "/login/" not in response.headers["Location"], "login failed"
    return session


__all__ = ["BUSYBOX_IMAGE", "DEBIAN_IMAGE", "config", "role", "submit", "wait_state", "running_attempt", "lines",
           "describe", "example", "hashed_password", "csrf_token", "login"]


def submit_in_one_batch(user, configs: list[str]) -> dict[int, str]:
    """Submit `configs` so that job_store's group commit stores them in one
    write: each queues, in order, behind a write this helper holds, then the
    first is handed the lead. Returns {index: "stored" or the error code}."""
    import threading

    from django.db import connection

    from jobs.services import job_store

    results: dict[int, str] = {}

    def send(i: int) -> None:
        try:
            services.job_submit(owner=user, config=configs[i])
            results[i] = "stored"
        except services.SubmitError as exc:
            results[i] = exc.code
        finally:
            connection.close()

    with job_store._queue.ready:
        assert not job_store._queue.writing
        job_store._queue.writing = True
    threads = []
    for i in range(len(configs)):  # one at a time, so the batch keeps this order
        threads.append(threading.Thread(target=send, args=(i,)))
        threads[-1].start()
        wait_for(lambda: len(job_store._queue.waiting) == i + 1, what=f"submission {i} to queue")
    with job_store._queue.ready:
        job_store._queue.waiting[0].leads = True
        job_store._queue.ready.notify_all()
    for thread in threads:
        thread.join(30)
    return results


def rows_only_attempt(user, name: str, *, running_on=None, **attempt_fields: Any) -> TaskAttempt:
    """A task attempt as database rows only, with no container behind it:
    finished, over as far as the scheduler and any node agent are concerned
    (the log writer's tests write to it); or, given a node (`running_on`),
    running there with `attempt_fields` (ports ...), served by no agent."""
    from django.conf import settings

    from jobs.models import JobAttempt, State, Task, TaskState, VirtualCluster
    from jobs.spec import parse_job_value

    cfg = config(name, role(command="sleep 600") if running_on else role())
    stored = parse_job_value(cfg, user_name=user.username, default_fs_uri=settings.PAI_DEFAULT_FS_URI).normalized
    state = State.RUNNING if running_on else State.SUCCEEDED
    job = Job.objects.create(owner=user, name=name, config_raw=json.dumps(cfg), config=stored,
                             virtual_cluster=VirtualCluster.objects.get(name="default"), state=state,
                             total_tasks=1, total_roles=1)
    job_attempt = JobAttempt.objects.create(job=job, number=1, state=state)
    task = Task.objects.create(job=job, role="main", index=0)
    where = ({"node": running_on, "node_name": running_on.name, "container_id": "c-" + name, "host_ip": running_on.address}
             if running_on else {"node_name": "node-x"})
    return TaskAttempt.objects.create(task=task, job_attempt=job_attempt, job=job, number=1,
                                      state=TaskState.RUNNING if running_on else TaskState.SUCCEEDED,
                                      **where, **attempt_fields)


@contextlib.contextmanager
def log_writes_locked() -> Iterator[None]:
    """The database away for the node's log writer, for real: this
    thread's connection holds the write lock every log write needs (SQLite's
    own, taken at BEGIN IMMEDIATE; on PostgreSQL the log lines' table, in a
    mode that lets reads through). Rolled back after."""
    from django.db import connection, transaction

    with transaction.atomic():
        if connection.vendor != "sqlite":
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {LogLine._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")
        yield
        transaction.set_rollback(True)


def settled(read: Callable[[], int], *, quiet: float = 1.0, timeout: float = 60.0) -> int:
    """`read()` once it has not changed for `quiet` seconds (a count that
    stops growing: what was read off a stream nobody drains)."""
    last, since = read(), time.monotonic()
    deadline = since + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"still changing after {timeout} s: {last}")


def admin_delete(client, model: str, pk: int, how: str):
    """Delete row `pk` of `model` ("jobs/node") in the Django admin, from its
    delete page or by the list's bulk action ("delete page" or not)."""
    if how == "delete page":
        return client.post(f"/admin/{model}/{pk}/delete/", {"post": "yes"})
    return client.post(f"/admin/{model}/", {"action": "delete_selected", "_selected_action": [pk], "post": "yes"})
