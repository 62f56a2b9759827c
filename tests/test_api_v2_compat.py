"""OpenPAI REST compatibility of the v2 API, through Django's test client:
a job as it was at one of its attempts (`.../attempts/<jobAttemptId>`).

Users: alice (owner), bob (another user); each test makes its own.
"""

from __future__ import annotations

from datetime import timedelta

from django.test import Client

from jobs.models import JobAttempt, State, TaskAttempt, TaskState
from jobs.services import tokens
from tests.test_pages import ended_job


def _api(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}")


def _retried_job(owner, name: str):
    """A finished job of two attempts: the first failed in container c1,
    the second succeeded in container c2."""
    job = ended_job(owner, name, State.SUCCEEDED, attempt_number=2, retry_limit=1)
    JobAttempt.objects.filter(job=job, number=1).update(state=State.FAILED, exit_type="USER_EXIT", exit_code=3,
                                                        exit_reason="the command exited with 3")
    JobAttempt.objects.create(job=job, number=2, state=State.SUCCEEDED, exit_type="SUCCEEDED", exit_code=0,
                              started_at=job.started_at, finished_at=job.finished_at)
    task = job.tasks.get()
    for number, state in ((1, TaskState.FAILED), (2, TaskState.SUCCEEDED)):
        TaskAttempt.objects.create(task=task, job_attempt=job.attempts.get(number=number), job=job, number=number,
                                   host_ip="127.0.0.1", state=state, container_id=f"c{number}")
    return job


def _containers(body: dict) -> list[str]:
    return [task["containerId"] for task in body["taskRoles"]["main"]["taskStatuses"]]


def test_it_shows_a_job_as_it_was_at_each_attempt(alice):
    job = _retried_job(alice, "retried")
    api = _api(alice)
    path = f"/api/v2/jobs/{alice.username}~retried/attempts"
    first = api.get(f"{path}/0").json()  # OpenPAI's jobAttemptId counts from 0, as jobStatus.retries does
    assert _containers(first) == ["c1"]
    assert first["name"] == "retried" and first["jobStatus"]["appId"] == f"{job.pk}-1"
    assert first["jobStatus"]["appExitCode"] == 3 and first["jobStatus"]["appExitType"] == "USER_EXIT"
    assert first["jobStatus"]["appExitDiagnostics"] == "the command exited with 3"
    # The job's own state stays the job's: only the attempt's parts change.
    assert first["jobStatus"]["state"] == State.SUCCEEDED and first["jobStatus"]["retries"] == 1
    latest = api.get(f"{path}/1").json()
    assert _containers(latest) == ["c2"] and latest["jobStatus"]["appExitCode"] == 0
    assert set(latest) == set(api.get(f"/api/v2/jobs/{alice.username}~retried").json())  # the job status's shape
    # Under OpenPAI's /rest-server prefix too.
    assert _containers(api.get(f"/rest-server{path}/1").json()) == ["c2"]


def test_a_bad_or_missing_attempt_id_is_a_clear_4xx(alice):
    _retried_job(alice, "retried")
    api = _api(alice)
    path = f"/api/v2/jobs/{alice.username}~retried/attempts"
    missing = api.get(f"{path}/2")
    assert missing.status_code == 404 and missing.json()["code"] == "NoJobError"
    assert "jobAttemptId 2 (its attempts are 0 to 1)" in missing.json()["message"]
    for bad in ("x", "-1", "1.5", "²", "9" * 30):
        answer = api.get(f"{path}/{bad}")
        assert answer.status_code == 400, bad
        assert answer.json()["code"] == "InvalidParametersError" and "jobAttemptId" in answer.json()["message"]


def test_another_user_and_an_anonymous_client_get_no_attempt(alice, bob):
    _retried_job(alice, "private")
    path = f"/api/v2/jobs/{alice.username}~private/attempts/0"
    stranger = _api(bob).get(path)
    assert stranger.status_code == 404 and stranger.json()["code"] == "NoJobError"
    assert "c1" not in stranger.content.decode()
    assert Client().get(path).status_code == 401
