"""A job of many tasks and retries through the API's status call: each
task's latest container, read from the newest job attempts only (a job of
1,000 tasks and 100 retries holds 101,000 task attempts).

Users: alice (owner), bob (another user); each test makes its own.
"""

from __future__ import annotations

import json
from datetime import timedelta

from django.test import Client

from jobs.models import JobAttempt, State, Task, TaskAttempt, TaskState
from jobs.services import tokens
from tests.helpers import config, role
from tests.test_pages import ended_job


def _api(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}")


def _job(owner, name: str, tasks: int, retries: int, placed: int):
    """A job on attempt retries + 1, whose first `placed` attempts have containers."""
    job = ended_job(owner, name, State.RUNNING, finished_at=None, exit_type="", total_tasks=tasks,
                    retry_limit=retries, attempt_number=retries + 1, config=config(name, role(tasks=tasks)))
    for index in range(1, tasks):
        Task.objects.create(job=job, role="main", index=index)
    for number in range(2, retries + 2):
        JobAttempt.objects.create(job=job, number=number, state=State.FAILED if number <= placed else State.WAITING)
    for number in range(1, placed + 1):
        for task in job.tasks.order_by("index"):
            TaskAttempt.objects.create(task=task, job_attempt=job.attempts.get(number=number), job=job, number=number,
                                       host_ip="127.0.0.1", state=TaskState.FAILED, container_id=f"c{number}-{task.index}")
    return job


def _statuses(client: Client, owner, name: str) -> list[tuple[str, int]]:
    body = client.get(f"/api/v1/user/{owner.username}/jobs/{name}").json()
    return [(task["containerId"], task["attempt"]) for task in body["taskRoles"]["main"]["taskStatuses"]]


def test_the_status_names_each_tasks_latest_container(alice, bob):
    client = _api(alice)
    # Placed four times; the fifth attempt waits: each task shows its fourth container.
    waiting = _job(alice, "retry_waits", tasks=3, retries=4, placed=4)
    assert _statuses(client, alice, "retry_waits") == [(f"c4-{index}", 4) for index in range(3)]
    # A job whose every attempt ran shows the newest.
    _job(alice, "all_ran", tasks=3, retries=4, placed=5)
    assert _statuses(client, alice, "all_ran") == [(f"c5-{index}", 5) for index in range(3)]
    # Never placed: no container.
    _job(alice, "never_placed", tasks=2, retries=0, placed=0)
    assert _statuses(client, alice, "never_placed") == [(None, None), (None, None)]
    # Another user and an anonymous client get nothing of it.
    assert _api(bob).get(f"/api/v1/user/{alice.username}/jobs/{waiting.name}").status_code == 404
    assert Client().get(f"/api/v1/user/{alice.username}/jobs/{waiting.name}").status_code == 401


def test_the_status_reads_the_newest_two_attempts_however_many_ran(alice):
    """Task attempts made into objects by one status call (post_init counts
    each): the newest two job attempts' at most, not all 18."""
    from django.db.models.signals import post_init

    client = _api(alice)
    _job(alice, "retried_8", tasks=2, retries=8, placed=9)
    assert TaskAttempt.objects.filter(job__name="retried_8", job__owner=alice).count() == 18
    made: list[TaskAttempt] = []

    def count(sender, instance, **kwargs) -> None:
        made.append(instance)

    post_init.connect(count, sender=TaskAttempt)
    try:
        assert _statuses(client, alice, "retried_8") == [(f"c9-{index}", 9) for index in range(2)]
    finally:
        post_init.disconnect(count, sender=TaskAttempt)
    assert sorted({attempt.number for attempt in made}) == [8, 9] and len(made) == 4


def test_the_v2_status_lists_the_newest_attempts_and_job_attempts_lists_all(alice, bob):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.api.views import jobs_v2

    client = _api(alice)
    client.get("/api/v1/jobs")  # the token's first use is written once: not counted below
    path = f"/api/v2/jobs/{alice.username}~retried_12"
    _job(alice, "retried_12", tasks=2, retries=11, placed=12)
    with CaptureQueriesContext(connection) as queries:
        status = client.get(path).json()
    assert [a["attemptIndex"] for a in status["jobAttempts"]] == list(range(13 - jobs_v2.STATUS_ATTEMPTS, 13))
    assert status["jobAttemptCount"] == 12
    newest = status["jobAttempts"][-1]
    assert newest["isLatest"] and [t["containerId"] for t in newest["taskRoles"]["main"]["taskStatuses"]] == [
        "c12-0", "c12-1"]
    # One query for the listed attempts' tasks, not one per attempt.
    by_job_attempt = [q["sql"] for q in queries.captured_queries if '"job_attempt_id" IN (' in q["sql"]
                      or '"job_attempt_id" = ' in q["sql"]]
    assert len(by_job_attempt) == 1, by_job_attempt

    every = json.loads(b"".join(client.get(path + "/job-attempts").streaming_content))
    assert [a["attemptIndex"] for a in every] == list(range(1, 13))
    assert [t["containerId"] for t in every[0]["taskRoles"]["main"]["taskStatuses"]] == ["c1-0", "c1-1"]
    assert client.get(path + "/job-attempts/3").json() == every[2]
    # Another user and an anonymous client see none of it.
    for other in (_api(bob), Client()):
        assert other.get(path).status_code in (401, 404) and other.get(path + "/job-attempts").status_code in (401, 404)


def test_every_attempt_is_listed_one_attempt_at_a_time(alice, bob):
    """`.../job-attempts` lists them all, as OpenPAI does, but holds one
    attempt's containers at a time: by the time each attempt is written, no
    more task attempts have been read than the attempts so far hold."""
    from django.db.models.signals import post_init

    _job(alice, "listed_whole", tasks=3, retries=5, placed=6)
    made: list[TaskAttempt] = []

    def count(sender, instance, **kwargs) -> None:
        made.append(instance)

    path = f"/api/v2/jobs/{alice.username}~listed_whole/job-attempts"
    post_init.connect(count, sender=TaskAttempt)
    try:
        response = _api(alice).get(path)
        assert response.streaming
        chunks, read_by_then = [], []
        for chunk in response.streaming_content:
            chunks.append(chunk)
            read_by_then.append(len(made))
    finally:
        post_init.disconnect(count, sender=TaskAttempt)
    attempts = json.loads(b"".join(chunks))
    assert [a["attemptIndex"] for a in attempts] == [1, 2, 3, 4, 5, 6]
    assert [t["containerId"] for t in attempts[5]["taskRoles"]["main"]["taskStatuses"]] == ["c6-0", "c6-1", "c6-2"]
    # "[", then one chunk per attempt (3 containers each), then "]".
    assert read_by_then == [0, 3, 6, 9, 12, 15, 18, 18]
    assert _api(bob).get(path).status_code == 404
    assert Client().get(path).status_code == 401
