"""OpenPAI REST compatibility of the v2 API, through Django's test client:
a job as it was at one of its attempts (`.../attempts/<jobAttemptId>`),
the cluster's SKU types (`/cluster/sku-types?vc=`), `hasGithubPAT` in v1's
user entries, and the job list's `order` (an unknown one is ignored, as
OpenPAI's rest-server ignores it).

Users: alice (owner), bob (another user), an admin; each test makes its own.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import JobAttempt, Node, State, TaskAttempt, TaskState
from jobs.services import tokens
from tests.helpers import hold_vc
from tests.test_metrics import make_node
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


@pytest.fixture
def gpu_nodes():
    """Two ready nodes with GPUs of a type of this test's own: one of 8 CPUs,
    32 GB and two GPUs; one of 4 CPUs, 4 GB and one GPU."""
    kind = f"sku-{uuid.uuid4().hex[:6]}"
    made = [make_node(f"sku-a-{kind}", gpus=[kind, kind], cpus=8, memory_mb=32768),
            make_node(f"sku-b-{kind}", gpus=[kind], cpus=4, memory_mb=4096)]
    yield kind
    Node.objects.filter(pk__in=[node.pk for node in made]).delete()


def test_it_lists_the_sku_types_of_the_cluster_and_of_a_virtual_cluster(alice, gpu_nodes):
    api = _api(alice)
    everywhere = api.get("/api/v2/cluster/sku-types")
    assert everywhere.status_code == 200
    # OpenPAI's resource unit: one GPU of the type with the CPUs and memory
    # (MB) that come with it; here on the smallest node that has that type.
    assert everywhere.json()[gpu_nodes] == {"cpu": 4, "memory": 4096, "gpu": 1}
    assert api.get("/api/v2/cluster/sku-types?vc=default").json()[gpu_nodes] == {"cpu": 4, "memory": 4096, "gpu": 1}
    held = hold_vc(f"hold_{alice.username}", alice)  # no share of the cluster: no GPU of any type
    assert api.get(f"/api/v2/cluster/sku-types?vc={held.name}").json() == {}
    unknown = api.get("/api/v2/cluster/sku-types?vc=nowhere")
    assert unknown.status_code == 404 and unknown.json()["code"] == "NoVirtualClusterError"
    assert "nowhere" in unknown.json()["message"]
    assert api.get("/rest-server/api/v2/cluster/sku-types").json()[gpu_nodes]["gpu"] == 1


def test_a_sku_type_has_at_least_one_cpu_where_gpus_outnumber_cpus(alice):
    # 8 GPUs on 2 CPUs would be 0.25 CPU a GPU; a v2 task role's cpu is a
    # whole number of at least 1, so a unit of 0 would build refused configs.
    kind = f"sku-{uuid.uuid4().hex[:6]}"
    node = make_node(f"sku-c-{kind}", gpus=[kind] * 8, cpus=2, memory_mb=16384)
    try:
        assert _api(alice).get("/api/v2/cluster/sku-types").json()[kind] == {"cpu": 1, "memory": 2048, "gpu": 1}
    finally:
        node.delete()


def test_sku_types_need_a_signed_in_caller_and_leave_out_nodes_not_ready(alice, gpu_nodes):
    assert Client().get("/api/v2/cluster/sku-types").status_code == 401
    Node.objects.filter(name__endswith=gpu_nodes).update(last_heartbeat=timezone.now() - timedelta(days=1))
    assert gpu_nodes not in _api(alice).get("/api/v2/cluster/sku-types").json()


def test_v1_user_entries_say_whether_a_github_token_is_set(alice, bob, admin_user):
    # The portal keeps no GitHub personal access token: always false.
    me = _api(alice).get(f"/api/v1/user/{alice.username}").json()
    assert me["hasGithubPAT"] is False
    listed = _api(admin_user).get("/api/v1/user").json()
    assert listed and all(entry["hasGithubPAT"] is False for entry in listed)
    assert _api(bob).get(f"/api/v1/user/{alice.username}").status_code == 403
    assert Client().get(f"/api/v1/user/{alice.username}").status_code == 401


def test_an_unknown_order_is_ignored_as_openpai_ignores_it(alice):
    now = timezone.now()
    for age, name in ((3, "b_oldest"), (2, "c_middle"), (1, "a_newest")):
        ended_job(alice, name, submitted_at=now - timedelta(minutes=age))
    api = _api(alice)

    def names(order: str) -> list[str]:
        answer = api.get("/api/v2/jobs", {"order": order})
        assert answer.status_code == 200, answer.content
        return [job["name"] for job in answer.json()]

    newest_first = ["a_newest", "c_middle", "b_oldest"]
    assert names("jobName,ASC") == ["a_newest", "b_oldest", "c_middle"]
    for unknown in ("password,ASC", "jobName,SIDEWAYS", "", ",", "x" * 5000):
        assert names(unknown) == newest_first, unknown
