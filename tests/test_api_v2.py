"""The REST API v2 over real HTTP, against the test cluster's gunicorn:
protocol v2 submissions that run on a real container, OpenPAI's v2 paths,
filters, tags and attempts, the same owner-only rules as v1, and secrets
that never come back through any read path.

Users: alice (owner), bob (another user), an admin; each test makes its own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from django.test import Client

from jobs.models import Job, LogLine, State, Stream
from jobs.services import job_submit
from tests.helpers import hold_vc, lines, wait_state
from tests.test_api import Api, expect, login

pytestmark = pytest.mark.services

EXAMPLES = Path(__file__).parent / "data" / "examples_v2"
SECRET = "s3cr3t-value-for-tests"
YAML = {"Content-Type": "text/yaml"}


def v2(cluster, user) -> Api:
    """A v2 client with a token from v1's POST /token (the same tokens)."""
    return Api(cluster.base_url, login(cluster.base_url, user).token, prefix="/api/v2")


def hello(name: str, *, vc: str | None = None, command: str = "echo hi") -> str:
    config = yaml.safe_load((EXAMPLES / "hello_secrets.yaml").read_text())
    config["name"] = name
    config["taskRoles"]["main"]["commands"] = [command, "echo <% $secrets.api_key %> > /dev/null"]
    if vc:
        config["defaults"] = {"virtualCluster": vc}
    return yaml.safe_dump(config, sort_keys=False)


def submit_held(user, name: str, vc: str) -> Job:
    """A v2 job that never starts (its virtual cluster has no share)."""
    return job_submit(owner=user, config=hello(name, vc=vc))


def test_a_v2_job_runs_on_a_real_container_and_its_secret_never_comes_back(cluster, alice):
    api = v2(cluster, alice)
    accepted = api.post("/jobs", raw=(EXAMPLES / "hello_secrets.yaml").read_text(), headers=YAML)
    assert expect(accepted, 202) == {"status": 202, "message": "update job hello_v2 successfully"}
    assert accepted.headers["Location"] == f"{api.root}/jobs/{alice.username}~hello_v2"
    job = wait_state(Job.objects.get(owner=alice, name="hello_v2"), State.SUCCEEDED, State.FAILED)
    assert job.state == State.SUCCEEDED, job.exit_reason
    out = list(LogLine.objects.filter(attempt__job=job, stream=Stream.STDOUT).order_by("seq").values_list("text", flat=True))
    assert out == ["hello from v2", "the secret arrived"]  # the node put the secret into the command

    status = expect(api.get(f"/jobs/{alice.username}~hello_v2"), 200)
    assert status["jobStatus"]["state"] == "SUCCEEDED" and status["protocolVersion"] == 2 and status["tags"] == []
    [attempt] = status["jobAttempts"]
    assert attempt["attemptIndex"] == 1 and attempt["isLatest"] and attempt["attemptState"] == "SUCCEEDED"
    assert attempt["taskRoles"]["main"]["taskStatuses"][0]["containerExitCode"] == 0
    assert expect(api.get(f"/jobs/{alice.username}~hello_v2/job-attempts/1"), 200) == attempt

    config = api.get(f"/jobs/{alice.username}~hello_v2/config")
    assert config.status_code == 200 and config.headers["Content-Type"].startswith("text/yaml")
    assert yaml.safe_load(config.text)["secrets"] == {"api_key": "******"}
    assert "# One task that uses a parameter and a secret" in config.text  # as submitted, comments kept

    web = Client()
    web.force_login(alice)
    download = web.get(f"/jobs/{job.pk}/config/submitted/")
    assert download["Content-Disposition"] == 'attachment; filename="hello_v2.yaml"'
    assert download.content.decode() == config.text
    read_back = [
        config.text, json.dumps(status),
        api.get(f"/jobs/{alice.username}~hello_v2/job-attempts").text,
        Api(cluster.base_url, api.token).get(f"/user/{alice.username}/jobs/hello_v2/config").text,
        Api(cluster.base_url, api.token).get(f"/user/{alice.username}/jobs/hello_v2").text,
        web.get(f"/jobs/{job.pk}/").content.decode(),
        web.get(f"/jobs/{job.pk}/config/submitted/").content.decode(),
        web.get(f"/jobs/{job.pk}/config/normalized/").content.decode(),
        job.config_raw, json.dumps(job.config), json.dumps(job.warnings), job.secrets_sealed,
        *LogLine.objects.filter(attempt__job=job).exclude(stream=Stream.STDOUT).values_list("text", flat=True),
    ]
    assert all(SECRET not in text for text in read_back)
    assert "&lt;% $secrets.api_key %&gt;" in read_back[5]  # the page shows the reference, not the value


TWO_IMAGES = """protocolVersion: 2
name: two_images
type: job
prerequisites:
  - {name: busybox, type: dockerimage, uri: pai-local/busybox:latest}
  - {name: debian, type: dockerimage, uri: "pai-local/debian:bookworm"}
taskRoles:
  tools:
    dockerImage: busybox
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands:
      - busybox true
      - if command -v python3; then echo python3 in busybox; else echo busybox ran; fi
  py:
    dockerImage: debian
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands:
      - python3 -c 'print(42)'
      - if command -v busybox; then echo busybox in debian; fi
"""


def test_each_task_role_runs_in_its_own_image_on_a_real_container(cluster, alice):
    api = v2(cluster, alice)
    expect(api.post("/jobs", raw=TWO_IMAGES, headers=YAML), 202)
    job = wait_state(Job.objects.get(owner=alice, name="two_images"), State.SUCCEEDED, State.FAILED, timeout=90)
    assert job.state == State.SUCCEEDED, job.exit_reason
    assert job.spec.image == "pai-local/busybox:latest"  # the first task role's, for the pages
    assert job.config["taskRoles"][1]["roleImage"] == "pai-local/debian:bookworm"
    assert lines(job, role="tools") == ["busybox ran"]
    assert lines(job, role="py") == ["42"]


def test_it_takes_json_of_the_same_structure_and_refuses_a_taken_name(cluster, alice):
    api = v2(cluster, alice)
    hold_vc(f"hold_{alice.username}", alice)
    config = yaml.safe_load(hello("twice", vc=f"hold_{alice.username}"))
    expect(api.post("/jobs", config), 202)
    expect(api.post("/jobs", config), 409, "ConflictJobError")
    assert Job.objects.get(owner=alice, name="twice").config_raw.count(SECRET) == 0


def test_problems_name_their_path_and_place_and_never_a_secret(cluster, alice):
    text = hello("bad").replace("cpu: 1", "cpu: 0").replace("commands:", "commands:\n    - echo <% $nope %>")
    body = expect(v2(cluster, alice).post("/jobs", raw=text, headers=YAML), 400, "InvalidParametersError")
    paths = {p["path"] for p in body["problems"]}
    assert {"taskRoles.main.resourcePerInstance.cpu", "taskRoles.main.commands[0]"} <= paths
    assert all(p["line"] and p["column"] for p in body["problems"])
    broken = f"protocolVersion: 2\nsecrets:\n  pw: \"{SECRET}\n"
    for sent in (text, broken):
        answer = v2(cluster, alice).post("/jobs", raw=sent, headers=YAML)
        assert answer.status_code == 400 and SECRET not in answer.text


def test_it_lists_with_filters_order_paging_and_a_total(cluster, alice, bob, admin_user):
    vc = hold_vc(f"hold_{alice.username}", alice, bob)
    for name in ("list_a", "list_b", "list_c"):
        submit_held(alice, name, vc.name)
    submit_held(bob, "list_bob", vc.name)
    api = v2(cluster, alice)
    for name, tag in (("list_a", "red"), ("list_b", "blue"), ("list_c", "red")):
        expect(api.put(f"/jobs/{alice.username}~{name}/tag", {"value": tag}), 200)

    def names(query: str, client: Api = api) -> list[str]:
        return [job["name"] for job in expect(client.get("/jobs?" + query), 200)]

    assert names(f"vc={vc.name}") == ["list_c", "list_b", "list_a"]  # only her own, newest first
    assert names(f"vc={vc.name}&order=jobName,ASC") == ["list_a", "list_b", "list_c"]
    assert names(f"vc={vc.name}&tagsContain=red") == ["list_c", "list_a"]
    assert names(f"vc={vc.name}&tagsNotContain=red,green") == ["list_b"]
    assert names(f"vc={vc.name}&keyword=LIST_B&state=WAITING") == ["list_b"]
    assert names(f"vc={vc.name}&state=RUNNING") == []
    assert names(f"vc={vc.name}&username={bob.username}") == []
    assert names(f"vc={vc.name}&username={bob.username}", v2(cluster, admin_user)) == ["list_bob"]
    page = expect(api.get(f"/jobs?vc={vc.name}&offset=1&limit=1&withTotalCount=true"), 200)
    assert page["totalCount"] == 3 and [job["name"] for job in page["data"]] == ["list_b"]
    assert page["data"][0]["tags"] == ["blue"] and page["data"][0]["state"] == "WAITING"
    assert names(f"vc={vc.name}&order=password,ASC") == ["list_c", "list_b", "list_a"]  # ignored, as OpenPAI does
    for bad in ("state=NAPPING", "limit=0"):
        expect(api.get("/jobs?" + bad), 400, "InvalidParametersError")


def test_it_adds_and_removes_tags_and_checks_them(cluster, alice):
    vc = hold_vc(f"hold_{alice.username}", alice)
    submit_held(alice, "tagged", vc.name)
    api = v2(cluster, alice)
    path = f"/jobs/{alice.username}~tagged/tag"
    for tag in ("exp-1", "exp-2", "exp-1"):
        expect(api.put(path, {"value": tag}), 200)
    assert expect(api.get(f"/jobs/{alice.username}~tagged"), 200)["tags"] == ["exp-1", "exp-2"]
    expect(api.delete(path, {"value": "exp-1"}), 200)
    assert expect(api.get(f"/jobs/{alice.username}~tagged"), 200)["tags"] == ["exp-2"]
    for bad in ({"value": ""}, {"value": "a,b"}, {"value": "x" * 65}, {"value": 3}, {}):
        expect(api.put(path, bad), 400, "InvalidParametersError")


def test_it_stops_a_job_through_v2(cluster, alice):
    vc = hold_vc(f"hold_{alice.username}", alice)
    job = submit_held(alice, "stopme", vc.name)
    expect(v2(cluster, alice).put(f"/jobs/{alice.username}~stopme/executionType", {"value": "STOP"}), 202)
    assert wait_state(job, State.STOPPED).state == State.STOPPED


def test_every_endpoint_refuses_another_user_and_anonymous_callers(cluster, alice, bob):
    vc = hold_vc(f"hold_{alice.username}", alice)
    submit_held(alice, "private", vc.name)
    job = f"/jobs/{alice.username}~private"
    calls = [("GET", job), ("GET", job + "/config"), ("PUT", job + "/executionType"), ("PUT", job + "/tag"),
             ("DELETE", job + "/tag"), ("GET", job + "/ssh"), ("GET", job + "/ssh/key"), ("GET", job + "/job-attempts"),
             ("GET", job + "/job-attempts/1"), ("GET", job + "/tasks/main/0/log")]
    stranger, anonymous = v2(cluster, bob), Api(cluster.base_url, prefix="/api/v2")
    for method, path in calls:
        body = {"value": "STOP"}
        expect(stranger.call(method, path, body=body), 404, "NoJobError")
        expect(anonymous.call(method, path, body=body), 401, "UnauthorizedUserError")
    for method, path in (("GET", "/jobs"), ("POST", "/jobs")):
        expect(anonymous.call(method, path, body={}), 401, "UnauthorizedUserError")
    assert [j["name"] for j in expect(stranger.get(f"/jobs?username={alice.username}"), 200)] == []
    assert Job.objects.get(owner=alice, name="private").state == State.WAITING  # nobody stopped it


def test_a_missing_attempt_is_not_found(cluster, alice):
    vc = hold_vc(f"hold_{alice.username}", alice)
    submit_held(alice, "waiting", vc.name)
    api = v2(cluster, alice)
    assert expect(api.get(f"/jobs/{alice.username}~waiting/job-attempts"), 200)[0]["attemptIndex"] == 1
    for number in ("2", "x", "0"):
        expect(api.get(f"/jobs/{alice.username}~waiting/job-attempts/{number}"), 404, "NoJobError")


def test_the_user_endpoint_shows_yourself_or_anyone_to_an_admin(cluster, alice, bob, admin_user):
    vc = hold_vc(f"hold_{alice.username}", alice)
    v1 = login(cluster.base_url, alice)
    me = expect(v1.get(f"/user/{alice.username}"), 200)
    assert me["username"] == alice.username and me["admin"] is False
    assert "default" in me["virtualClusters"] and vc.name in me["virtualClusters"]
    expect(v1.get(f"/user/{bob.username}"), 403, "ForbiddenUserError")
    assert expect(login(cluster.base_url, admin_user).get(f"/user/{alice.username}"), 200)["username"] == alice.username
    expect(Api(cluster.base_url).get(f"/user/{alice.username}"), 401, "UnauthorizedUserError")


def test_every_v2_route_is_described_with_its_methods():
    from django.urls import get_resolver

    from jobs.api import openapi_v2

    described = openapi_v2.description()["paths"]
    for pattern in get_resolver("jobs.api.urls_v2").url_patterns:
        if pattern.name == "no_api":
            continue
        regex = pattern.pattern.regex.pattern.removeprefix("^").removesuffix("$").removesuffix("/?")
        path = "/" + re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", regex).replace("\\", "")
        assert path in described, f"route {pattern.name} ({path}) is not described"
        documented = {m.upper() for m in described[path] if m != "parameters"}
        assert documented == set(pattern.callback.api_methods) - {"HEAD"}, path
    served = Client().get("/rest-server/api/v2/openapi.json").json()
    assert served["servers"] == [{"url": "/rest-server/api/v2"}]
