"""Per-user limits ("safe among users who do not trust each other"): one user
could fill a virtual cluster's queue and its whole share. Admins now set,
per virtual cluster and user, the most waiting jobs (more are refused),
running jobs and GPUs in use (a job over them waits and says why); and the
REST API takes at most API_SUBMISSIONS_PER_MINUTE submissions per user.

Scheduling runs in this process (`services.schedule_pass`) onto a node row
of the test's own, with GPUs of a type no other node has, served by no
agent: the test plays the agent to start and end tasks.
"""

from __future__ import annotations

import html
import json
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.http import HttpResponse
from django.test import Client
from django.utils import timezone

from jobs import services
from jobs.models import ACTIVE_TASK_STATES, Job, Node, State, TaskAttempt, User, UserLimit, VirtualCluster
from jobs.services import job_store, tokens
from jobs.services.lifecycle import ContainerExit
from jobs.submit_draft import check_draft
from tests.cluster import wait_for
from tests.conftest import unique
from tests.helpers import config, role, submit, submit_in_one_batch

pytestmark = pytest.mark.services  # scheduling and storing jobs wake the scheduler through Redis


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def node(make_user, redis_server) -> Iterator[Node]:
    """A node of the test's own, its GPUs of a type no other node has; kept
    ready an hour ahead. (Depends on make_user so that it is torn down
    first: its tasks end before their jobs are stopped.)"""
    gpu_type = f"UL{uuid.uuid4().hex[:8].upper()}"
    node = Node.objects.create(
        name=f"t-limits-{gpu_type.lower()}", address=f"{gpu_type.lower()}.invalid", docker_host="unix:///nonexistent",
        cpus=32, memory_mb=32000, gpus=[{"index": i, "type": gpu_type} for i in range(16)], gpus_simulated=True,
        port_start=41000, port_end=41199, last_heartbeat=timezone.now() + timedelta(hours=1), agent_pid=os.getpid(),
    )
    yield node
    Node.objects.filter(pk=node.pk).update(schedulable=False, last_heartbeat=timezone.now())
    for attempt_id in TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES).values_list("pk", flat=True):
        services.attempt_record_exit(attempt_id, ContainerExit(0))


@pytest.fixture
def limit() -> Iterator[Callable[..., UserLimit]]:
    """Limit rows, removed after the test: a default row would otherwise
    bind later tests' users."""
    made: list[UserLimit] = []

    def make(user: User | None, vc: str = VirtualCluster.DEFAULT, **limits: int | None) -> UserLimit:
        row = UserLimit.objects.create(virtual_cluster=VirtualCluster.objects.get(name=vc), user=user, **limits)
        made.append(row)
        return row

    yield make
    UserLimit.objects.filter(pk__in=[row.pk for row in made]).delete()


@pytest.fixture
def team_vc(alice, bob) -> Iterator[VirtualCluster]:
    """A virtual cluster of alice's and bob's with a share of its own; its
    share goes back to "default" after the test."""
    vc = VirtualCluster.objects.create(name=unique("limits_vc"), capacity=50.0)
    vc.users.add(alice, bob)
    yield vc
    UserLimit.objects.filter(virtual_cluster=vc).delete()
    VirtualCluster.objects.filter(pk=vc.pk).update(capacity=0.0)


def gpu_job(user: User, node: Node, *, gpus: int = 1, vc: str = VirtualCluster.DEFAULT) -> Job:
    return submit(user, config(unique("lim"), role(command="sleep 1", gpus=gpus), gpuType=node.gpus[0]["type"],
                               virtualCluster=vc))


def parked_config(name: str) -> dict:
    """A job that never starts anywhere (no node has its GPU type)."""
    return config(name, role(command="true", gpus=1), gpuType=f"NOWHERE{uuid.uuid4().hex[:6].upper()}")


def fresh(job: Job) -> Job:
    job.refresh_from_db()
    return job


def launch(job: Job) -> list[TaskAttempt]:
    """Play the agent: launch the job's placed tasks."""
    attempts = list(TaskAttempt.objects.filter(job=job, state__in=ACTIVE_TASK_STATES))
    for attempt in attempts:
        if services.attempt_claim_launch(attempt.pk):
            services.attempt_mark_running(attempt.pk, container_id=f"fake-{attempt.pk}")
    return attempts


def finish(job: Job, code: int = 0) -> None:
    """Play the agent: the job's tasks exit with `code`."""
    for attempt in launch(job):
        assert services.attempt_record_exit(attempt.pk, ContainerExit(code))
    assert fresh(job).is_final


def page_text(user: User, job: Job) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def api_client(user: User) -> Client:
    key = tokens.token_create(user=user, lifetime=timedelta(hours=1)).key
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def api_submit(client: Client, user: User, cfg: dict) -> HttpResponse:
    return client.post(f"/api/v1/user/{user.username}/jobs", data=json.dumps(cfg), content_type="application/json")


# ------------------------------------------------------------- waiting jobs


def test_it_refuses_a_submission_over_the_waiting_limit_naming_it(alice, limit, redis_server):
    limit(alice, max_waiting_jobs=2)
    for i in range(2):
        submit(alice, parked_config(f"w{i}"))
    with pytest.raises(services.SubmitError) as refused:
        submit(alice, parked_config("w2"))
    assert refused.value.code == "NoEnoughQuotaError" and refused.value.field == "virtualCluster"
    assert refused.value.message.startswith(
        'you have 2 waiting jobs in virtual cluster "default"; its limit for you is 2')
    assert not Job.objects.filter(owner=alice, name="w2").exists()
    # The Submit page's live check says the same before Submit.
    problems = check_draft(user=alice, text=json.dumps(parked_config("w2"))).problems
    assert [p.message for p in problems if p.path == "virtualCluster"] == [refused.value.message]


def test_it_refuses_over_the_waiting_limit_through_the_api_with_a_4xx(alice, limit, redis_server):
    limit(alice, max_waiting_jobs=1)
    client = api_client(alice)
    assert api_submit(client, alice, parked_config("first")).status_code == 202
    refused = api_submit(client, alice, parked_config("second"))
    assert refused.status_code == 403
    assert refused.json()["code"] == "NoEnoughQuotaError"
    assert "its limit for you is 1" in refused.json()["message"]
    by_name = client.put(f"/api/v1/user/{alice.username}/jobs/third", data=json.dumps(parked_config("third")),
                         content_type="application/json")
    assert by_name.status_code == 403 and by_name.json()["code"] == "NoEnoughQuotaError"


def test_it_frees_a_waiting_place_when_a_waiting_job_is_stopped(alice, limit, redis_server):
    limit(alice, max_waiting_jobs=1)
    first = submit(alice, parked_config("first"))
    services.job_stop(job=first, by=alice)
    assert submit(alice, parked_config("second")).state == State.WAITING


def test_it_lets_no_extra_job_through_when_submissions_are_stored_together(alice, limit, redis_server):
    # Five submissions pass the early check at once (alice has no waiting
    # job yet) and queue up behind a write this test holds; they are stored
    # in one batch, one of them with a name given twice. The limit is
    # counted again inside the write: exactly three are stored.
    limit(alice, max_waiting_jobs=3)
    names = ["one", "one", "two", "three", "four"]
    results = submit_in_one_batch(alice, [json.dumps(parked_config(name)) for name in names])
    assert results == {0: "stored", 1: "ConflictJobError", 2: "stored", 3: "stored", 4: "NoEnoughQuotaError"}
    assert Job.objects.filter(owner=alice, state=State.WAITING).count() == 3


# ------------------------------------------------------ running jobs and GPUs


def test_a_job_over_the_running_limit_waits_says_why_and_starts_when_one_ends(alice, node, limit):
    limit(alice, max_running_jobs=1)
    first, second = gpu_job(alice, node), gpu_job(alice, node)
    services.schedule_pass()
    assert fresh(first).state == State.RUNNING
    second = fresh(second)
    assert second.state == State.WAITING
    reason = "you have 1 running job in virtual cluster 'default', your limit there; it starts when one of them ends"
    assert second.waiting_reason == reason
    assert reason[0].upper() + reason[1:] in page_text(alice, second)
    finish(first)
    services.schedule_pass()
    assert fresh(second).state == State.RUNNING


def test_a_stopping_job_still_counts_until_it_has_ended(alice, node, limit):
    limit(alice, max_running_jobs=1)
    first, second = gpu_job(alice, node), gpu_job(alice, node)
    services.schedule_pass()
    launch(first)
    assert services.job_stop(job=fresh(first), by=alice).state == State.STOPPING
    services.schedule_pass()
    assert fresh(second).state == State.WAITING
    finish(first, 137)
    assert fresh(first).state == State.STOPPED
    services.schedule_pass()
    assert fresh(second).state == State.RUNNING


def test_a_job_over_the_gpu_limit_waits_says_why_and_starts_when_gpus_are_free(alice, node, limit):
    limit(alice, max_gpus=3)
    first, second, third = gpu_job(alice, node, gpus=2), gpu_job(alice, node, gpus=2), gpu_job(alice, node, gpus=1)
    services.schedule_pass()
    assert (fresh(first).state, fresh(second).state, fresh(third).state) == (State.RUNNING, State.WAITING,
                                                                             State.RUNNING)
    services.schedule_pass()  # the first pass looked at the second job before it placed the third
    reason = ("your jobs hold 3 GPUs in virtual cluster 'default' and this one needs 2; your limit there is 3, "
              "so it starts when enough of them end")
    assert fresh(second).waiting_reason == reason
    assert reason[0].upper() + reason[1:] in page_text(alice, second)
    finish(third)
    services.schedule_pass()
    assert fresh(second).state == State.WAITING  # 2 held + 2 wanted > 3
    finish(first)
    services.schedule_pass()
    assert fresh(second).state == State.RUNNING


def test_a_job_needing_more_gpus_than_the_limit_says_it_can_never_start(alice, node, limit):
    limit(alice, max_gpus=2)
    job = gpu_job(alice, node, gpus=4)
    services.schedule_pass()
    assert fresh(job).state == State.WAITING
    assert fresh(job).waiting_reason == "can never fit: needs 4 GPUs but your limit in virtual cluster 'default' is 2"


def test_one_users_limit_never_holds_back_another_users_jobs(alice, bob, node, limit):
    # Alice's waiting job is first in the queue and was overtaken so often
    # that it would block the virtual cluster; her own limit holds it, and
    # Bob's later job starts anyway.
    limit(alice, max_running_jobs=1)
    running = gpu_job(alice, node)
    services.schedule_pass()
    assert fresh(running).state == State.RUNNING
    held = gpu_job(alice, node)
    Job.objects.filter(pk=held.pk).update(overtaken=99)
    other = gpu_job(bob, node)
    services.schedule_pass()
    assert fresh(held).state == State.WAITING and "your limit there" in fresh(held).waiting_reason
    assert fresh(other).state == State.RUNNING
    assert fresh(held).overtaken == 99  # not counted as overtaken by Bob's job


def test_a_users_own_row_replaces_the_virtual_clusters_default(alice, bob, node, limit, team_vc):
    limit(None, team_vc.name, max_waiting_jobs=1, max_running_jobs=1)
    limit(bob, team_vc.name, max_running_jobs=2)  # no waiting limit for bob
    alices = gpu_job(alice, node, vc=team_vc.name)
    with pytest.raises(services.SubmitError, match="its limit for you is 1"):
        gpu_job(alice, node, vc=team_vc.name)
    bobs = [gpu_job(bob, node, vc=team_vc.name) for _ in range(3)]
    services.schedule_pass()
    assert fresh(alices).state == State.RUNNING
    assert [fresh(job).state for job in bobs] == [State.RUNNING, State.RUNNING, State.WAITING]
    assert fresh(bobs[2]).waiting_reason.startswith(f"you have 2 running jobs in virtual cluster '{team_vc.name}'")
    # In "default" neither row applies: alice may queue and run more there.
    assert [gpu_job(alice, node).state for _ in range(2)] == [State.WAITING, State.WAITING]


# --------------------------------------------------------- API submission rate


def test_it_rate_limits_api_submissions_per_user_with_retry_after(alice, bob, settings, redis_server):
    settings.API_SUBMISSIONS_PER_MINUTE = 3
    client = api_client(alice)
    for i in range(3):
        assert api_submit(client, alice, parked_config(f"r{i}")).status_code == 202
    refused = api_submit(client, alice, parked_config("r3"))
    assert refused.status_code == 429 and refused.json()["code"] == "TooManyRequestsError"
    assert 1 <= int(refused["Retry-After"]) <= 61
    assert not Job.objects.filter(owner=alice, name="r3").exists()
    # A fresh token of hers does not start a count of its own: tokens are
    # free to make, so a count per token would be no limit at all.
    assert api_submit(api_client(alice), alice, parked_config("r4")).status_code == 429
    # Another user's token is counted on its own; an anonymous client is
    # refused before anything is counted.
    assert api_submit(api_client(bob), bob, parked_config("b0")).status_code == 202
    anonymous = api_submit(Client(), alice, parked_config("anon"))
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "UnauthorizedUserError"


# ---------------------------------------------------- who sees and sets limits


@pytest.mark.parametrize("who", ["anonymous", "user", "staff without permission"])
def test_it_keeps_the_limits_admin_to_admins(who, make_user):
    client = Client()
    if who != "anonymous":
        user = make_user("nonadmin")
        if who.startswith("staff"):
            User.objects.filter(pk=user.pk).update(is_staff=True)
        client.force_login(User.objects.get(pk=user.pk))
    for path in ("/admin/jobs/userlimit/", "/admin/jobs/userlimit/add/"):
        response = client.get(path)
        assert response.status_code in (302, 403), (path, response.status_code)
        if response.status_code == 302:
            assert "/login/" in response["Location"]  # the portal's login, or the admin's when signed in


def test_an_admin_edits_limits_in_the_django_admin(admin_user, alice, limit):
    limit(alice, max_gpus=4)
    client = Client()
    client.force_login(admin_user)
    assert client.get("/admin/jobs/userlimit/add/").status_code == 200
    assert alice.username in client.get(f"/admin/jobs/userlimit/?q={alice.username}").content.decode()


def test_users_see_their_own_limits_and_nobody_elses(alice, bob, limit):
    limit(alice, max_waiting_jobs=7, max_running_jobs=3, max_gpus=5)
    client = Client()
    client.force_login(alice)
    mine = html.unescape(client.get("/virtual-clusters/").content.decode())
    assert "Your limits here:" in mine and "7 waiting jobs" in mine and "5 GPUs in use" in mine
    client.force_login(bob)
    assert "Your limits here:" not in client.get("/virtual-clusters/").content.decode()
    anonymous = Client().get("/virtual-clusters/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_one_users_jobs_that_cannot_start_never_fill_what_a_pass_looks_at(alice, bob, node, monkeypatch):
    # A pass looks at so many waiting jobs (MAX_JOBS_PER_PASS). Alice's jobs
    # that can never start (a GPU type no node has) used to fill it, oldest
    # first, and no later job of anyone's was ever looked at again. When
    # more wait, each owner now brings an even share of their oldest.
    monkeypatch.setattr("jobs.services.scheduling.MAX_JOBS_PER_PASS", 20)
    parked = [submit(alice, config(f"park-{i}", role(gpus=1), gpuType="NO-SUCH-GPU")) for i in range(25)]
    bobs = gpu_job(bob, node)
    services.schedule_pass()
    assert fresh(bobs).state == State.RUNNING
    assert all(fresh(job).state == State.WAITING for job in parked)
