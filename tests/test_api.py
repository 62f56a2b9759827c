"""The REST API over real HTTP, against the test cluster's gunicorn: OpenPAI's
v1 paths and shapes, token auth, who may see and change what, and jobs that
run on the real engine.

Users: alice (owner), bob (another user), an admin; each test makes its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import timedelta
from typing import Any

import pytest
import requests

from jobs.models import ApiToken, Job, State, TaskAttempt, User, VirtualCluster
from jobs.services import parse_for_user, ratelimit, tokens
from jobs.services.scheduling import ready_nodes
from jobs.spec import SpecError
from tests.cluster import wait_for
from tests.helpers import DEBIAN_IMAGE, config, csrf_token, hold_vc, role, wait_state
from tests.helpers import login as web_login

pytestmark = pytest.mark.services

API = "/api/v1"


class Api:
    """A client of the portal's API, as a script would be."""

    def __init__(self, base_url: str, token: str | None = None, prefix: str = API) -> None:
        self.root = base_url + prefix
        self.token = token
        self.http = requests.Session()

    def call(self, method: str, path: str, *, body: Any = None, raw: bytes | str | None = None,
             headers: dict[str, str] | None = None, **kwargs: Any) -> requests.Response:
        sent = dict(headers or {})
        if self.token and "Authorization" not in sent:
            sent["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            raw = json.dumps(body)
            sent.setdefault("Content-Type", "application/json")
        return self.http.request(method, self.root + path, data=raw, headers=sent, timeout=30, **kwargs)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.call("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> requests.Response:
        return self.call("POST", path, body=body, **kwargs)

    def put(self, path: str, body: Any = None, **kwargs: Any) -> requests.Response:
        return self.call("PUT", path, body=body, **kwargs)

    def delete(self, path: str, body: Any = None, **kwargs: Any) -> requests.Response:
        return self.call("DELETE", path, body=body, **kwargs)


def expect(response: requests.Response, status: int, code: str | None = None) -> Any:
    """The JSON body, after checking the status (and the error code)."""
    assert response.status_code == status, f"{response.request.method} {response.url}: {response.status_code} {response.text[:500]}"
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    if code is not None:
        assert body["code"] == code, body
        assert body["message"]
    return body


def login(base_url: str, user, *, prefix: str = API, expiration: int | None = None) -> Api:
    params: dict[str, Any] = {"username": user.username, "password": user.test_password}
    if expiration is not None:
        params["expiration"] = expiration
    body = expect(Api(base_url, prefix=prefix).post("/token", params), 200)
    assert body["user"] == user.username and body["admin"] is user.is_admin
    return Api(base_url, body["token"], prefix=prefix)


@pytest.fixture
def api(cluster, alice) -> Api:
    return login(cluster.base_url, alice)


# ---------------------------------------------------------------- basics


def test_it_serves_info_on_both_prefixes_and_json_404s_elsewhere(cluster):
    for path in ("/api/v1", "/api/v1/", "/rest-server/api/v1", "/rest-server/api/v1/"):
        body = expect(requests.get(cluster.base_url + path, timeout=10), 200)
        assert body == {"name": "GPU Job Portal REST API", "version": "v1.0.0", "launcherType": "yarn",
                        "authnMethod": "basic"}
    for path in ("/api/v1/nope", "/rest-server/api/v1/user/x/jobs/y/z/w", "/api/v2/nope", "/api/v3/jobs", "/api"):
        expect(requests.get(cluster.base_url + path, timeout=10), 404, "NoApiError")
    described = expect(requests.get(cluster.base_url + "/rest-server/api/v1/openapi.json", timeout=10), 200)
    assert described["servers"] == [{"url": "/rest-server/api/v1"}] and "/user/{username}/jobs" in described["paths"]


def test_every_route_is_described_with_its_methods():
    from django.urls import get_resolver

    from jobs.api import openapi

    described = openapi.description()["paths"]
    routes = {p.name: p for p in get_resolver("jobs.api.urls").url_patterns if p.name != "no_api"}
    for name, pattern in routes.items():
        regex = pattern.pattern.regex.pattern.removeprefix("^").removesuffix("$").removesuffix("/?")
        path = "/" + re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", regex).replace("\\", "")
        assert path in described, f"route {name} ({path}) is not in the OpenAPI description"
        documented = {m.upper() for m in described[path] if m != "parameters"}
        served = set(pattern.callback.api_methods) - {"HEAD"}
        assert documented == served, f"{path}: described {documented}, served {served}"


def test_it_answers_a_wrong_method_with_405_and_allow(cluster, api):
    response = api.call("PATCH", "/jobs")
    expect(response, 405, "MethodNotAllowedError")
    assert response.headers["Allow"] == "GET, HEAD, OPTIONS, POST"  # POST /jobs: a job of one's own


# ------------------------------------------------------------------ tokens


def test_it_issues_tokens_from_json_or_a_form_on_both_prefixes(cluster, alice, admin_user):
    form = requests.post(f"{cluster.base_url}/rest-server/api/v1/token",
                         data={"username": alice.username, "password": alice.test_password, "expiration": "3600"})
    body = expect(form, 200)
    assert body["user"] == alice.username and body["admin"] is False and body["token"].startswith("pai_")
    stored = ApiToken.objects.get(user=alice)
    assert stored.key_hash != body["token"] and body["token"] not in stored.key_hash  # only a hash is kept
    assert timedelta(seconds=3590) < stored.expires_at - stored.created_at <= timedelta(seconds=3600)
    for prefix in ("/api/v1", "/rest-server/api/v1"):
        expect(Api(cluster.base_url, body["token"], prefix).get("/jobs"), 200)
    assert login(cluster.base_url, admin_user).token  # admin: true checked by login()


@pytest.mark.parametrize("expiration", [59, 604801, "soon", True, 3.5])
def test_it_refuses_token_lifetimes_outside_60s_to_7_days(cluster, alice, expiration):
    response = Api(cluster.base_url).post("/token", {"username": alice.username, "password": alice.test_password,
                                                     "expiration": expiration})
    assert "expiration" in expect(response, 400, "InvalidParametersError")["message"]


def test_it_answers_bad_logins_alike_then_rate_limits_them(cluster, alice, settings):
    anonymous = Api(cluster.base_url)
    wrong = expect(anonymous.post("/token", {"username": alice.username, "password": "wrong"}), 400,
                   "IncorrectPasswordError")
    unknown = expect(anonymous.post("/token", {"username": "nobody_" + alice.username, "password": "wrong"}), 400,
                     "IncorrectPasswordError")
    assert wrong["message"] == unknown["message"]  # no telling which usernames exist
    expect(anonymous.post("/token", {"username": alice.username}), 400, "InvalidParametersError")
    try:
        for _ in range(settings.LOGIN_FAILURES_ALLOWED - 1):
            expect(anonymous.post("/token", {"username": alice.username, "password": "wrong"}), 400)
        refused = anonymous.post("/token", {"username": alice.username, "password": alice.test_password})
        expect(refused, 429, "TooManyRequestsError")
        assert 1 <= int(refused.headers["Retry-After"]) <= settings.LOGIN_FAILURE_WINDOW_SECONDS + 1
        # The web login form shares the limit.
        web = requests.Session()
        page = web.get(f"{cluster.base_url}/login/")
        answer = web.post(f"{cluster.base_url}/login/", data={
            "username": alice.username, "password": alice.test_password, "csrfmiddlewaretoken": csrf_token(page.text)},
            headers={"Referer": f"{cluster.base_url}/login/"})
        assert answer.status_code == 200 and "Too many failed logins" in answer.text
        ratelimit.login_reset(username=alice.username, address="127.0.0.1")
        assert login(cluster.base_url, alice).token
    finally:
        ratelimit.login_reset(username=alice.username, address="127.0.0.1")


def test_it_requires_a_valid_token_on_every_endpoint_but_info_and_token(cluster, alice):
    job = f"/user/{alice.username}/jobs/j"
    calls = [("GET", "/jobs"), ("GET", f"/user/{alice.username}/jobs"), ("POST", f"/user/{alice.username}/jobs"),
             ("GET", job), ("PUT", job), ("DELETE", job), ("GET", job + "/config"), ("GET", job + "/ssh"),
             ("GET", job + "/ssh/key"), ("PUT", job + "/executionType"), ("GET", job + "/tasks/main/0/log"),
             ("GET", "/virtual-clusters"), ("GET", "/virtual-clusters/default"), ("GET", "/user"), ("PUT", "/user"),
             ("DELETE", "/user"), ("PUT", f"/user/{alice.username}/virtualClusters")]
    for credentials in ({}, {"Authorization": "Bearer pai_not-a-real-token"}, {"Authorization": "Basic abc"}):
        for method, path in calls:
            response = Api(cluster.base_url).call(method, path, headers=credentials, raw="{}")
            expect(response, 401, "UnauthorizedUserError")
            assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_it_rejects_expired_and_revoked_tokens(cluster, alice):
    short = tokens.token_create(user=alice, lifetime=timedelta(seconds=1), label="short")
    api = Api(cluster.base_url, short.key)
    expect(api.get("/jobs"), 200)
    time.sleep(1.2)
    assert "expired" in expect(api.get("/jobs"), 401, "UnauthorizedUserError")["message"]

    api = login(cluster.base_url, alice)
    expect(api.get("/jobs"), 200)
    token = ApiToken.objects.get(user=alice, label="POST /api/v1/token")
    assert token.last_used_at is not None  # shown on the profile page
    assert tokens.token_revoke(token=token)
    assert "revoked" in expect(api.get("/jobs"), 401, "UnauthorizedUserError")["message"]


def test_remembered_permissions_follow_every_change_at_once(cluster, alice, admin_user):
    """The portal keeps who a token is and who may use a cluster between calls
    (jobs/services/permissions_memo.py); every change, made by another process
    here, must still count from the very next call."""
    vc = hold_vc(f"memo_{alice.username}", alice)
    api, admin = login(cluster.base_url, alice), login(cluster.base_url, admin_user)
    names, vc_name = iter(f"m{n}" for n in range(100)), vc.name

    def submit(status: int, code: str | None = None) -> None:
        expect(api.post(f"/user/{alice.username}/jobs", config(next(names), role(), virtualCluster=vc_name)), status, code)

    submit(202)
    submit(202)  # the same answers again, now remembered
    vc.users.remove(alice)
    submit(403, "ForbiddenUserError")
    vc.users.add(alice)
    submit(202)
    expect(admin.put(f"/user/{alice.username}/virtualClusters", {"virtualClusters": "default"}), 201)
    submit(403, "ForbiddenUserError")
    vc.open_to_all = True
    vc.save()
    submit(202)
    vc.name += "_renamed"
    vc.save()
    submit(404, "NoVirtualClusterError")

    alice.is_active = False
    alice.save()
    assert "disabled" in expect(api.get("/jobs"), 401, "UnauthorizedUserError")["message"]
    alice.is_active = True
    alice.save()
    expect(api.get("/jobs"), 200)
    ApiToken.objects.filter(user=alice).delete()
    expect(api.get("/jobs"), 401, "UnauthorizedUserError")


def test_it_takes_the_browser_session_with_csrf_for_changes(cluster, alice):
    web = web_login(cluster.base_url, alice)
    assert expect(web.get(f"{cluster.base_url}/api/v1/jobs"), 200) == []
    cfg = config("sessionjob", role(command="true"), virtualCluster="default")
    url = f"{cluster.base_url}/api/v1/user/{alice.username}/jobs/sessionjob"
    expect(web.put(url, json=cfg), 403, "ForbiddenUserError")  # no CSRF token: refused
    headers = {"X-CSRFToken": web.cookies["csrftoken"], "Referer": cluster.base_url + "/"}
    expect(web.put(url, json=cfg, headers=headers), 202)


def test_it_opens_cross_origin_access_only_to_configured_origins(cluster, api):
    response = api.get("/jobs", headers={"Origin": "http://evil.example"})
    assert response.status_code == 200 and "Access-Control-Allow-Origin" not in response.headers
    preflight = requests.options(f"{cluster.base_url}/api/v1/jobs", timeout=10, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
    assert preflight.status_code == 204 and "Access-Control-Allow-Origin" not in preflight.headers


# -------------------------------------------------------------------- jobs


def test_a_job_submitted_through_the_api_runs_and_reports_everything(cluster, alice, api):
    text = ('{\n  // comments are fine\n  "jobName": "apijob", "image": "pai-local/busybox:latest",\n'
            '  "taskRoles": [{"name": "main", "taskNumber": 2, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 1,\n'
            '    "portList": [{"label": "http", "beginAt": 0, "portNumber": 2}],\n'
            '    "command": "echo out-$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX; echo err >&2; seq 3"}],\n'
            '  "gpuType": "V100"\n}')
    accepted = api.post(f"/user/{alice.username}/jobs", raw=text, headers={"Content-Type": "application/json"})
    assert expect(accepted, 202) == {"message": "update job apijob successfully"}
    assert accepted.headers["Location"] == f"{api.root}/user/{alice.username}/jobs/apijob"
    job = wait_state(Job.objects.get(owner=alice, name="apijob"), State.SUCCEEDED, State.FAILED)
    assert job.state == State.SUCCEEDED, job.exit_reason

    status = expect(api.get(f"/user/{alice.username}/jobs/apijob"), 200)
    assert status["name"] == "apijob"
    js = status["jobStatus"]
    assert (js["username"], js["state"], js["subState"], js["executionType"], js["retries"]) == (
        alice.username, "SUCCEEDED", "SUCCEEDED", "START", 0)
    assert js["virtualCluster"] == "default" and js["appExitCode"] == 0 and js["appExitType"] == "SUCCEEDED"
    assert js["createdTime"] <= js["appLaunchedTime"] <= js["appCompletedTime"] == js["completedTime"]
    tasks = status["taskRoles"]["main"]
    assert tasks["taskRoleStatus"] == {"name": "main"} and [t["taskIndex"] for t in tasks["taskStatuses"]] == [0, 1]
    for task in tasks["taskStatuses"]:
        attempt = TaskAttempt.objects.get(job=job, task__index=task["taskIndex"])
        assert task["taskState"] == "SUCCEEDED" and task["containerExitCode"] == 0
        assert task["containerId"] == attempt.container_id and task["containerIp"] == "127.0.0.2"
        assert task["containerPorts"]["http"] == ",".join(map(str, attempt.ports["http"]))
        assert task["containerGpus"] == sum(1 << g for g in attempt.gpus) and bin(task["containerGpus"]).count("1") == 1
        log = expect(api.get(task["containerLog"].removeprefix(api.root)), 200)
        assert log["lines"] == [f"out-{task['taskIndex']}", "1", "2", "3"] and log["more"] is False
        assert log["attempt"] == 1 and log["taskState"] == "SUCCEEDED"

    log_url = f"/user/{alice.username}/jobs/apijob/tasks/main/0/log"
    first = expect(api.get(log_url, params={"limit": 2}), 200)
    assert first["lines"] == ["out-0", "1"] and first["more"] is True
    rest = expect(api.get(log_url, params={"after": first["next"]}), 200)
    assert rest["lines"] == ["2", "3"] and rest["more"] is False
    assert expect(api.get(log_url, params={"after": rest["next"]}), 200)["lines"] == []
    assert expect(api.get(log_url, params={"stream": "stderr"}), 200)["lines"] == ["err"]
    expect(api.get(log_url, params={"stream": "syslog"}), 400, "InvalidParametersError")
    expect(api.get(log_url, params={"after": "x"}), 400, "InvalidParametersError")
    expect(api.get(f"/user/{alice.username}/jobs/apijob/tasks/main/7/log"), 404, "NoTaskError")
    expect(api.get(f"/user/{alice.username}/jobs/apijob/tasks/main/0/log", params={"attempt": 2}), 404, "NoTaskError")

    assert expect(api.get(f"/user/{alice.username}/jobs/apijob/config"), 200) == json.loads(
        re.sub(r"//.*", "", text))  # as submitted: no defaults filled in
    listed = expect(api.get("/jobs"), 200)
    assert listed == expect(api.get(f"/user/{alice.username}/jobs"), 200)
    assert listed[0] == {
        "name": "apijob", "username": alice.username, "state": "SUCCEEDED", "subState": "SUCCEEDED",
        "executionType": "START", "retries": 0, "createdTime": js["createdTime"], "completedTime": js["completedTime"],
        "appExitCode": 0, "virtualCluster": "default", "totalGpuNumber": 2, "totalTaskNumber": 2,
        "totalTaskRoleNumber": 1,
    }
    expect(api.get(f"/user/{alice.username}/jobs/apijob/ssh"), 404, "NoJobSshInfoError")  # it has ended
    expect(api.post(f"/user/{alice.username}/jobs", raw=text), 409, "ConflictJobError")
    assert expect(api.delete(f"/user/{alice.username}/jobs/apijob"), 202)["message"] == "deleted job apijob successfully"
    expect(api.get(f"/user/{alice.username}/jobs/apijob"), 404, "NoJobError")
    assert not Job.objects.filter(owner=alice, name="apijob").exists()


def test_it_validates_configs_with_the_web_forms_parser_and_lists_every_problem(cluster, alice, bob, api):
    bad = config("bad name!", role(memory=10, command=""), retryCount=-1)
    body = expect(api.post(f"/user/{alice.username}/jobs", bad), 400, "InvalidParametersError")
    with pytest.raises(SpecError) as parsed:
        parse_for_user(json.dumps(bad), user=alice)
    assert body["message"] == str(parsed.value) and len(parsed.value.problems) >= 4
    for field in ("jobName", "retryCount", "taskRoles[0].memoryMB", "taskRoles[0].command"):
        assert field in body["message"]
    assert [p["path"] for p in body["problems"]] == [p.path for p in parsed.value.problems]
    syntax = expect(api.post(f"/user/{alice.username}/jobs", raw='{"jobName": "x",\n  oops}'), 400,
                    "InvalidParametersError")
    assert "line 2" in syntax["message"]
    expect(api.post(f"/user/{alice.username}/jobs", raw=""), 400, "InvalidParametersError")
    expect(api.post(f"/user/{alice.username}/jobs", raw=b"\xff\xfe"), 400, "InvalidParametersError")
    nowhere = expect(api.post(f"/user/{alice.username}/jobs", config("vcjob", role(), virtualCluster="nowhere")), 404,
                     "NoVirtualClusterError")
    assert "nowhere" in nowhere["message"]
    VirtualCluster.objects.create(name=f"closed_{alice.username}", capacity=0.0)
    expect(api.post(f"/user/{alice.username}/jobs", config("vcjob", role(), virtualCluster=f"closed_{alice.username}")),
           403, "ForbiddenUserError")
    expect(api.post(f"/user/{bob.username}/jobs", config("asbob", role())), 403, "ForbiddenUserError")
    assert not Job.objects.filter(owner__in=[alice, bob]).exists()


def test_it_names_a_put_job_by_its_path(cluster, alice, api):
    vc = hold_vc(f"hold_{alice.username}", alice)
    cfg = config("ignored", role(), virtualCluster=vc.name)
    del cfg["jobName"]
    expect(api.put(f"/user/{alice.username}/jobs/by-path", cfg), 202)
    assert Job.objects.get(owner=alice, name="by-path").config["jobName"] == "by-path"
    expect(api.put(f"/user/{alice.username}/jobs/other", {**cfg, "jobName": "differs"}), 400, "InvalidParametersError")
    expect(api.put(f"/user/{alice.username}/jobs/by-path", cfg), 409, "ConflictJobError")


def test_it_keeps_other_peoples_jobs_out_of_sight(cluster, alice, bob, admin_user, api):
    vc = hold_vc(f"hold_{alice.username}", alice)
    expect(api.post(f"/user/{alice.username}/jobs", config("secret", role(), virtualCluster=vc.name)), 202)
    job = f"/user/{alice.username}/jobs/secret"
    stranger = login(cluster.base_url, bob)
    for method, path in [("GET", job), ("GET", job + "/config"), ("GET", job + "/ssh"), ("GET", job + "/ssh/key"),
                         ("GET", job + "/tasks/main/0/log"), ("PUT", job + "/executionType"), ("DELETE", job)]:
        body = expect(stranger.call(method, path, body={"value": "STOP"}), 404, "NoJobError")
        assert body["message"] == f"Job secret of user {alice.username} is not found."
    assert expect(stranger.get(f"/user/{alice.username}/jobs/nonexistent"), 404, "NoJobError")["message"] == (
        f"Job nonexistent of user {alice.username} is not found.")  # the same words: nothing leaks
    expect(stranger.get(f"/user/{alice.username}/jobs"), 403, "ForbiddenUserError")
    assert expect(stranger.get("/jobs"), 200) == []
    assert expect(stranger.get("/jobs", params={"username": alice.username}), 200) == []
    assert Job.objects.get(owner=alice, name="secret").state == State.WAITING

    admin = login(cluster.base_url, admin_user)
    assert [j["name"] for j in expect(admin.get("/jobs", params={"username": alice.username}), 200)] == ["secret"]
    assert expect(admin.get(f"/user/{alice.username}/jobs"), 200)[0]["name"] == "secret"
    assert expect(admin.get(job + "/config"), 200)["jobName"] == "secret"
    # A waiting job has no key pair yet: it gets one when its first task launches.
    assert expect(admin.get(job + "/ssh"), 404, "NoJobSshInfoError")["message"] == (
        "SSH info of job secret is not found: the job has not started yet.")
    expect(admin.get(job + "/ssh/key"), 404, "NoJobError")
    expect(admin.put(job + "/executionType", {"value": "STOP"}), 202)
    stopped = expect(admin.get(job), 200)["jobStatus"]
    assert (stopped["state"], stopped["executionType"], stopped["subState"]) == ("STOPPED", "STOP", "USER_STOP")
    assert admin_user.username in stopped["appExitDiagnostics"]


def test_it_stops_a_running_job_and_deletes_it_only_when_finished(cluster, alice, api):
    expect(api.post(f"/user/{alice.username}/jobs", config("sleeper", role(command="sleep 300"))), 202)
    job = wait_state(Job.objects.get(owner=alice, name="sleeper"), State.RUNNING)
    path = f"/user/{alice.username}/jobs/sleeper"
    running = expect(api.get(path), 200)
    assert running["jobStatus"]["state"] == "RUNNING" and running["jobStatus"]["subState"] in ("RUNNING", "LAUNCHING")
    expect(api.delete(path), 409, "ConflictJobError")
    expect(api.put(path + "/executionType", {"value": "PAUSE"}), 400, "InvalidParametersError")
    expect(api.put(path + "/executionType", raw="not json"), 400, "InvalidParametersError")
    expect(api.put(path + "/executionType", {"value": "START"}), 202)  # it is started already
    assert expect(api.put(path + "/executionType", {"value": "STOP"}), 202) == {"message": "execute job sleeper successfully"}
    wait_state(job, State.STOPPED, timeout=30)
    expect(api.put(path + "/executionType", {"value": "STOP"}), 202)  # stopping a stopped job is done already
    expect(api.put(path + "/executionType", {"value": "START"}), 400, "InvalidParametersError")
    wait_for(lambda: api.delete(path).status_code == 202, timeout=30, what="the stopped job to be deletable")
    expect(api.post(f"/user/{alice.username}/jobs", config("sleeper", role(command="true"))), 202)  # name is free


def test_it_gives_ssh_details_and_the_key_to_the_owner_only(cluster, alice, bob, admin_user, tmp_path, api):
    expect(api.post(f"/user/{alice.username}/jobs", config("sshjob", role(command="sleep 300"), image=DEBIAN_IMAGE)), 202)
    job = Job.objects.get(owner=alice, name="sshjob")
    wait_for(lambda: TaskAttempt.objects.filter(job=job, ssh_available=True).exists(), timeout=90, what="sshd")
    job.refresh_from_db()  # its key pair was made as its task launched
    info = expect(api.get(f"/user/{alice.username}/jobs/sshjob/ssh"), 200)
    attempt = TaskAttempt.objects.get(job=job)
    admin = login(cluster.base_url, admin_user)
    seen_by_admin = expect(admin.get(f"/user/{alice.username}/jobs/sshjob/ssh"), 200)
    assert seen_by_admin["keyPair"]["privateKeyDirectDownloadLink"] is None  # the key is the owner's alone
    assert seen_by_admin["keyPair"]["publicKey"] == job.ssh_public_key
    expect(admin.get(f"/user/{alice.username}/jobs/sshjob/ssh/key"), 404, "NoJobError")
    assert info["containers"] == [{"id": attempt.container_id, "sshIp": "127.0.0.2",
                                   "sshPort": str(attempt.ports["ssh"][0]), "taskRole": "main", "taskIndex": 0}]
    link = info["keyPair"]["privateKeyDirectDownloadLink"]
    assert link == f"{api.root}/user/{alice.username}/jobs/sshjob/ssh/key"
    assert info["keyPair"]["publicKey"] == job.ssh_public_key
    assert requests.get(link, timeout=10).status_code == 401  # the link itself needs the owner's token
    expect(login(cluster.base_url, bob).get(link.removeprefix(api.root)), 404, "NoJobError")
    key = api.http.get(link, headers={"Authorization": f"Bearer {api.token}"}, timeout=10)
    assert key.status_code == 200 and "OPENSSH PRIVATE KEY" in key.text
    key_file = tmp_path / "job.key"
    key_file.write_text(key.text)
    key_file.chmod(0o600)
    command = ["ssh", "-i", str(key_file), "-p", info["containers"][0]["sshPort"], "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
               f"root@{info['containers'][0]['sshIp']}", "hostname"]
    result = wait_for(lambda: (r := subprocess.run(command, capture_output=True, text=True, timeout=30)).returncode == 0
                      and r, timeout=30, what="ssh with the key from the API")
    assert result.stdout.strip() == "main-0"
    expect(api.put(f"/user/{alice.username}/jobs/sshjob/executionType", {"value": "STOP"}), 202)


def test_it_pages_job_lists_without_breaking_clients_that_do_not(cluster, alice, api):
    vc = hold_vc(f"hold_{alice.username}", alice)
    for name in ("p1", "p2", "p3"):
        expect(api.post(f"/user/{alice.username}/jobs", config(name, role(), virtualCluster=vc.name)), 202)
    assert [j["name"] for j in expect(api.get("/jobs"), 200)] == ["p3", "p2", "p1"]  # newest first, all of them
    page = api.get("/jobs", params={"limit": 2})
    assert [j["name"] for j in expect(page, 200)] == ["p3", "p2"] and page.headers["X-Total-Count"] == "3"
    following = re.fullmatch(r'<(.+)>; rel="next"', page.headers["Link"]).group(1)
    last = api.http.get(following, headers={"Authorization": f"Bearer {api.token}"}, timeout=10)
    assert [j["name"] for j in expect(last, 200)] == ["p1"] and "Link" not in last.headers
    assert [j["name"] for j in expect(api.get(f"/user/{alice.username}/jobs", params={"offset": 1, "limit": 1}), 200)] == ["p2"]
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"limit": "ten"}):
        expect(api.get("/jobs", params=bad), 400, "InvalidParametersError")
    waiting = expect(api.get(f"/user/{alice.username}/jobs/p1"), 200)
    assert waiting["jobStatus"]["state"] == "WAITING" and waiting["jobStatus"]["subState"] == "QUEUED"
    assert waiting["taskRoles"]["main"]["taskStatuses"][0]["taskState"] == "WAITING"


def test_it_reports_virtual_clusters_with_their_use(cluster, alice, api):
    vc = VirtualCluster.objects.create(name=f"vc_{alice.username}", capacity=10.0)
    vc.users.add(alice)
    try:
        expect(api.post(f"/user/{alice.username}/jobs", config("vcrun", role(command="sleep 300", memory=512),
                                                              virtualCluster=vc.name)), 202)
        wait_state(Job.objects.get(owner=alice, name="vcrun"), State.RUNNING)
        everything = expect(api.get("/virtual-clusters"), 200)
        assert {"default", vc.name} <= set(everything)
        mine = expect(api.get(f"/virtual-clusters/{vc.name}"), 200)
        assert mine == everything[vc.name]
        assert (mine["capacity"], mine["numActiveJobs"], mine["numPendingJobs"], mine["numJobs"]) == (10.0, 1, 0, 1)
        assert mine["resourcesUsed"]["vCores"] == 1 and mine["resourcesUsed"]["memory"] == 512
        nodes = ready_nodes()
        cpus = 0.1 * sum(n.cpus for n in nodes)  # 10% of the ready nodes
        assert mine["resourcesTotal"]["vCores"] == pytest.approx(cpus)
        assert mine["resourcesTotal"]["memory"] == pytest.approx(0.1 * sum(n.memory_mb for n in nodes), abs=0.01)
        gpus = {kind: 0.1 * sum(1 for n in nodes for g in n.gpus if g["type"] == kind) for kind in ("TITANX", "V100")}
        assert mine["gpuTypes"] == {kind: {"used": 0, "total": pytest.approx(total)} for kind, total in gpus.items()}
        assert mine["allowed"] is True and everything["default"]["allowed"] is True
        assert mine["usedCapacity"] == pytest.approx(100 * max(1 / cpus, 512 / mine["resourcesTotal"]["memory"]), abs=0.01)
        expect(api.get("/virtual-clusters/nowhere"), 404, "NoVirtualClusterError")
    finally:
        for job in Job.objects.filter(virtual_cluster=vc):
            if not job.is_final:
                expect(api.put(f"/user/{alice.username}/jobs/{job.name}/executionType", {"value": "STOP"}), 202)
            wait_state(job, State.STOPPED, State.SUCCEEDED, State.FAILED, timeout=30)
            wait_for(lambda: api.delete(f"/user/{alice.username}/jobs/{job.name}").status_code == 202, timeout=30,
                     what="the job to be deleted")
        vc.delete()


# ------------------------------------------------------------------- users


def test_admins_manage_users_and_users_only_their_own_password(cluster, alice, admin_user, api):
    admin = login(cluster.base_url, admin_user)
    name = f"new_{alice.username}"
    created = {"username": name, "password": "a-Long-pass-phrase-1", "admin": False, "modify": False}
    expect(api.put("/user", created), 403, "ForbiddenUserError")
    expect(api.get("/user"), 403, "ForbiddenUserError")
    assert expect(admin.put("/user", created), 201) == {"message": "update successfully"}
    expect(admin.put("/user", created), 409, "ConflictUserError")
    expect(admin.put("/user", {**created, "username": "bad-name"}), 400, "InvalidParametersError")
    assert "password" in expect(admin.put("/user", {**created, "username": name + "x", "password": "123"}), 400,
                                "InvalidParametersError")["message"]
    expect(admin.put("/user", {"username": "ghost_" + name, "password": "x-Long-pass-phrase-2", "modify": True}),
           404, "NoUserError")
    expect(admin.put("/user", {**created, "admin": "yes"}), 400, "InvalidParametersError")
    users = {u["username"]: u for u in expect(admin.get("/user"), 200)}

    def usable(username: str) -> str:
        """What OpenPAI's virtualCluster lists: every virtual cluster the
        user may submit to, default first (OpenPAI's SDK splits it)."""
        names = VirtualCluster.objects.usable_by(User.objects.get(username=username)).values_list("name", flat=True)
        return ",".join(sorted(names, key=lambda vc: (vc != "default", vc)))

    assert users[name] == {"username": name, "admin": False, "active": True, "virtualCluster": usable(name),
                           "hasGithubPAT": False}
    assert users[name]["virtualCluster"].split(",")[0] == "default"

    newcomer = Api(cluster.base_url, expect(Api(cluster.base_url).post("/token", {
        "username": name, "password": "a-Long-pass-phrase-1"}), 200)["token"])
    expect(newcomer.put("/user", {"username": name, "password": "b-Long-pass-phrase-3", "modify": True,
                                  "oldPassword": "a-Long-pass-phrase-1"}), 201)
    expect(newcomer.put("/user", {"username": name, "admin": True, "modify": True}), 403, "ForbiddenUserError")
    expect(newcomer.put("/user", {"username": alice.username, "password": "c-Long-pass-phrase-4", "modify": True}),
           403, "ForbiddenUserError")
    expect(Api(cluster.base_url).post("/token", {"username": name, "password": "b-Long-pass-phrase-3"}), 200)

    vc = hold_vc(f"hold_{alice.username}")
    expect(admin.put(f"/user/{name}/virtualClusters", {"virtualClusters": f"{vc.name},default"}), 201)
    users = {u["username"]: u for u in expect(admin.get("/user"), 200)}
    assert users[name]["virtualCluster"] == usable(name) and vc.name in usable(name).split(",")
    expect(newcomer.post(f"/user/{name}/jobs", config("mine", role(), virtualCluster=vc.name)), 202)
    expect(admin.put(f"/user/{name}/virtualClusters", {"virtualClusters": "nowhere"}), 400, "NoVirtualClusterError")
    expect(admin.put(f"/user/{name}/virtualClusters", {"virtualClusters": 7}), 400, "InvalidParametersError")
    expect(admin.put(f"/user/ghost_{name}/virtualClusters", {"virtualClusters": "default"}), 404, "NoUserError")
    expect(api.put(f"/user/{name}/virtualClusters", {"virtualClusters": "default"}), 403, "ForbiddenUserError")

    expect(admin.delete("/user", {"username": admin_user.username}), 403, "RemoveAdminError")
    expect(admin.delete("/user", {"username": name}), 409, "ConflictUserError")  # a job still waits
    expect(newcomer.put(f"/user/{name}/jobs/mine/executionType", {"value": "STOP"}), 202)
    expect(admin.delete("/user", {"username": "ghost_" + name}), 404, "NoUserError")
    expect(admin.delete("/user"), 400, "InvalidParametersError")
    expect(api.delete("/user", {"username": name}), 403, "ForbiddenUserError")
    assert expect(admin.delete("/user", params={"username": name}), 200) == {"message": "remove successfully"}
    expect(newcomer.get("/jobs"), 401, "UnauthorizedUserError")  # its tokens went with it
