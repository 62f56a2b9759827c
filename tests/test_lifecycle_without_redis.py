"""State changes that commit and then tell Redis (a stop for a node agent, a
scheduling pass, a notification's delivery) while Redis is away.

The database is the truth and already holds the change; what Redis lost is
repaired by the node agents (a task's stop at their next reconciliation, a
pass when jobs wait with none for SCHEDULE_REPAIR_SECONDS, a delivery by
notifications.deliveries_repair). So the request that made the change must
say it was made, never answer 500 after it committed, and an agent's exit
report must not fail half way. Redis here is a loopback port that refuses
connections: a socket bound to it that never listens.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from django.test import Client
from redis import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobs import queues, services
from jobs.models import ExitType, Job, Node, State, TaskAttempt, TaskState
from tests.helpers import role
from tests.test_lifecycle import exit_, fresh, gpu_job, node, start  # noqa: F401 (node is a fixture)


@pytest.fixture
def redis_away(monkeypatch) -> Callable[[], AbstractContextManager[None]]:
    """Within its context, the queues' Redis refuses connections. (Scheduling
    passes, which come through Redis, run before; the fixtures' teardowns,
    which stop the test's jobs, after.)"""

    @contextmanager
    def away() -> Iterator[None]:
        with socket.socket() as refusing:
            refusing.bind(("127.0.0.1", 0))
            # Without redis-py's retries (seconds of backoff a call) the test is quick.
            refused = Redis(host="127.0.0.1", port=refusing.getsockname()[1], retry=Retry(NoBackoff(), 0))
            with monkeypatch.context() as patch:
                patch.setattr(queues, "connection", lambda: refused)
                yield

    return away


def test_a_stop_through_the_api_is_made_and_said_so_when_redis_is_away(alice, alice_client, node, redis_away, caplog):
    job = gpu_job(alice, node, role(tasks=2))
    start(job)
    with redis_away():
        answer = alice_client.put(f"/api/v1/user/{alice.username}/jobs/{job.name}/executionType",
                                  data='{"value": "STOP"}', content_type="application/json")
    assert answer.status_code == 202, answer.content[:500]
    job = fresh(job)
    assert job.state == State.STOPPING and job.stop_requested_by == alice
    assert {a.stop_reason for a in TaskAttempt.objects.filter(job=job)} == {ExitType.USER_STOP}
    assert "Error calling" in caplog.text and "on_commit" in caplog.text  # said in the log, not to the user


def test_a_stop_from_the_job_page_is_made_when_redis_is_away(alice, alice_client, node, redis_away):
    job = gpu_job(alice, node)
    start(job)
    with redis_away():
        answer = alice_client.post(f"/jobs/{job.pk}/stop/")
    assert answer.status_code == 302
    assert fresh(job).state == State.STOPPING


def test_an_exit_that_ends_its_job_is_recorded_whole_when_redis_is_away(alice, node, redis_away):
    job = gpu_job(alice, node, role(tasks=2))
    tasks = start(job)
    with redis_away():
        # Its end stops the other task (a stop for the agent) and frees GPUs (a pass).
        assert exit_(tasks["main-0"], 3)
        job = fresh(job)
        assert (job.state, job.exit_code) == (State.FAILED, 3)
        assert fresh(tasks["main-1"]).stop_reason == ExitType.COMPLETED
        assert exit_(tasks["main-1"], 137)
    assert fresh(tasks["main-1"]).state == TaskState.STOPPED


def test_an_admins_drain_and_uncordon_are_made_when_redis_is_away(admin_user, alice, node, redis_away):
    job = gpu_job(alice, node)
    start(job)
    admin = Client()
    admin.force_login(admin_user)
    with redis_away():
        answer = admin.post(f"/nodes/{node.pk}/drain/", {"mode": "stop"})
    assert answer.status_code == 302
    node = Node.objects.get(pk=node.pk)
    assert not node.schedulable and node.drain_mode == Node.DrainMode.STOP
    assert TaskAttempt.objects.get(job=job).stop_reason == ExitType.NODE_DRAINED
    with redis_away():
        assert admin.post(f"/nodes/{node.pk}/uncordon/").status_code == 302
    assert Node.objects.get(pk=node.pk).schedulable


def test_what_a_stop_made_without_redis_frees_is_placed_once_a_pass_runs(alice, node, redis_away):
    """Nothing of the stop waited for Redis: once passes come again, the
    GPUs its tasks' exits freed go to the waiting job."""
    first = gpu_job(alice, node, role(tasks=8))  # every GPU of the node
    start(first)
    second = gpu_job(alice, node)
    services.schedule_pass()
    assert fresh(second).state == State.WAITING
    with redis_away():
        services.job_stop(job=first, by=alice)
        for attempt in TaskAttempt.objects.filter(job=first):
            assert exit_(attempt, 137)
    assert Job.objects.get(pk=first.pk).state == State.STOPPED
    services.schedule_pass()
    assert fresh(second).state == State.RUNNING
    assert TaskAttempt.objects.get(job=second).node_id == node.pk
