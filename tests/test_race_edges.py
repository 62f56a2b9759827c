"""State changes racing each other, each forced into one interleaving with
`connection.execute_wrapper`: the other actor runs, on its own connection,
just before a chosen statement of the first. Run on SQLite and in the
PostgreSQL pass (PORTAL_TEST_DATABASE=postgres); where SQLite's write lock
makes an interleaving impossible, the test says so and skips there.

Users: alice, an admin; each test makes its own node and GPU type.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs import services
from jobs.models import GpuAllocation, Job, Node, State, TaskAttempt, TaskState, User
from jobs.services import lifecycle, users
from tests.test_races import _in_thread, someone_waits_for_a_lock


def _config(name: str, *, gpu_type: str, tasks: int = 1) -> str:
    return json.dumps({"jobName": name, "image": "pai-local/busybox:latest", "gpuType": gpu_type,
                       "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1, "memoryMB": 100,
                                      "gpuNumber": 1, "command": "true"}]})


def _on_a_connection_of_its_own(target: Callable[[], object]) -> tuple[threading.Thread, dict, list[int]]:
    """`target` on a thread (_in_thread), and the backend pid of that
    thread's connection once it has one."""
    pids: list[int] = []

    def run() -> object:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])
        return target()

    thread, out = _in_thread(run)
    return thread, out, pids


def _until_done_or_blocked(thread: threading.Thread, pids: list[int], timeout: float = 10.0) -> None:
    """Until `thread` ends, or its own session waits for a row lock
    (PostgreSQL): the one this connection holds, as the thread runs into it.
    Only its own: the test cluster's agents share the database, and one of
    their passes may wait for the same lock meanwhile."""
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        if pids and someone_waits_for_a_lock(pids[0]):
            return
        thread.join(0.01)
    assert not thread.is_alive(), "the other actor neither ended nor waited for a lock"


@pytest.fixture
def gpu_node() -> Iterator[tuple[Node, str]]:
    """A ready node with 2 GPUs of a type of this test's own; no agent runs there."""
    gpu_type = f"RR{uuid.uuid4().hex[:6]}"
    node = Node.objects.create(name=f"t-rr-{gpu_type.lower()}", address="127.0.0.9", docker_host="unix:///nonexistent",
                               cpus=64, memory_mb=64000, gpus=[{"index": i, "type": gpu_type} for i in range(2)],
                               gpus_simulated=True, port_start=33100, port_end=33199,
                               last_heartbeat=timezone.now() + timedelta(hours=1),  # clear of any lost-node check
                               agent_pid=os.getpid())
    yield node, gpu_type
    Node.objects.filter(pk=node.pk).update(schedulable=False)


def _placed(owner, name: str, node: Node, gpu_type: str) -> tuple[Job, TaskAttempt]:
    job = services.job_submit(owner=owner, config=_config(name, gpu_type=gpu_type))
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
    services.schedule_pass()
    return job, TaskAttempt.objects.get(job=job)


def test_a_task_claimed_for_launch_as_its_job_is_stopped_keeps_its_gpu(alice, redis_server, gpu_node):
    if connection.vendor != "postgresql":
        pytest.skip("on SQLite the stop's write lock keeps the agent's claim out until it commits")
    node, gpu_type = gpu_node
    job, attempt = _placed(alice, "claimed_as_stopped", node, gpu_type)
    assert attempt.state == TaskState.ASSIGNED and GpuAllocation.objects.filter(attempt=attempt).exists()

    claim: list[tuple[threading.Thread, dict, list[int]]] = []

    def agent_claims_meanwhile(execute, sql, params, many, context):
        # The stop lists the job's unlaunched tasks; its node's agent claims
        # this one for launch before the stop changes it.
        result = execute(sql, params, many, context)
        if not claim and sql.startswith('SELECT "jobs_taskattempt"."id" AS "pk" FROM'):
            claim.append(_on_a_connection_of_its_own(lambda: lifecycle.attempt_claim_launch(attempt.pk)))
            _until_done_or_blocked(claim[0][0], claim[0][2])
        return result

    with connection.execute_wrapper(agent_claims_meanwhile):
        services.job_stop(job=job, by=alice)
    [(thread, claimed, _pids)] = claim
    thread.join(10)
    assert "error" not in claimed, claimed
    attempt.refresh_from_db()
    # Either the claim came first and the container is being started on its
    # GPU, which stays its own until its exit is recorded (else the next pass
    # hands it out again), or the stop came first and the claim found it
    # stopped.
    if claimed["result"]:
        assert attempt.state == TaskState.LAUNCHING and attempt.stop_reason == "USER_STOP"
        assert GpuAllocation.objects.filter(attempt=attempt).count() == 1
    else:
        assert attempt.state == TaskState.STOPPED
        assert not GpuAllocation.objects.filter(attempt=attempt).exists()
        assert Job.objects.get(pk=job.pk).state == State.STOPPED


def test_a_user_is_not_deleted_while_a_finished_jobs_tasks_still_stop(make_user, admin_user, redis_server, gpu_node):
    node, gpu_type = gpu_node
    owner = make_user("leaver")
    job = services.job_submit(owner=owner, config=_config("ends_while_stopping", gpu_type=gpu_type, tasks=2))
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
    services.schedule_pass()
    first, second = TaskAttempt.objects.filter(job=job).order_by("task__index")
    for attempt in (first, second):
        assert lifecycle.attempt_claim_launch(attempt.pk)
        assert lifecycle.attempt_mark_running(attempt.pk, container_id=f"c{attempt.pk:011d}")
    # The first task fails: the job has failed, and its other task is being
    # stopped (SIGTERM, then SIGKILL after the grace period).
    lifecycle.attempt_record_exit(first.pk, lifecycle.ContainerExit(exit_code=1))
    assert Job.objects.get(pk=job.pk).state == State.FAILED
    assert TaskAttempt.objects.get(pk=second.pk).state == TaskState.RUNNING

    # Deleting the owner now would drop the rows of a container still
    # running, and free its GPU for the next pass to hand out again.
    with pytest.raises(users.UserError) as refused:
        users.user_delete(user=User.objects.get(pk=owner.pk), by=admin_user)
    assert refused.value.code == "ConflictUserError"
    assert [j.pk for j in users.unfinished_jobs_of([owner])] == [job.pk]  # the Django admin's refusal says why
    assert GpuAllocation.objects.filter(attempt_id=second.pk).count() == 1

    lifecycle.attempt_record_exit(second.pk, lifecycle.ContainerExit(exit_code=137))
    users.user_delete(user=User.objects.get(pk=owner.pk), by=admin_user)
    assert not Job.objects.filter(pk=job.pk).exists()


def test_a_pass_goes_on_when_a_job_it_saw_waiting_is_stopped_and_deleted(alice, redis_server, gpu_node):
    _node, gpu_type = gpu_node
    # A config of its own (a GPU type no node has): no pass has read it yet.
    job = services.job_submit(owner=alice, config=_config("gone_mid_pass", gpu_type=f"{gpu_type}X"))
    done: list[bool] = []

    def owner_deletes_it_meanwhile(execute, sql, params, many, context):
        # The pass has read the waiting jobs; the owner stops this one and
        # deletes it before the pass reads its config.
        result = execute(sql, params, many, context)
        if not done and "ORDER BY j.id LIMIT" in sql:
            done.append(True)

            def stop_and_delete() -> None:
                services.job_stop(job=job, by=alice)
                services.job_delete(job=job)

            thread, out = _in_thread(stop_and_delete)
            thread.join(30)
            assert "error" not in out, out
        return result

    with connection.execute_wrapper(owner_deletes_it_meanwhile):
        services.schedule_pass()
    assert done and not Job.objects.filter(pk=job.pk).exists()


def test_a_submission_is_stored_while_a_pass_holds_its_lock(alice, redis_server):
    if connection.vendor != "postgresql":
        pytest.skip("on SQLite a pass decides without the write lock, and takes it only to place jobs")
    from jobs.services import scheduling

    holding, release = threading.Event(), threading.Event()

    def a_long_pass() -> None:
        with transaction.atomic():
            scheduling._lock_passes()
            holding.set()
            release.wait(30)

    passing, passed = _in_thread(a_long_pass)
    assert holding.wait(10), passed
    try:
        # A job for "default", the virtual cluster whose row passes lock to
        # take turns: its foreign key is checked as it is stored.
        submitting, submitted, pids = _on_a_connection_of_its_own(lambda: services.job_submit(
            owner=alice, config=_config("during_a_pass", gpu_type="NOSUCHGPU")))
        _until_done_or_blocked(submitting, pids)
        assert not submitting.is_alive(), "the submission waits for the pass to end"
        assert "error" not in submitted, submitted
    finally:
        release.set()
        passing.join(30)
        submitting.join(30)
    assert "error" not in passed, passed
