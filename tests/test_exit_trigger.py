"""What ended a job and each of its attempts: OpenPAI's appExitTriggerMessage,
appExitTriggerTaskRoleName and appExitTriggerTaskIndex.

The pure rule first (`judge`'s trigger), then each completion rule end to
end through the services as tests/test_lifecycle.py drives them (the test
plays the node agent), then the API (v1 status, v2 status and job attempts)
and the job page (its summary and its attempts table), then the Django
admin. A stop names no task: its message says who stopped it. (The webhook
and e-mail are tested in tests/test_notifications.py.)

Users: alice (owner), bob (another user), admin (staff); each test makes
its own.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from jobs import formatting, services
from jobs.api import openapi, openapi_v2
from jobs.completion import TaskResult, Trigger, judge
from jobs.models import ExitType, Job, JobAttempt, State
from jobs.services import lifecycle, tokens
from tests.helpers import config, hold_vc, role, submit
from tests.test_lifecycle import exit_, fresh, gpu_job, node, results, spec_of, start  # noqa: F401  (node: a fixture)
from tests.test_pages import ended_job


def trigger_of(row: Job | JobAttempt) -> tuple[str | None, str | None, int | None]:
    row = fresh(row)
    return row.exit_trigger_message, row.exit_trigger_role, row.exit_trigger_index


def attempt(job: Job, number: int = 1) -> JobAttempt:
    return JobAttempt.objects.get(job=job, number=number)


# ------------------------------------------------------------ the pure rule


def test_judge_names_the_failure_that_reached_min_failed_task_count_as_the_trigger():
    spec = spec_of(role("w", tasks=4, minFailedTaskCount=2))
    verdict = judge(spec, results(("w", 0, "FAILED"), ("w", 1, None), ("w", 2, "FAILED"), ("w", 3, None)),
                    last=TaskResult("w", 2, "FAILED"))
    assert verdict.trigger == Trigger("minFailedTaskCount 2 of role w reached: 2 tasks failed", "w", 2)
    # The exit code stays the first failure's (OpenPAI's appExitCode is unchanged by this).
    assert verdict.deciding.index == 0


def test_judge_names_the_success_that_reached_min_succeeded_task_count():
    spec = spec_of(role("ps"), role("w", tasks=3, minSucceededTaskCount=2))
    verdict = judge(spec, results(("ps", 0, None), ("w", 0, "SUCCEEDED"), ("w", 1, None), ("w", 2, "SUCCEEDED")),
                    last=TaskResult("w", 0, "SUCCEEDED"))
    assert verdict.trigger == Trigger("minSucceededTaskCount 2 of role w reached: 2 tasks succeeded", "w", 0)
    assert verdict.deciding is None


def test_judge_names_the_completion_that_reached_kill_all_on_completed_task_number():
    spec = spec_of(role("ps", tasks=2), role("w", tasks=2), killAllOnCompletedTaskNumber=2)
    verdict = judge(spec, results(("ps", 0, "SUCCEEDED"), ("ps", 1, None), ("w", 0, None), ("w", 1, "SUCCEEDED")),
                    last=TaskResult("ps", 0, "SUCCEEDED"))
    assert verdict.trigger == Trigger("killAllOnCompletedTaskNumber 2 reached: 2 tasks completed", "ps", 0)


def test_judge_names_the_last_task_to_complete_when_all_have():
    spec = spec_of(role("w", tasks=3, minFailedTaskCount=None))
    verdict = judge(spec, results(("w", 0, "SUCCEEDED"), ("w", 1, "FAILED"), ("w", 2, "SUCCEEDED")),
                    last=TaskResult("w", 0, "SUCCEEDED"))
    assert verdict.trigger == Trigger(
        "all tasks completed: 2 of 3 succeeded, 1 failed without reaching a minFailedTaskCount", "w", 0)
    verdict = judge(spec_of(role("w")), results(("w", 0, "SUCCEEDED")), last=TaskResult("w", 0, "SUCCEEDED"))
    assert verdict.trigger == Trigger("all tasks completed: 1 of 1 succeeded", "w", 0)


def test_judge_names_the_last_counted_task_when_it_is_not_told_which_completed():
    spec = spec_of(role("w", tasks=3, minFailedTaskCount=2))
    failed = results(("w", 0, "FAILED"), ("w", 1, "FAILED"), ("w", 2, None))
    assert (judge(spec, failed).trigger.role, judge(spec, failed).trigger.index) == ("w", 1)
    # A `last` the firing rule did not count (it ended another way) is not named either.
    assert judge(spec, failed, last=TaskResult("w", 2, "SUCCEEDED")).trigger.index == 1


def test_the_page_words_a_task_trigger_and_leave_a_stop_to_the_exit_words():
    failed = Job(exit_trigger_message="minFailedTaskCount 1 of role worker reached: 1 task failed",
                 exit_trigger_role="worker", exit_trigger_index=2)
    assert formatting.exit_trigger_words(failed) == (
        "task worker-2 (minFailedTaskCount 1 of role worker reached: 1 task failed)")
    assert formatting.exit_trigger_words(Job(exit_trigger_role="worker", exit_trigger_index=0)) == "task worker-0"
    assert formatting.exit_trigger_words(Job(exit_trigger_message="stopped by alice")) == ""
    assert formatting.exit_trigger_words(Job()) == ""


def test_the_attempts_table_words_a_task_trigger_and_a_stop_only_where_the_exit_words_do_not():
    failed = JobAttempt(exit_type=ExitType.USER_EXIT, exit_code=3, exit_reason="task main-2 failed",
                        exit_trigger_message="minFailedTaskCount 1 of role main reached: 1 task failed",
                        exit_trigger_role="main", exit_trigger_index=2)
    assert formatting.attempt_trigger_line(failed) == (
        "ended by main-2: minFailedTaskCount 1 of role main reached: 1 task failed")
    stopped = JobAttempt(exit_type=ExitType.USER_STOP, exit_reason="stopped by alice",
                         exit_trigger_message="stopped by alice")
    assert formatting.attempt_trigger_line(stopped) == ""  # "Stopped by user: stopped by alice" says it
    reclaimed = JobAttempt(exit_type=ExitType.IDLE_GPUS, exit_reason=ExitType.IDLE_GPUS.label,
                           exit_trigger_message=lifecycle.IDLE_GPUS_TRIGGER.message)
    assert formatting.attempt_trigger_line(reclaimed) == lifecycle.IDLE_GPUS_TRIGGER.message
    assert formatting.attempt_trigger_line(JobAttempt(exit_trigger_role="main", exit_trigger_index=0)) == (
        "ended by main-0")
    assert formatting.attempt_trigger_line(JobAttempt()) == ""


# ------------------------------------------------- each rule, through the services


def test_the_failure_that_ends_a_job_is_its_trigger_and_later_exits_change_nothing(alice, node):
    job = gpu_job(alice, node, role(tasks=3))
    tasks = start(job)
    assert exit_(tasks["main-0"], 0)
    assert trigger_of(job) == (None, None, None)  # still running
    assert exit_(tasks["main-1"], 3)
    expected = ("minFailedTaskCount 1 of role main reached: 1 task failed", "main", 1)
    assert fresh(job).state == State.FAILED
    assert trigger_of(job) == trigger_of(attempt(job)) == expected
    # The task stopped because the job ended exits last: it triggered nothing.
    assert exit_(tasks["main-2"], 137)
    assert trigger_of(job) == trigger_of(attempt(job)) == expected


@pytest.mark.parametrize("exit_type, error", [
    (ExitType.IMAGE_PULL, "pull access denied for nosuch/image"),
    (ExitType.NODE_LOST, "node n1 was lost (no heartbeat since then)"),
], ids=["launch-failure", "node-lost"])
def test_a_platform_failure_of_a_task_is_the_trigger_like_any_failure(alice, node, exit_type, error):
    """As in OpenPAI, where a lost or unlaunchable pod fails its task and the
    task's failure fires minFailedTaskCount; the platform's words stay in
    appExitDiagnostics and appExitSpec."""
    job = gpu_job(alice, node, role(tasks=2))
    tasks = start(job)
    assert exit_(tasks["main-0"], None, exit_type=exit_type, error=error)
    job = fresh(job)
    assert (job.exit_type, trigger_of(job)) == (
        exit_type, ("minFailedTaskCount 1 of role main reached: 1 task failed", "main", 0))


def test_min_failed_task_count_names_the_failure_that_reached_it(alice, node):
    job = gpu_job(alice, node, role(tasks=3, minFailedTaskCount=2))
    tasks = start(job)
    assert exit_(tasks["main-0"], 1)
    assert exit_(tasks["main-2"], None, oom_killed=True)
    job = fresh(job)
    assert job.exit_code == 1  # the first failure's, as before
    assert trigger_of(job) == ("minFailedTaskCount 2 of role main reached: 2 tasks failed", "main", 2)


def test_min_succeeded_task_count_names_the_success_that_reached_it(alice, node):
    job = gpu_job(alice, node, role("ps"), role("worker", tasks=3, minSucceededTaskCount=2))
    tasks = start(job)
    assert exit_(tasks["worker-2"], 0)
    assert exit_(tasks["worker-0"], 0)
    assert fresh(job).state == State.SUCCEEDED
    assert trigger_of(job) == trigger_of(attempt(job)) == (
        "minSucceededTaskCount 2 of role worker reached: 2 tasks succeeded", "worker", 0)


def test_kill_all_on_completed_task_number_names_the_completion_that_reached_it(alice, node):
    job = gpu_job(alice, node, role("ps", tasks=2), role("worker", tasks=2), killAllOnCompletedTaskNumber=2)
    tasks = start(job)
    assert exit_(tasks["worker-1"], 0)
    assert exit_(tasks["ps-0"], 0)
    assert trigger_of(job) == ("killAllOnCompletedTaskNumber 2 reached: 2 tasks completed", "ps", 0)


def test_all_tasks_completed_names_the_last_to_complete(alice, node):
    job = gpu_job(alice, node, role(tasks=3, minFailedTaskCount=None))
    tasks = start(job)
    assert exit_(tasks["main-0"], 1)
    assert exit_(tasks["main-2"], None, exit_type=ExitType.NODE_LOST, error="node gone")
    assert exit_(tasks["main-1"], 0)
    assert fresh(job).state == State.SUCCEEDED
    assert trigger_of(job) == (
        "all tasks completed: 1 of 3 succeeded, 2 failed without reaching a minFailedTaskCount", "main", 1)


def test_each_attempt_of_a_retried_job_keeps_its_own_trigger(alice, node):
    job = gpu_job(alice, node, role(tasks=2), retryCount=1)
    first = start(job)
    assert exit_(first["main-1"], 3)
    first_trigger = ("minFailedTaskCount 1 of role main reached: 1 task failed", "main", 1)
    assert trigger_of(attempt(job, 1)) == first_trigger
    # The job waits for its retry (or a pass of the test cluster's agents,
    # which any pass may be, has placed it already): it has not ended, so
    # it names no trigger.
    assert fresh(job).state in (State.WAITING, State.RUNNING)
    assert trigger_of(job) == trigger_of(attempt(job, 2)) == (None, None, None)

    second = start(job)
    assert exit_(first["main-0"], 1)  # the first attempt's last task, late: it decides nothing
    assert exit_(second["main-1"], 0) and exit_(second["main-0"], 0)
    assert fresh(job).state == State.SUCCEEDED
    assert trigger_of(job) == trigger_of(attempt(job, 2)) == ("all tasks completed: 2 of 2 succeeded", "main", 0)
    assert trigger_of(attempt(job, 1)) == first_trigger


def test_a_stop_names_who_stopped_the_job_and_no_task(alice, node):
    running = gpu_job(alice, node, role(tasks=2), retryCount=3)
    tasks = start(running)
    services.job_stop(job=running, by=alice)
    assert trigger_of(running) == (None, None, None)  # stopping, not ended yet
    assert exit_(tasks["main-0"], 137) and exit_(tasks["main-1"], 1)
    assert trigger_of(running) == trigger_of(attempt(running)) == (f"stopped by {alice.username}", None, None)

    waiting = submit(alice, config("never_placed", role(), virtualCluster=hold_vc("trigger_hold", alice).name))
    services.job_stop(job=waiting, by=alice)
    assert trigger_of(waiting) == trigger_of(attempt(waiting)) == (f"stopped by {alice.username}", None, None)


def test_idle_gpus_reclaimed_names_the_platform_and_no_task(alice, node):
    job = gpu_job(alice, node, role(tasks=2), retryCount=1)
    tasks = start(job)
    assert lifecycle.job_reclaim_idle_gpus(job_id=job.pk, number=1)
    assert exit_(tasks["main-0"], 137) and exit_(tasks["main-1"], 143)
    job = fresh(job)
    assert (job.state, job.exit_type) == (State.STOPPED, ExitType.IDLE_GPUS)
    assert trigger_of(job) == (lifecycle.IDLE_GPUS_TRIGGER.message, None, None)
    assert "stopped by the platform" in job.exit_trigger_message


# ------------------------------------------------------------------ the API


def _api(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}")


def _triggers(body: dict[str, Any]) -> tuple[Any, Any, Any]:
    return body["appExitTriggerMessage"], body["appExitTriggerTaskRoleName"], body["appExitTriggerTaskIndex"]


def _retried_job(alice, node) -> Job:
    """Attempt 1 failed by main-1; attempt 2 succeeded when main-0, the last
    of its tasks, completed."""
    job = gpu_job(alice, node, role(tasks=2), retryCount=1)
    assert exit_(start(job)["main-1"], 3)
    second = start(job)
    assert exit_(second["main-1"], 0) and exit_(second["main-0"], 0)
    return fresh(job)


FIRST = ("minFailedTaskCount 1 of role main reached: 1 task failed", "main", 1)
SECOND = ("all tasks completed: 2 of 2 succeeded", "main", 0)


def test_the_status_says_what_ended_the_job_in_v1_and_v2(alice, bob, node):
    job = _retried_job(alice, node)
    for path in (f"/api/v1/user/{alice.username}/jobs/{job.name}", f"/api/v2/jobs/{alice.username}~{job.name}"):
        answer = _api(alice).get(path)
        assert answer.status_code == 200
        status = answer.json()["jobStatus"]
        assert _triggers(status) == SECOND
        # The fields beside it are as they were.
        assert (status["state"], status["appExitCode"], status["appExitType"]) == (State.SUCCEEDED, 0, "SUCCEEDED")
        assert status["appExitDiagnostics"] == "all tasks succeeded"
        assert status["retryDetails"] == {"user": 1, "platform": 0, "resource": 0}
        # Another user and an anonymous client get none of it.
        assert _api(bob).get(path).status_code == 404
        assert Client().get(path).status_code == 401
    v2 = _api(alice).get(f"/api/v2/jobs/{alice.username}~{job.name}").json()
    assert [_triggers(a) for a in v2["jobAttempts"]] == [FIRST, SECOND]


def test_each_job_attempt_says_what_ended_it(alice, bob, node):
    job = _retried_job(alice, node)
    base = f"/api/v2/jobs/{alice.username}~{job.name}/job-attempts"
    answer = _api(alice).get(base)
    attempts = json.loads(b"".join(answer.streaming_content))
    assert [_triggers(a) for a in attempts] == [FIRST, SECOND]
    assert [a["exitCode"] for a in attempts] == [3, 0]  # unchanged beside them
    assert _triggers(_api(alice).get(f"{base}/1").json()) == FIRST
    assert _triggers(_api(alice).get(f"{base}/2").json()) == SECOND
    for path in (base, f"{base}/1"):
        assert _api(bob).get(path).status_code == 404
        assert Client().get(path).status_code == 401


def test_a_running_job_and_a_job_ended_before_triggers_were_kept_answer_null(alice, node):
    running = gpu_job(alice, node)
    start(running)
    old = ended_job(alice, "ended_before_0020", State.FAILED, exit_type=ExitType.USER_EXIT, exit_code=1)
    for job in (running, old):
        for path in (f"/api/v1/user/{alice.username}/jobs/{job.name}", f"/api/v2/jobs/{alice.username}~{job.name}"):
            answer = _api(alice).get(path)
            assert answer.status_code == 200
            assert _triggers(answer.json()["jobStatus"]) == (None, None, None)
        attempts = _api(alice).get(f"/api/v2/jobs/{alice.username}~{job.name}").json()["jobAttempts"]
        assert [_triggers(a) for a in attempts] == [(None, None, None)]


def test_a_stopped_jobs_status_names_who_stopped_it_and_no_task(alice, node):
    job = gpu_job(alice, node)
    task = start(job)["main-0"]
    services.job_stop(job=job, by=alice)
    assert exit_(task, 137)
    status = _api(alice).get(f"/api/v2/jobs/{alice.username}~{job.name}").json()
    assert _triggers(status["jobStatus"]) == _triggers(status["jobAttempts"][0]) == (
        f"stopped by {alice.username}", None, None)


def _messages(job: Job, user) -> tuple[Any, list[Any]]:
    """appExitMessages of the job's v1 and v2 status (they must agree) and
    of each of its v2 job attempts."""
    v1 = _api(user).get(f"/api/v1/user/{job.owner.username}/jobs/{job.name}").json()["jobStatus"]
    v2 = _api(user).get(f"/api/v2/jobs/{job.owner.username}~{job.name}").json()
    assert v1["appExitMessages"] == v2["jobStatus"]["appExitMessages"]
    return v1["appExitMessages"], [a["appExitMessages"] for a in v2["jobAttempts"]]


def test_exit_messages_give_the_users_exit_code_and_why_as_openpai_clients_read_them(alice, bob, node):
    """OpenPAI's job page reads appExitMessages.runtime.originalUserExitCode:
    the code of the user's command that ended the attempt, only for that."""
    job = _retried_job(alice, node)  # attempt 1: main-1 exited 3; attempt 2 succeeded
    status, attempts = _messages(job, alice)
    assert status == attempts[1] == {"container": None, "runtime": None, "launcher": "all tasks succeeded"}
    assert attempts[0]["runtime"] == {"originalUserExitCode": 3} and attempts[0]["container"] is None
    assert attempts[0]["launcher"] == attempt(job, 1).exit_reason and "3" in attempts[0]["launcher"]
    path = f"/api/v2/jobs/{alice.username}~{job.name}/job-attempts/1"
    assert _api(alice).get(path).json()["appExitMessages"] == attempts[0]
    assert _api(bob).get(path).status_code == 404 and Client().get(path).status_code == 401


def test_exit_messages_are_null_until_the_end_and_name_no_user_code_for_a_stop(alice, node):
    job = gpu_job(alice, node)
    task = start(job)["main-0"]
    assert _messages(job, alice) == (None, [None])
    services.job_stop(job=job, by=alice)
    assert exit_(task, 137)
    status, attempts = _messages(fresh(job), alice)
    assert status == attempts[0]
    assert status["runtime"] is None and status["container"] is None and status["launcher"]


def test_a_platform_failure_names_no_user_exit_code(alice, node):
    job = gpu_job(alice, node)
    assert exit_(start(job)["main-0"], 137, oom_killed=True)
    status, attempts = _messages(fresh(job), alice)
    assert fresh(job).state == State.FAILED
    assert fresh(job).exit_type == ExitType.OOM
    assert status == attempts[0] and status["runtime"] is None and status["launcher"] == fresh(job).exit_reason


def _described(schema: dict[str, Any]) -> dict[str, Any]:
    return schema["properties"]


def _check_described(answer: dict[str, Any], schema: dict[str, Any]) -> None:
    """Every field answered is described, and null only where it may be."""
    properties = _described(schema)
    for key, value in answer.items():
        assert key in properties, key
        assert value is not None or properties[key].get("nullable"), key


def test_the_descriptions_have_the_fields_as_answered(alice, node):
    job = _retried_job(alice, node)
    running = gpu_job(alice, node)
    start(running)
    v1_job_status = openapi.description()["components"]["schemas"]["JobStatus"]["properties"]["jobStatus"]
    v2_attempt = openapi_v2.description()["components"]["schemas"]["JobAttempt"]
    for each in (job, running):
        status = _api(alice).get(f"/api/v2/jobs/{alice.username}~{each.name}").json()
        _check_described(status["jobStatus"], v1_job_status)
        for job_attempt in status["jobAttempts"]:
            _check_described(job_attempt, v2_attempt)
    for name in ("appExitTriggerMessage", "appExitTriggerTaskRoleName", "appExitTriggerTaskIndex", "appExitMessages"):
        assert "description" in _described(v1_job_status)[name] and _described(v2_attempt)[name]["nullable"]


# ------------------------------------------------------------------ the page


def test_the_job_page_says_which_task_ended_the_job(alice, bob, node):
    job = gpu_job(alice, node, role(tasks=3))
    tasks = start(job)
    assert exit_(tasks["main-2"], 3)
    owner = Client()
    owner.force_login(alice)
    html = owner.get(f"/jobs/{job.pk}/").content.decode()
    assert ('<p class="exit-trigger"><strong>Ended by:</strong> '
            "task main-2 (minFailedTaskCount 1 of role main reached: 1 task failed)</p>") in html
    assert html.index('class="exit-words"') < html.index('class="exit-trigger"') < html.index('class="exit-solution"')
    other = Client()
    other.force_login(bob)
    assert other.get(f"/jobs/{job.pk}/").status_code == 404
    assert Client().get(f"/jobs/{job.pk}/").status_code == 302  # to the login page


def test_the_job_page_of_a_stopped_job_says_who_once(alice, node):
    job = gpu_job(alice, node)
    task = start(job)["main-0"]
    services.job_stop(job=job, by=alice)
    assert exit_(task, 137)
    owner = Client()
    owner.force_login(alice)
    html = owner.get(f"/jobs/{job.pk}/").content.decode()
    assert f"stopped by {alice.username}" in html and "Ended by:" not in html


def _page(user, job: Job) -> str:
    client = Client()
    client.force_login(user)
    answer = client.get(f"/jobs/{job.pk}/")
    assert answer.status_code == 200
    return answer.content.decode()


def _attempt_rows(html: str) -> list[str]:
    """The attempts table's rows, oldest first."""
    table = html[html.index('<table class="attempts">'):]
    table = table[:table.index("</table>")]
    return table.split("<tr")[2:]  # after the head's row


def test_the_attempts_table_says_what_ended_each_attempt(alice, bob, node):
    job = _retried_job(alice, node)
    first, second = _attempt_rows(_page(alice, job))
    assert ('<div class="small muted attempt-trigger">'
            "Ended by main-1: minFailedTaskCount 1 of role main reached: 1 task failed</div>") in first
    assert "Ended by main-0: all tasks completed: 2 of 2 succeeded" in second
    other = Client()
    other.force_login(bob)
    assert other.get(f"/jobs/{job.pk}/").status_code == 404
    assert Client().get(f"/jobs/{job.pk}/").status_code == 302  # to the login page
    assert Client().get(f"/jobs/{job.pk}/").url.startswith("/login/")


def test_the_attempts_table_escapes_what_ended_an_attempt(alice):
    job = ended_job(alice, "escaped_trigger", State.FAILED, retry_limit=1, exit_type=ExitType.USER_EXIT, exit_code=1)
    JobAttempt.objects.filter(job=job).update(exit_trigger_message="<script>alert(1)</script> & more",
                                              exit_trigger_role="<b>r</b>", exit_trigger_index=0)
    [row] = _attempt_rows(_page(alice, job))
    assert "Ended by &lt;b&gt;r&lt;/b&gt;-0: &lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in row
    assert "<script>alert" not in row and "<b>r" not in row


def test_the_attempts_table_of_a_stopped_job_says_who_stopped_it_and_no_task(alice, node):
    stopped = gpu_job(alice, node, role(tasks=2), retryCount=1)
    tasks = start(stopped)
    services.job_stop(job=stopped, by=alice)
    assert all(exit_(task, 137) for task in tasks.values())
    [row] = _attempt_rows(_page(alice, stopped))
    # The exit words say who, once; no task is named.
    assert row.count(f"stopped by {alice.username}") == 1 and "Ended by" not in row and "attempt-trigger" not in row

    reclaimed = gpu_job(alice, node, role(tasks=2), retryCount=1)
    tasks = start(reclaimed)
    assert lifecycle.job_reclaim_idle_gpus(job_id=reclaimed.pk, number=1)
    assert all(exit_(task, 137) for task in tasks.values())
    [row] = _attempt_rows(_page(alice, reclaimed))
    assert ('<div class="small muted attempt-trigger">Stopped by the platform: its GPUs stayed idle past the '
            "cluster&#x27;s grace period</div>") in row


def test_the_attempts_table_of_a_job_that_ended_before_triggers_were_kept_names_none(alice):
    job = ended_job(alice, "ended_before_0020_rows", State.FAILED, retry_limit=1, exit_type=ExitType.USER_EXIT,
                    exit_code=1, exit_reason="task main-0 failed: the command exited with code 1")
    [row] = _attempt_rows(_page(alice, job))
    assert "exited with code 1" in row and "attempt-trigger" not in row


# ------------------------------------------------------------------ the admin


def _admin_page(user, path: str):
    client = Client()
    client.force_login(user)
    return client.get(path)


def test_the_admin_shows_the_trigger_read_only_beside_the_exit_fields(admin_user, alice, node):
    job = _retried_job(alice, node)
    path = f"/admin/jobs/job/{job.pk}/change/"
    answer = _admin_page(admin_user, path)
    assert answer.status_code == 200
    html = answer.content.decode()
    # The job's, read-only (no input), right after its exit reason.
    for name in ("exit_trigger_message", "exit_trigger_role", "exit_trigger_index"):
        assert f'name="{name}"' not in html and f'name="attempts-0-{name}"' not in html
        assert f"field-{name}" in html
    fieldset = html[:html.index('id="attempts-group"')]
    assert fieldset.index("field-exit_reason") < fieldset.index("field-exit_trigger_message") < fieldset.index(
        "field-exit_trigger_role") < fieldset.index("field-exit_trigger_index") < fieldset.index("field-waiting_reason")
    assert [_admin_readonly(fieldset, name) for name in ("exit_trigger_message", "exit_trigger_role",
                                                         "exit_trigger_index")] == [SECOND[0], "main", "0"]
    # Each attempt's, in the attempts inline.
    inline = html[html.index('id="attempts-group"'):]
    assert FIRST[0] in inline and SECOND[0] in inline
    # The admin stays the admins': a user is sent to log in, as is a stranger.
    for answer in (_admin_page(alice, path), Client().get(path)):
        assert answer.status_code == 302 and answer.url.endswith(f"login/?next={path}"), answer.url


def test_the_admin_shows_a_stops_message_and_no_task(admin_user, alice):
    waiting = submit(alice, config("admin_stop", role(), virtualCluster=hold_vc("trigger_admin", alice).name))
    services.job_stop(job=waiting, by=alice)
    html = _admin_page(admin_user, f"/admin/jobs/job/{waiting.pk}/change/").content.decode()
    assert _admin_readonly(html, "exit_trigger_message") == f"stopped by {alice.username}"
    assert _admin_readonly(html, "exit_trigger_role") == _admin_readonly(html, "exit_trigger_index") == "-"


def _admin_readonly(html: str, name: str) -> str:
    """The value the admin's change form shows for a read-only field of the job."""
    found = re.search(rf'field-{name}">.*?<div class="readonly">(.*?)</div>', html, re.DOTALL)
    assert found, name
    return found.group(1)
