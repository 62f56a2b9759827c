"""IDLE_GPU_POLICY=stop (jobs/services/usage.py, lifecycle.job_reclaim_idle_gpus):
a task whose GPUs stay idle is flagged and its owner told when the job will
be stopped; still idle IDLE_GPU_STOP_GRACE_MINUTES later, the whole job is
stopped with the reason "idle GPUs reclaimed" and never retried.

No GPU is available here, so the checks read recorded samples with GPU
figures, at chosen times. Most tests play the node agent themselves (a node
of the test's own, tests/test_usage.py); the last one stops a real
container through a real node agent.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import docker
import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone
from rq import Queue

from jobs import formatting, queues, services
from jobs.models import ExitType, IdleGpus, Job, JobAttempt, NotificationDelivery, State, TaskAttempt, TaskState
from jobs.services import lifecycle, nodes, notifications, usage
from jobs.services.lifecycle import ContainerExit
from tests.cluster import wait_for
from tests.helpers import config, role, running_attempt, submit, wait_state
from tests.test_settings import _manage
from tests.test_usage import node, running_tasks  # noqa: F401  (fixture)

STEP = timedelta(seconds=5)
WINDOW = timedelta(minutes=10)
GRACE = timedelta(minutes=15)


@pytest.fixture
def stop_policy(settings):
    """Policy stop, 10 idle minutes, 15 minutes of grace; notices and stops
    go to queues of the test's own that no agent serves."""
    settings.IDLE_GPU_POLICY, settings.IDLE_GPU_PERCENT, settings.USAGE_SAMPLE_SECONDS = "stop", 5, 5
    settings.IDLE_GPU_MINUTES, settings.IDLE_GPU_STOP_GRACE_MINUTES = 10, 15
    settings.PAI_INSTANCE = f"pai-test-idle-{uuid.uuid4().hex[:8]}"
    settings.EMAIL_HOST, settings.EMAIL_BACKEND = "smtp.invalid", "django.core.mail.backends.locmem.EmailBackend"
    return settings


def with_email(user) -> None:
    user.email = f"{user.username}@example.org"
    user.save(update_fields=["email"])


def record(attempt: TaskAttempt, *, util: float, start: datetime, end: datetime) -> None:
    """Samples every 5 s from `start` to `end` (both included), every GPU of
    the task at `util` percent, as an agent on a node with real GPUs writes."""
    count = int((end - start) / STEP) + 1
    usage.samples_record([usage.Sample(attempt.pk, start + i * STEP, cpu_percent=100, memory_bytes=1,
                                       gpus=[{"index": g, "utilPercent": util, "memoryUsedBytes": 1} for g in attempt.gpus])
                          for i in range(count)])


def stop_messages(node_name: str) -> list[int]:
    """The attempts the node's queue was asked to stop, one entry per request."""
    queue = Queue(queues.node_queue_name(node_name), connection=queues.connection())
    return [job.args[0] for job in queue.jobs if job.func_name == "jobs.tasks.stop_task"]


def fresh(row):
    row.refresh_from_db()
    return row


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def list_row(client: Client, job: Job, query: str = "") -> str:
    rows = client.get(f"/jobs/rows/{query}").content.decode()
    if f'data-job-id="{job.pk}"' not in rows:
        return ""
    row = rows[rows.index(f'data-job-id="{job.pk}"'):]
    return row[:row.index("</tr>")]


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize("name,value,message", [
    ("IDLE_GPU_POLICY", "kill", "IDLE_GPU_POLICY='kill': expected one of flag, notify, stop"),
    ("IDLE_GPU_STOP_GRACE_MINUTES", "0.5", "IDLE_GPU_STOP_GRACE_MINUTES=0.5: expected at least 1"),
])
def test_it_fails_at_start_up_on_a_bad_policy_or_grace(tmp_path, name, value, message):
    result = _manage("check", PORTAL_VAR_DIR=str(tmp_path), PORTAL_SECRET_KEY="k" * 50, **{name: value})
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]


# ------------------------------------------------------------------- stops


def test_it_stops_the_whole_job_still_idle_after_the_grace_and_never_retries_it(alice, node, stop_policy,  # noqa: F811
                                                                                mailoutbox):
    with_email(alice)
    idle, busy = running_tasks(alice, node, 2, retryCount=3)
    job = idle.job
    t0 = timezone.now()
    record(idle, util=1, start=t0 - WINDOW - timedelta(minutes=1), end=t0)
    record(busy, util=80, start=t0 - WINDOW - timedelta(minutes=1), end=t0)

    assert usage.idle_gpus_check(node_id=node.pk, now=t0) == [idle.pk]
    (delivery,) = NotificationDelivery.objects.filter(user=alice, payload__event="idleGpus")
    assert delivery.payload["stopAt"] == formatting.utc_millis(t0 + GRACE)
    notifications.delivery_try(delivery.pk)
    (mail,) = mailoutbox
    assert "will be stopped at" in mail.subject and "idle GPUs reclaimed" in mail.body, mail.body

    record(idle, util=1, start=t0 + STEP, end=t0 + GRACE)
    record(busy, util=80, start=t0 + STEP, end=t0 + GRACE)
    assert usage.idle_gpus_check(node_id=node.pk, now=t0 + GRACE - timedelta(minutes=1)) == [idle.pk]
    assert fresh(job).state == State.RUNNING  # not due yet
    assert stop_messages(node.name) == []

    assert usage.idle_gpus_check(node_id=node.pk, now=t0 + GRACE) == [idle.pk]
    job = fresh(job)
    assert job.state == State.STOPPING
    # The whole job: its busy task too (a gang job without one task is no use).
    assert [fresh(a).stop_reason for a in (idle, busy)] == [ExitType.IDLE_GPUS] * 2
    assert sorted(stop_messages(node.name)) == sorted([idle.pk, busy.pk])

    # The node agent kills both containers and reports their exits.
    assert services.attempt_record_exit(idle.pk, ContainerExit(137))
    assert services.attempt_record_exit(busy.pk, ContainerExit(143))
    for attempt in (idle, busy):
        attempt = fresh(attempt)
        assert (attempt.state, attempt.exit_type, attempt.exit_reason) == (
            TaskState.STOPPED, ExitType.IDLE_GPUS, "idle GPUs reclaimed")
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_reason) == (State.STOPPED, ExitType.IDLE_GPUS, "idle GPUs reclaimed")
    # Not a failure to retry, though the job asks for 3 retries.
    services.schedule_pass()
    job = fresh(job)
    assert (job.state, job.attempt_number, job.waiting_reason) == (State.STOPPED, 1, "")
    assert list(JobAttempt.objects.filter(job=job).values_list("state", "exit_type")) == [
        (State.STOPPED, ExitType.IDLE_GPUS)]
    assert TaskAttempt.objects.filter(job=job).count() == 2
    page = logged_in(alice).get(f"/jobs/{job.pk}/")
    assert page.status_code == 200 and "Idle GPUs reclaimed" in page.content.decode()


def test_a_user_stop_asked_while_it_is_reclaimed_keeps_the_reason(alice, node, stop_policy):  # noqa: F811
    (attempt,) = running_tasks(alice, node, 1)
    job = attempt.job
    assert lifecycle.job_reclaim_idle_gpus(job_id=job.pk, number=1)
    assert services.job_stop(job=job, by=alice).state == State.STOPPING  # asking again: kill at once
    assert services.attempt_record_exit(attempt.pk, ContainerExit(137))
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_reason) == (State.STOPPED, ExitType.IDLE_GPUS, "idle GPUs reclaimed")


def test_a_reclaim_of_a_job_whose_tasks_a_drain_was_stopping_says_reclaimed(alice, admin_user, node,  # noqa: F811
                                                                            stop_policy):
    # Every task already had the drain's stop pending, so none was left for
    # the reclaim to mark: the job ended "stopped by a user", which nobody did.
    tasks = running_tasks(alice, node, 2, retryCount=3)
    job = tasks[0].job
    nodes.node_drain(node=node, by=admin_user, mode="stop")
    assert lifecycle.job_reclaim_idle_gpus(job_id=job.pk, number=1)
    for attempt in tasks:
        assert services.attempt_record_exit(attempt.pk, ContainerExit(143))
    job = fresh(job)
    assert (job.state, job.exit_type, job.exit_reason, job.exit_trigger_message) == (
        State.STOPPED, ExitType.IDLE_GPUS, "idle GPUs reclaimed", lifecycle.IDLE_GPUS_TRIGGER.message)
    assert job.stop_requested_by is None and JobAttempt.objects.filter(job=job).count() == 1
    for attempt in tasks:
        attempt = fresh(attempt)
        assert (attempt.state, attempt.exit_type) == (TaskState.STOPPED, ExitType.IDLE_GPUS)


def test_gpus_busy_again_within_the_grace_clear_the_flag_and_the_deadline(alice, node, stop_policy):  # noqa: F811
    with_email(alice)
    (attempt,) = running_tasks(alice, node, 1)
    job = attempt.job
    t0 = timezone.now()
    record(attempt, util=0, start=t0 - WINDOW - timedelta(minutes=1), end=t0)
    assert usage.idle_gpus_check(node_id=node.pk, now=t0) == [attempt.pk]

    back = t0 + timedelta(minutes=5)
    record(attempt, util=0, start=t0 + STEP, end=back - STEP)
    record(attempt, util=70, start=back, end=back)  # some work, within the grace
    assert usage.idle_gpus_check(node_id=node.pk, now=back) == []
    assert not IdleGpus.objects.filter(attempt=attempt).exists()

    # Idle again: flagged anew, told anew, with a new deadline. The first
    # deadline (t0 + 15 min) passes without a stop.
    again = back + WINDOW + timedelta(minutes=1)
    record(attempt, util=0, start=back + STEP, end=again)
    assert usage.idle_gpus_check(node_id=node.pk, now=again) == [attempt.pk]
    assert fresh(job).state == State.RUNNING and fresh(attempt).stop_reason == ""
    notices = NotificationDelivery.objects.filter(user=alice, payload__event="idleGpus").order_by("id")
    assert [d.payload["stopAt"] for d in notices] == [formatting.utc_millis(t0 + GRACE),
                                                      formatting.utc_millis(again + GRACE)]
    assert stop_messages(node.name) == []


def test_checks_at_once_stop_the_job_once(alice, node, stop_policy):  # noqa: F811
    first, second = running_tasks(alice, node, 2)
    job = first.job
    t0 = timezone.now()
    for attempt in (first, second):
        record(attempt, util=0, start=t0 - WINDOW - timedelta(minutes=1), end=t0)
    usage.idle_gpus_check(node_id=node.pk, now=t0)
    for attempt in (first, second):
        record(attempt, util=0, start=t0 + STEP, end=t0 + GRACE)

    # Two agents' checks at the same moment, both finding both tasks due.
    ready = threading.Barrier(2)
    errors: list[BaseException] = []

    def check() -> None:
        try:
            ready.wait(timeout=10)
            usage.idle_gpus_check(node_id=node.pk, now=t0 + GRACE)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=check) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert fresh(job).state == State.STOPPING
    assert sorted(stop_messages(node.name)) == sorted([first.pk, second.pk])  # one request per task

    usage.idle_gpus_check(node_id=node.pk, now=t0 + GRACE + STEP)  # a later check: stopping already
    assert not lifecycle.job_reclaim_idle_gpus(job_id=job.pk, number=1)
    assert sorted(stop_messages(node.name)) == sorted([first.pk, second.pk])


@pytest.mark.parametrize("policy", ["flag", "notify"])
def test_flag_and_notify_never_stop(alice, node, stop_policy, policy):  # noqa: F811
    stop_policy.IDLE_GPU_POLICY = policy
    with_email(alice)
    (attempt,) = running_tasks(alice, node, 1)
    t0 = timezone.now()
    record(attempt, util=0, start=t0 - WINDOW - timedelta(minutes=1), end=t0 + timedelta(hours=2))
    assert usage.idle_gpus_check(node_id=node.pk, now=t0) == [attempt.pk]
    assert usage.idle_gpus_check(node_id=node.pk, now=t0 + timedelta(hours=2)) == [attempt.pk]
    assert fresh(attempt.job).state == State.RUNNING and fresh(attempt).stop_reason == ""
    assert stop_messages(node.name) == []
    notices = NotificationDelivery.objects.filter(user=alice, payload__event="idleGpus")
    assert [d.payload["stopAt"] for d in notices] == ([None] if policy == "notify" else [])
    page = logged_in(alice).get(f"/jobs/{attempt.job_id}/").content.decode()
    assert 'data-idle-task="main-0"' in page and "data-idle-stop-at" not in page
    assert "GPUs idle" in list_row(logged_in(alice), attempt.job) and "will be stopped" not in page


# ------------------------------------------------------------------- pages


def test_the_deadline_is_shown_to_the_owner_and_admins_only(alice, bob, admin_user, node, stop_policy):  # noqa: F811
    (attempt,) = running_tasks(alice, node, 1)
    job = attempt.job
    t0 = timezone.now()
    record(attempt, util=0, start=t0 - WINDOW - timedelta(minutes=1), end=t0)
    usage.idle_gpus_check(node_id=node.pk, now=t0)
    deadline = (t0 + GRACE).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    for viewer, query in ((alice, ""), (admin_user, f"?user={alice.username}")):
        client = logged_in(viewer)
        page = client.get(f"/jobs/{job.pk}/").content.decode()
        assert 'data-idle-task="main-0"' in page
        assert "The job will be stopped at" in page and deadline in page, viewer
        row = list_row(client, job, query)
        assert "GPUs idle" in row and "will be stopped at" in row and deadline in row, viewer

    other = logged_in(bob)
    assert other.get(f"/jobs/{job.pk}/").status_code == 404
    assert list_row(other, job) == "" and list_row(other, job, f"?user={alice.username}") == ""
    anonymous = Client()
    answer = anonymous.get(f"/jobs/{job.pk}/")
    assert answer.status_code == 302 and "/login/" in answer["Location"]
    assert anonymous.get("/jobs/rows/").status_code == 302


# ------------------------------------------------------- a real container


def test_a_reclaimed_task_s_real_container_goes_away(alice, cluster, settings):
    settings.IDLE_GPU_POLICY, settings.IDLE_GPU_PERCENT, settings.USAGE_SAMPLE_SECONDS = "stop", 5, 5
    settings.IDLE_GPU_MINUTES, settings.IDLE_GPU_STOP_GRACE_MINUTES = 10, 15
    job = submit(alice, config(f"reclaim-{uuid.uuid4().hex[:6]}", role(command="sleep 600", gpus=1), gpuType="V100",
                               retryCount=2))
    attempt = running_attempt(job)
    engine = docker.from_env()
    assert engine.containers.get(attempt.container_id).status == "running"

    # Simulated GPUs report no figures, and their agent samples the task
    # every 5 s: the recorded samples come after all of the agent's (from 5
    # minutes on), so the check reads an unbroken idle run from them.
    start = timezone.now() + timedelta(minutes=5)
    flagged_at = start + WINDOW + timedelta(minutes=1)
    record(attempt, util=0, start=start, end=flagged_at + GRACE)
    # The agent checks its node once a minute, with its own settings (30
    # idle minutes, policy flag): it would drop the flag of a run that
    # started in its future. Both checks in one transaction keep it out
    # from between them; the stop goes out when it commits.
    with transaction.atomic():
        assert usage.idle_gpus_check(node_id=attempt.node_id, now=flagged_at) == [attempt.pk]
        assert usage.idle_gpus_check(node_id=attempt.node_id, now=flagged_at + GRACE) == [attempt.pk]
    assert fresh(attempt).stop_reason == ExitType.IDLE_GPUS

    job = wait_state(job, State.STOPPED, timeout=60)
    assert (job.exit_type, job.exit_reason, job.attempt_number) == (ExitType.IDLE_GPUS, "idle GPUs reclaimed", 1)
    attempt = fresh(attempt)
    assert (attempt.state, attempt.exit_type) == (TaskState.STOPPED, ExitType.IDLE_GPUS)
    assert not attempt.gpu_allocations.exists()

    def gone() -> bool:
        try:
            return engine.containers.get(attempt.container_id).status != "running"
        except docker.errors.NotFound:
            return True

    wait_for(gone, timeout=30, what="the reclaimed task's container to go away")
