"""Lifecycle edges from a review: a job's times when its tasks start or report
late. (A stop that must outlive a node agent's restart is in
test_node_agent_edges.py, on the real engine.)"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from jobs import services
from jobs.models import JobAttempt, State, TaskAttempt
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


def test_the_failed_jobs_page_opens_the_log_of_the_task_whose_failure_ended_it(alice, node):
    """With minFailedTaskCount 2 the first failed task in role order is not
    the one that ended the job; the page opened that first one's log."""
    from django.test import Client

    job = gpu_job(alice, node, role(tasks=2, minFailedTaskCount=2))
    tasks = start(job)
    assert exit_(tasks["main-0"], 3)
    assert fresh(job).state == State.RUNNING
    assert exit_(tasks["main-1"], 4)
    job = fresh(job)
    assert job.state == State.FAILED and (job.exit_trigger_role, job.exit_trigger_index) == ("main", 1)
    client = Client()
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/")
    assert page.context["log_attempt"] == str(tasks["main-1"].pk)
