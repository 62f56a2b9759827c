"""The REST API as OpenPAI's own clients call it (an audit against OpenPAI's
REST server and SDK): jobs named by their framework name `<user>~<job>`,
POST /jobs as oneself, 202 for a deleted job, OpenPAI's task states, every
usable virtual cluster in a user's `virtualCluster`, and OpenPAI's statuses
for a user or virtual cluster that is not there. Then the paths its web
portal and JS SDK call besides: the login at authn/basic/login, a job's
attempts under v1's /jobs, v2's virtual clusters and users, and a job
stopped with a form-encoded PUT (its jQuery portal's).

In-process, through Django's test client. Users: alice (owner), bob
(another user), an admin; each test makes its own.
"""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from urllib.parse import urlencode

from django.test import Client

from jobs import services
from jobs.models import Job, JobAttempt, JobTag, State, Task, TaskAttempt, TaskState
from jobs.services import ratelimit, tokens
from tests.helpers import config, role

NEVER_FITS_GPUS = 64  # no node has that many: the jobs here wait until they are stopped, whatever agents run
LOGIN_PATHS = ["/api/v1/authn/basic/login", "/rest-server/api/v1/authn/basic/login", "/api/v2/authn/basic/login",
               "/rest-server/api/v2/authn/basic/login"]
FORM = "application/x-www-form-urlencoded"


def _api(user=None) -> Client:
    if user is None:
        return Client()
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}")


def _json(response) -> dict:
    return json.loads(b"".join(response.streaming_content) if response.streaming else response.content)


def _waiting_job(user, name: str) -> Job:
    return services.job_submit(owner=user, config=json.dumps(config(name, role(gpus=NEVER_FITS_GPUS))))


def test_a_job_is_reached_by_its_framework_name_and_submitted_as_oneself(alice, bob, redis_server):
    mine = _api(alice)
    answer = mine.post("/api/v1/jobs", json.dumps(config("a~b.c", role(gpus=NEVER_FITS_GPUS))),
                       content_type="application/json")
    assert answer.status_code == 202, answer.content
    job = Job.objects.get(name="a~b.c")
    assert job.owner == alice and job.state == State.WAITING

    framework = f"/api/v1/jobs/{alice.username}~a~b.c"
    by_user = f"/api/v1/user/{alice.username}/jobs/a~b.c"

    def status(path: str) -> dict:
        # Less the waiting reason, which a scheduling pass (a test cluster's
        # agent) may word anew between the two reads.
        body = _json(mine.get(path))
        body["jobStatus"].pop("appExitDiagnostics")
        return body

    assert status(framework) == status(by_user)
    assert _json(mine.get(framework + "/config")) == _json(mine.get(by_user + "/config"))
    assert mine.get(framework + "/ssh").status_code == mine.get(by_user + "/ssh").status_code

    # Another user and an anonymous client: as on the other path.
    for path in (framework, framework + "/config", framework + "/ssh"):
        assert _json(_api(bob).get(path))["code"] == "NoJobError"
        assert _api().get(path).status_code == 401
    assert _api(bob).put(framework + "/executionType", json.dumps({"value": "STOP"}),
                         content_type="application/json").status_code == 404
    assert _api().post("/api/v1/jobs", json.dumps(config("anon", role(gpus=NEVER_FITS_GPUS))),
                       content_type="application/json").status_code == 401

    stopped = mine.put(framework + "/executionType", json.dumps({"value": "STOP"}), content_type="application/json")
    assert stopped.status_code == 202
    job.refresh_from_db()
    assert job.state == State.STOPPED
    deleted = mine.delete(framework)
    assert deleted.status_code == 202 and _json(deleted)["message"] == "deleted job a~b.c successfully"
    assert not Job.objects.filter(pk=job.pk).exists()


def test_a_task_not_started_yet_is_waiting_as_openpai_names_it(alice, redis_server):
    job = services.job_submit(owner=alice, config=json.dumps(config("starting", role(tasks=2,
                                                                                   gpus=NEVER_FITS_GPUS))))
    attempt = JobAttempt.objects.get(job=job)
    states = (TaskState.ASSIGNED, TaskState.LAUNCHING)
    for task, state in zip(Task.objects.filter(job=job).order_by("index"), states, strict=True):
        TaskAttempt.objects.create(task=task, job_attempt=attempt, job=job, number=1, host_ip="127.0.0.1", state=state)
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING)
    try:
        status = _json(_api(alice).get(f"/api/v1/jobs/{alice.username}~starting"))
        assert [t["taskState"] for t in status["taskRoles"]["main"]["taskStatuses"]] == ["WAITING", "WAITING"]
        assert status["jobStatus"]["subState"] == "LAUNCHING"
        log = _json(_api(alice).get(f"/api/v1/user/{alice.username}/jobs/starting/tasks/main/1/log"))
        assert log["taskState"] == "WAITING"
    finally:  # its tasks would hold the default virtual cluster's CPUs for the tests after
        job.delete()


def test_a_users_virtual_cluster_lists_where_they_may_submit(alice, admin_user):
    from jobs.models import VirtualCluster

    mine = _json(_api(alice).get(f"/api/v1/user/{alice.username}"))
    assert mine["virtualCluster"].split(",")[0] == "default"
    assert sorted(mine["virtualCluster"].split(",")) == sorted(mine["virtualClusters"])
    everyone = {u["username"]: u for u in _json(_api(admin_user).get("/api/v1/user"))}
    assert everyone[alice.username]["virtualCluster"] == mine["virtualCluster"]
    assert sorted(everyone[admin_user.username]["virtualCluster"].split(",")) == sorted(
        VirtualCluster.objects.values_list("name", flat=True))
    # Another user is refused, and an anonymous client.
    assert _api(alice).get(f"/api/v1/user/{admin_user.username}").status_code == 403
    assert _api().get(f"/api/v1/user/{alice.username}").status_code == 401


def test_a_user_or_virtual_cluster_that_is_not_there_gets_openpais_status(alice, admin_user):
    admin = _api(admin_user)
    for method, path, body in (
            ("get", "/api/v1/user/ghost_nobody", None),
            ("put", "/api/v1/user", {"username": "ghost_nobody", "password": "x-Long-pass-phrase-2", "modify": True}),
            ("delete", "/api/v1/user", {"username": "ghost_nobody"}),
            ("put", "/api/v1/user/ghost_nobody/virtualClusters", {"virtualClusters": "default"})):
        answer = getattr(admin, method)(path, json.dumps(body) if body else None, content_type="application/json")
        assert (answer.status_code, _json(answer)["code"]) == (404, "NoUserError"), (method, path, answer.content)
    unknown_vc = admin.put(f"/api/v1/user/{alice.username}/virtualClusters",
                           json.dumps({"virtualClusters": "no_such_vc"}), content_type="application/json")
    assert (unknown_vc.status_code, _json(unknown_vc)["code"]) == (400, "NoVirtualClusterError")
    # Only admins ask: alice is refused, an anonymous client too.
    assert _api(alice).put(f"/api/v1/user/{alice.username}/virtualClusters", json.dumps(
        {"virtualClusters": "default"}), content_type="application/json").status_code == 403
    assert _api().delete("/api/v1/user", json.dumps({"username": "ghost_nobody"}),
                         content_type="application/json").status_code == 401


def test_openpais_login_path_answers_as_post_token_does(alice, admin_user, redis_server):
    # Its web portal sends JSON, its JS SDK v1 a form; v2's SDK uses v2's path.
    for path, user in itertools.product(LOGIN_PATHS, (alice, admin_user)):
        params = {"username": user.username, "password": user.test_password, "expiration": 4000}
        for body, content_type in ((json.dumps(params), "application/json"), (urlencode(params), FORM)):
            answer = Client().post(path, body, content_type=content_type)
            assert answer.status_code == 200, (path, answer.content)
            token = _json(answer)
            assert (token["user"], token["admin"]) == (user.username, user.is_admin) and token["expiresAt"]
            assert Client(HTTP_AUTHORIZATION=f"Bearer {token['token']}").get("/api/v2/jobs").status_code == 200
    # Its errors are /token's.
    for path in ("/api/v1/token", *LOGIN_PATHS):
        wrong = Client().post(path, {"username": alice.username, "password": "wrong"}, content_type="application/json")
        assert (wrong.status_code, _json(wrong)["code"]) == (400, "IncorrectPasswordError"), path
        missing = Client().post(path, {"username": alice.username}, content_type="application/json")
        assert (missing.status_code, _json(missing)["code"]) == (400, "InvalidParametersError"), path
        assert Client().get(path).status_code == 405
    ratelimit.login_reset(username=alice.username, address="127.0.0.1")


def test_openpais_login_path_shares_post_tokens_failed_login_limit(alice, settings, redis_server):
    address = "10.77.0.9"
    client = Client(REMOTE_ADDR=address)
    try:
        for path in itertools.islice(itertools.cycle(LOGIN_PATHS), settings.LOGIN_FAILURES_ALLOWED):
            wrong = client.post(path, urlencode({"username": alice.username, "password": "wrong"}), content_type=FORM)
            assert _json(wrong)["code"] == "IncorrectPasswordError"
        right = urlencode({"username": alice.username, "password": alice.test_password})
        for path in ("/api/v1/token", *LOGIN_PATHS):
            refused = client.post(path, right, content_type=FORM)
            assert (refused.status_code, _json(refused)["code"]) == (429, "TooManyRequestsError"), path
            assert int(refused["Retry-After"]) >= 1
    finally:
        ratelimit.login_reset(username=alice.username, address=address)


def test_a_job_is_stopped_and_tagged_with_form_bodies_as_openpais_jquery_portal_sends_them(alice, bob, redis_server):
    """$.ajax({type: 'PUT', data: {value: 'STOP'}}) sends a form, not JSON;
    Django reads forms of POST requests only."""
    job = _waiting_job(alice, "form_stop")
    charset = FORM + "; charset=UTF-8"
    tag = f"/api/v2/jobs/{alice.username}~form_stop/tag"
    assert _api(alice).put(tag, "value=form+tag", content_type=charset).status_code == 200
    assert list(JobTag.objects.filter(job=job).values_list("value", flat=True)) == ["form tag"]
    assert _api(alice).delete(tag, "value=form+tag", content_type=charset).status_code == 200
    assert not JobTag.objects.filter(job=job).exists()
    stop = f"/api/v1/user/{alice.username}/jobs/form_stop/executionType"
    assert _api(bob).put(stop, "value=STOP", content_type=charset).status_code == 404
    assert _api(alice).put(stop, "value=STOP", content_type=charset).status_code == 202
    job.refresh_from_db()
    assert job.state == State.STOPPED


def test_a_jobs_attempts_are_served_under_v1s_framework_path_as_under_v2s(alice, bob, admin_user, settings,
                                                                         redis_server):
    """OpenPAI mounts its v2 job routes under v1's /jobs too; its web portal
    lists a job's retries from /api/v1/jobs/<user>~<job>/job-attempts."""
    _waiting_job(alice, "v1_attempts")
    v1, v2 = (f"/api/{version}/jobs/{alice.username}~v1_attempts/job-attempts" for version in ("v1", "v2"))
    for user in (alice, admin_user):
        client = _api(user)
        listed = _json(client.get(v1))
        assert [attempt["attemptIndex"] for attempt in listed] == [1] and listed == _json(client.get(v2))
        assert _json(client.get(v1 + "/1")) == listed[0]
        assert client.get(v1 + "/healthz").content == b"ok"
    settings.API_ANONYMOUS_READ = True  # it opens v1's list and status only
    for path in (v1, v1 + "/1", v1 + "/healthz"):
        assert _json(_api(bob).get(path))["code"] == "NoJobError", path
        assert _api().get(path).status_code == 401, path


def test_v2_serves_openpais_virtual_cluster_and_user_reads(alice, bob, admin_user):
    """OpenPAI's JS SDK v2 (its later web portal's) reads them at
    /api/v2/virtual-clusters[/<vc>] and /api/v2/users[/<name>]."""
    mine = _api(alice)
    listed = _json(mine.get("/api/v2/virtual-clusters"))
    assert "default" in listed and listed.keys() == _json(mine.get("/api/v1/virtual-clusters")).keys()
    default = _json(mine.get("/rest-server/api/v2/virtual-clusters/default"))
    assert (default["name"], default["allowed"]) == ("default", True)
    assert _json(mine.get("/api/v2/virtual-clusters/no_such_vc"))["code"] == "NoVirtualClusterError"

    # A user as v1 answers it, but with `virtualCluster` a list, as in v2.
    v1_me = _json(mine.get(f"/api/v1/user/{alice.username}"))
    me = _json(mine.get(f"/api/v2/users/{alice.username}"))
    assert me == {"username": alice.username, "admin": False, "active": True,
                  "virtualCluster": v1_me["virtualCluster"].split(",")}
    assert me["virtualCluster"][0] == "default"
    admin = _api(admin_user)
    assert _json(admin.get(f"/api/v2/users/{alice.username}")) == me
    assert me in _json(admin.get("/api/v2/users"))
    assert _json(admin.get("/api/v2/users/ghost_nobody"))["code"] == "NoUserError"
    # Another user's details and the list are for admins only; GET only.
    assert _json(_api(bob).get(f"/api/v2/users/{alice.username}"))["code"] == "ForbiddenUserError"
    assert _json(mine.get("/api/v2/users"))["code"] == "ForbiddenUserError"
    assert admin.delete(f"/api/v2/users/{alice.username}").status_code == 405
    for path in ("/virtual-clusters", "/virtual-clusters/default", "/users", f"/users/{alice.username}"):
        assert _api().get("/api/v2" + path).status_code == 401, path
