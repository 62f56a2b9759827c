"""How a job ended, in OpenPAI's words: `appExitSpec`, `retryDetails` and
the other status fields OpenPAI's clients read, the v2 job attempts' OpenPAI
names and `/job-attempts/healthz`, the v2 list's keyword over virtual
clusters, and the job page's "What to do".

Users: alice (owner), bob (another user), an admin; each test makes its own.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

from django.test import Client

from jobs import exit_spec
from jobs.api import openapi, openapi_v2
from jobs.models import ExitType, JobAttempt, State, VirtualCluster
from jobs.services import tokens
from tests.test_pages import ended_job, task_attempt


def _api(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}")


def _oom_job_retried(owner, name: str):
    """Failed for memory on its third attempt, after a node loss and a
    non-zero exit."""
    job = ended_job(owner, name, State.FAILED, exit_type=ExitType.OOM, exit_code=137,
                    exit_reason="task main-0 used more than 100 MB", retry_limit=2, attempt_number=3)
    JobAttempt.objects.filter(job=job, number=1).update(state=State.FAILED, exit_type=ExitType.NODE_LOST)
    JobAttempt.objects.create(job=job, number=2, state=State.FAILED, exit_type=ExitType.USER_EXIT, exit_code=2)
    JobAttempt.objects.create(job=job, number=3, state=State.FAILED, exit_type=ExitType.OOM, exit_code=137)
    task_attempt(job, number=1, state="FAILED", exit_type=ExitType.NODE_LOST, exit_code=None,
                 exit_reason="node node-x lost")
    return job


def test_every_way_a_job_ends_has_a_spec() -> None:
    assert {exit_type for exit_type in ExitType.values if exit_type} == set(exit_spec.SPECS)
    assert exit_spec.as_openpai("", None) is None
    # A failure the user can act on says how.
    for exit_type in (ExitType.USER_EXIT, ExitType.OOM, ExitType.IMAGE_PULL, ExitType.PLATFORM, ExitType.IDLE_GPUS):
        assert exit_spec.SPECS[exit_type].solution


def test_the_status_says_how_the_job_ended_and_why_it_was_retried(alice, bob) -> None:
    job = _oom_job_retried(alice, "oom_retried")
    for path in (f"/api/v1/user/{alice.username}/jobs/{job.name}", f"/api/v2/jobs/{alice.username}~{job.name}"):
        status = _api(alice).get(path).json()["jobStatus"]
        spec = status["appExitSpec"]
        assert (spec["code"], spec["phrase"], spec["type"], spec["reaction"]) == (
            137, "ContainerOOMKilled", "USER_FAILURE", "NEVER_RETRY")
        assert any("memoryMB" in step for step in spec["solution"])
        # Two retries: one after the node was lost, one after the command's own failure.
        assert status["retries"] == 2
        assert status["retryDetails"] == {"user": 1, "platform": 1, "resource": 0}
        assert status["appId"] == f"{job.pk}-3" and status["appProgress"] == 1
        assert status["appTrackingUrl"] == f"http://testserver/jobs/{job.pk}/"
        # The task's container: its node, times and how it ended.
        task = _api(alice).get(path).json()["taskRoles"]["main"]["taskStatuses"][0]
        assert task["containerNodeName"] == "node-x"
        assert task["containerExitSpec"]["phrase"] == "NodeLost"
        assert task["containerExitDiagnostics"] == "node node-x lost"
        assert task["completedTime"] is not None
        # Another user and an anonymous client get none of it.
        assert _api(bob).get(path).status_code == 404
        assert Client().get(path).status_code == 401


def test_a_running_job_has_no_exit_spec_yet(alice) -> None:
    job = ended_job(alice, "still_running", State.RUNNING, finished_at=None, exit_type="")
    status = _api(alice).get(f"/api/v2/jobs/{alice.username}~{job.name}").json()["jobStatus"]
    assert status["appExitSpec"] is None and status["appProgress"] == 0
    assert status["retryDetails"] == {"user": 0, "platform": 0, "resource": 0}


def test_job_attempts_carry_openpais_names(alice, bob, admin_user) -> None:
    job = _oom_job_retried(alice, "attempts_named")
    answer = _api(alice).get(f"/api/v2/jobs/{alice.username}~{job.name}/job-attempts")
    attempts = json.loads(b"".join(answer.streaming_content))
    assert [a["attemptIndex"] for a in attempts] == [1, 2, 3]
    assert [a["state"] for a in attempts] == ["FAILED"] * 3
    assert [a["exitPhrase"] for a in attempts] == ["NodeLost", "CommandExitedNonZero", "ContainerOOMKilled"]
    first = attempts[0]
    assert first["frameworkName"] == f"{alice.username}~{job.name}" and first["userName"] == alice.username
    assert first["taskRoles"]["main"]["taskRoleStatus"] == {"name": "main"}
    assert first["appExitSpec"]["type"] == "PLATFORM_FAILURE"
    assert first["totalTaskNumber"] == 1 and first["isLatest"] is False and attempts[2]["isLatest"] is True
    # OpenPAI's web portal asks this before it shows the retry history.
    health = f"/api/v2/jobs/{alice.username}~{job.name}/job-attempts/healthz"
    answer = _api(alice).get(health)
    assert (answer.status_code, answer.content) == (200, b"ok")
    assert _api(admin_user).get(health).status_code == 200
    assert _api(bob).get(health).status_code == 404
    assert Client().get(health).status_code == 401
    assert _api(alice).get(f"/api/v2/jobs/{alice.username}~no_such_job/job-attempts/healthz").status_code == 404


def test_the_v2_list_keyword_matches_virtual_clusters(alice, bob) -> None:
    vc = VirtualCluster.objects.create(name="kwvision", capacity=0)
    job = ended_job(alice, "kw_plain")
    job.virtual_cluster = vc
    job.save(update_fields=["virtual_cluster"])
    ended_job(alice, "kw_other")
    listed = _api(alice).get("/api/v2/jobs", {"keyword": "kwvis"}).json()
    assert [item["name"] for item in listed] == ["kw_plain"]
    assert listed[0]["submissionTime"] == listed[0]["createdTime"]
    # OpenPAI's UNKNOWN state is taken, and no job is ever in it; a made-up state is refused.
    assert _api(alice).get("/api/v2/jobs", {"keyword": "kwvis", "state": "UNKNOWN"}).json() == []
    assert [item["name"] for item in _api(alice).get(
        "/api/v2/jobs", {"keyword": "kwvis", "state": "UNKNOWN,SUCCEEDED"}).json()] == ["kw_plain"]
    refused = _api(alice).get("/api/v2/jobs", {"state": "NAPPING"})
    assert refused.status_code == 400 and "NAPPING" in refused.json()["message"]
    # Another user's list has nothing of alice's, whatever the keyword.
    assert _api(bob).get("/api/v2/jobs", {"keyword": "kwvis"}).json() == []
    assert Client().get("/api/v2/jobs", {"keyword": "kwvis"}).status_code == 401


def test_the_job_page_says_what_to_do(alice, bob) -> None:
    job = _oom_job_retried(alice, "oom_page")
    owner = Client()
    owner.force_login(alice)
    html = owner.get(f"/jobs/{job.pk}/").content.decode()
    assert "What to do:" in html and "memoryMB" in html
    # A job that succeeded has nothing to do about it.
    done = ended_job(alice, "fine_page")
    assert "What to do:" not in owner.get(f"/jobs/{done.pk}/").content.decode()
    other = Client()
    other.force_login(bob)
    assert other.get(f"/jobs/{job.pk}/").status_code == 404
    assert Client().get(f"/jobs/{job.pk}/").status_code == 302  # to the login page


def test_the_api_descriptions_have_no_dangling_references() -> None:
    for module in (openapi, openapi_v2):
        described = module.description()
        named = set(re.findall(r'"#/components/schemas/(\w+)"', json.dumps(described)))
        assert named <= set(described["components"]["schemas"]), module.__name__


def test_the_job_page_words_the_steps_for_the_job_it_shows(alice) -> None:
    """The page is the ended job's: its exit message is above the steps, its
    logs below them and Clone at the top, and its own retries are over."""
    owner = Client()
    owner.force_login(alice)

    def steps(job) -> str:
        html = owner.get(f"/jobs/{job.pk}/").content.decode()
        return re.search(r'<div class="exit-solution">(.*?)</div>', html, re.DOTALL)[1]

    failed = steps(ended_job(alice, "page_exit", State.FAILED, exit_type=ExitType.USER_EXIT, exit_code=1))
    assert "stderr and stdout in Logs below" in failed and "Clone the job to submit it again" in failed
    assert "on the job page" not in failed
    lost = steps(ended_job(alice, "page_lost", State.FAILED, exit_type=ExitType.NODE_LOST))
    assert "Clone the job to run it again. With a retryCount above 0" in lost
    assert "the job is tried again by itself" not in lost  # not this one: it has ended
    retried = steps(ended_job(alice, "page_lost_retried", State.FAILED, exit_type=ExitType.NODE_LOST, retry_limit=2,
                              attempt_number=3))
    assert "It was already tried again 2 times, as its retryCount allows; Clone the job to run it again." in retried
    pulled = steps(ended_job(alice, "page_pull", State.FAILED, exit_type=ExitType.IMAGE_PULL, exit_reason="manifest unknown"))
    assert "The message above gives the registry&#x27;s answer." in pulled


def test_the_api_keeps_openpais_words_for_any_client() -> None:
    spec = exit_spec.as_openpai(ExitType.NODE_LOST, None)
    assert spec["solution"] == list(exit_spec.SPECS[ExitType.NODE_LOST].solution)
    assert "With a retryCount above 0 the job is tried again by itself; otherwise submit it again." in spec["solution"]
    assert exit_spec.solution_on_job_page("", retries=0, retry_limit=0) == ()
    assert exit_spec.solution_on_job_page(ExitType.NODE_LOST, retries=1, retry_limit=3)[-1].startswith(
        "It was already tried again once,")
