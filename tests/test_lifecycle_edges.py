"""Lifecycle edges from a review: a job's times when its tasks start or report
late, and a stop that must outlive a node agent's restart."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from jobs import services
from jobs.models import JobAttempt, State, TaskAttempt
from jobs.node import launcher
from jobs.node.agent import NodeAgent
from jobs.node.context import Watchers
from tests.helpers import role
from tests.test_lifecycle import exit_, fresh, gpu_job, node, start  # noqa: F401 (node is a fixture)


def test_a_task_that_starts_after_its_job_ended_does_not_move_the_jobs_start_past_its_end(alice, node):
    """One task's launch failed and ended the job while another was still
    launching; that one's container started a moment later. The job (and
    its attempt) ended before it: their start must not come after their end
    (the API promises createdTime <= appLaunchedTime <= appCompletedTime)."""
    job = gpu_job(alice, node, role(tasks=2))
    services.schedule_pass()
    first, second = TaskAttempt.objects.filter(job=job).order_by("task__index")
    for attempt in (first, second):
        assert services.attempt_claim_launch(attempt.pk)
    base = timezone.now()
    assert exit_(first, None, exit_type="IMAGE_PULL", error="pull access denied", finished_at=base)
    job = fresh(job)
    assert job.state == State.FAILED
    services.attempt_mark_running(second.pk, container_id="c-2", started_at=base + timedelta(seconds=1))
    job = fresh(job)
    attempt = JobAttempt.objects.get(job=job, number=1)
    assert job.started_at is None or job.started_at <= job.finished_at
    assert attempt.started_at is None or attempt.started_at <= attempt.finished_at


def test_a_stopped_retry_ends_at_its_own_tasks_end_when_an_earlier_attempts_task_reports_last(alice, node):
    """A retry is stopped; the first attempt's last task (stopped when that
    attempt failed) ended long before, but its agent, restarted, reports it
    last. The job and its current attempt end when the current attempt's
    tasks ended, not at that earlier task's end (before the attempt began)."""
    job = gpu_job(alice, node, role(tasks=2), retryCount=1)
    first = start(job)
    base = timezone.now()
    assert exit_(first["main-0"], 3, finished_at=base)
    assert fresh(job).state == State.WAITING
    services.schedule_pass()
    second = list(TaskAttempt.objects.filter(job=job, number=2))
    for attempt in second:
        assert services.attempt_claim_launch(attempt.pk)
        assert services.attempt_mark_running(attempt.pk, container_id=f"c-{attempt.pk}",
                                             started_at=base + timedelta(seconds=5))
    assert services.job_stop(job=job, by=alice).state == State.STOPPING
    for attempt in second:
        assert exit_(attempt, 143, finished_at=base + timedelta(seconds=20))
    assert exit_(first["main-1"], 143, finished_at=base + timedelta(seconds=1))

    job = fresh(job)
    attempt = JobAttempt.objects.get(job=job, number=2)
    assert job.state == State.STOPPED
    assert attempt.started_at == base + timedelta(seconds=5)
    assert job.finished_at == attempt.finished_at == base + timedelta(seconds=20)


class _Watcher:
    """A watcher as the agent's Watchers make them (context.Watch): what
    was asked of it. Its container is only a row here (no Docker engine)."""

    def __init__(self) -> None:
        self.started = self.stops = 0

    def start(self) -> None:
        self.started += 1

    def request_stop(self) -> None:
        self.stops += 1


class _NotLaunching:
    def is_launching(self, attempt_id: int) -> bool:
        return False


def test_an_agent_restarted_while_a_task_was_stopping_stops_it_again(alice, node):
    """The stop reached the agent, which sent SIGTERM and would have killed
    the container after the grace period; the agent restarted meanwhile (a
    deploy), and the program ignores SIGTERM. The restarted agent adopts the
    container: it must stop it again, or the job stays STOPPING for as long
    as the program runs (and a completed job's task holds its GPUs)."""
    job = gpu_job(alice, node, role(tasks=1))
    task = start(job)["main-0"]
    assert services.job_stop(job=job, by=alice).state == State.STOPPING

    info = services.NodeInfo(name=node.name, address=node.address, docker_host=node.docker_host, engine_id="",
                             cpus=node.cpus, memory_mb=node.memory_mb)
    agent = NodeAgent(info, engine=None, engine_cpus=16)  # type: ignore[arg-type]
    made: dict[int, _Watcher] = {}
    agent.watchers = Watchers(lambda attempt_id, container_id: made.setdefault(attempt_id, _Watcher()))
    agent.runner = _NotLaunching()  # type: ignore[assignment]
    running = launcher.ContainerState(id=f"fake-{task.pk}", running=True, exit_code=None, oom_killed=False, error="",
                                      started_at=timezone.now(), finished_at=None,
                                      labels={launcher.LABEL_TASK_ATTEMPT: str(task.pk)})
    agent._adopt_containers([running])

    assert made[task.pk].started == 1
    assert made[task.pk].stops == 1
