"""What users type where an id, a number or a job's name goes: digits of
other scripts ("²" passes str.isdigit() but not int()), ids too large for a
database integer, and a v2 config sent to v1's PUT, which names the job in
its path. Each is an answer (not found, a message, a 4xx), never a 500.

Through Django's test client, on the test database; no node is needed.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from django.test import Client

from jobs.models import Job, JobTag
from jobs.services import tokens
from tests.test_pages import ended_job, task_attempt

HUGE = "9" * 30
ODD = ["²", "٣", HUGE, "-1", "1.0"]


def _bearer(user) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}"}


def _signed_in(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.mark.parametrize("odd", ODD)
def test_pages_take_odd_numbers_as_no_such_thing(alice, admin_user, odd):
    job = ended_job(alice, f"odd-{abs(hash(odd))}")
    client = _signed_in(alice)
    assert client.get("/", {"q": odd}).status_code == 200
    assert client.get("/", {"q": "#" + odd}).status_code == 200
    assert client.get("/jobs/rows/", {"q": odd}).status_code == 200
    page = client.get(f"/jobs/{job.pk}/", {"attempt": odd})
    assert page.status_code == 200 and page.context["shown_number"] == 1
    assert client.get(f"/jobs/{job.pk}/live/", {"attempt": odd}).status_code == 200
    assert client.get("/submit/", {"clone": odd}).status_code == 404
    stopped = client.post("/jobs/stop/", {"job": [odd]}, follow=True)
    assert stopped.status_code == 200 and "Select the jobs to stop first" in stopped.content.decode()
    assert _signed_in(admin_user).get("/dashboard/", {"hours": odd}).status_code == 200


@pytest.mark.parametrize("odd", ODD)
def test_the_api_takes_odd_numbers_as_no_such_thing(alice, odd):
    job = ended_job(alice, f"api-odd-{abs(hash(odd))}")
    client, auth = Client(raise_request_exception=False), _bearer(alice)
    base_v1 = f"/api/v1/user/{alice.username}/jobs/{job.name}"
    base_v2 = f"/api/v2/jobs/{alice.username}~{job.name}"
    answers = {
        f"{base_v2}/job-attempts/{odd}": "NoJobError",
        f"{base_v1}/tasks/main/{odd}/log": "NoTaskError",
        f"{base_v2}/tasks/main/{odd}/log": "NoTaskError",
        f"{base_v1}/tasks/main/{odd}/metrics": "NoTaskError",
    }
    for path, code in answers.items():
        response = client.get(path, **auth)
        assert response.status_code == 404 and response.json()["code"] == code, (path, response.content)


def _put_v1(user, path_name: str, body: str, content_type: str):
    return Client(raise_request_exception=False).put(
        f"/api/v1/user/{user.username}/jobs/{path_name}", body, content_type=content_type, **_bearer(user))


V2_YAML = """\
protocolVersion: 2
name: {name}
type: job
prerequisites:
  - type: dockerimage
    name: img
    uri: busybox
taskRoles:
  main:
    instances: 1
    dockerImage: img
    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}
    commands: ["echo hi"]
"""


def test_v1_put_holds_a_v2_config_to_the_name_in_its_path(alice):
    refused = _put_v1(alice, "in-path", V2_YAML.format(name="in-yaml"), "text/yaml")
    assert refused.status_code == 400
    assert 'name "in-yaml" in the config differs from "in-path" in the path' in refused.json()["message"]
    assert not Job.objects.filter(owner=alice).exists()

    assert _put_v1(alice, "same-name", V2_YAML.format(name="same-name"), "text/yaml").status_code == 202
    # JSON of the v2 structure may leave the name out, as a v1 config may leave out jobName.
    value = yaml.safe_load(V2_YAML.format(name="x"))
    del value["name"]
    assert _put_v1(alice, "from-path", json.dumps(value), "application/json").status_code == 202
    assert sorted(Job.objects.filter(owner=alice).values_list("name", flat=True)) == ["from-path", "same-name"]


def test_v1_config_of_a_v2_job_is_its_yaml_in_json(alice):
    assert _put_v1(alice, "yaml-job", "# kept as typed\n" + V2_YAML.format(name="yaml-job"), "text/yaml").status_code == 202
    response = Client().get(f"/api/v1/user/{alice.username}/jobs/yaml-job/config", **_bearer(alice))
    assert response.status_code == 200
    config = response.json()
    assert config["protocolVersion"] == 2 and config["name"] == "yaml-job"
    assert config["taskRoles"]["main"]["commands"] == ["echo hi"]


def test_tags_are_changed_by_their_owner_only_through_rest_v2_too(alice, admin_user):
    job = ended_job(alice, "tagged")
    path = f"/api/v2/jobs/{alice.username}~tagged/tag"
    client = Client()
    for method in (client.put, client.delete):
        response = method(path, json.dumps({"value": "x"}), content_type="application/json", **_bearer(admin_user))
        assert response.status_code == 404 and response.json()["code"] == "NoJobError"
    assert not JobTag.objects.filter(job=job).exists()
    assert client.put(path, json.dumps({"value": "mine"}), content_type="application/json",
                      **_bearer(alice)).status_code == 200
    assert client.delete(path, json.dumps({"value": "x"}), content_type="application/json",
                         **_bearer(admin_user)).status_code == 404
    assert list(JobTag.objects.filter(job=job).values_list("value", flat=True)) == ["mine"]
    assert client.get(f"/api/v2/jobs/{alice.username}~tagged", **_bearer(admin_user)).json()["tags"] == ["mine"]


NUL_API_PATHS = ["/api/v1/user/{u}%00/jobs/x", "/api/v1/user/{u}/jobs/x%00", "/api/v2/jobs/{u}~x%00",
                 "/rest-server/api/v2/jobs?keyword=a%00", "/api/v2/jobs?username={u}%00", "/api/v1/jobs?username={u}%00"]
NUL_PAGES = ["/?q=a%00", "/?user=a%00", "/jobs/rows/?q=a%00", "/jobs/{job}/?attempt=1%00", "/storage/?path=a%00"]


def test_a_nul_in_a_path_or_query_is_a_400_before_any_lookup(alice, bob):
    """PostgreSQL cannot compare a string holding NUL: without this, each of
    these was a 500 there (SQLite found nothing)."""
    job = ended_job(alice, "nul-job")
    client = Client(raise_request_exception=False)
    for user, auth in ((alice, _bearer(alice)), (bob, _bearer(bob)), (None, {})):
        for path in NUL_API_PATHS:
            answer = client.get(path.format(u=alice.username), **auth)
            assert answer.status_code == 400, (path, user, answer.status_code)
            assert answer.json()["code"] == "InvalidParametersError" and "NUL" in answer.json()["message"]
    for user in (alice, bob):
        for path in NUL_PAGES:
            assert _signed_in(user).get(path.format(job=job.pk)).status_code == 400, (path, user)
    assert client.get(NUL_PAGES[0]).status_code == 400  # anonymous: refused before the login redirect
    assert client.get(f"/api/v1/user/{alice.username}/jobs/nul-job", **_bearer(alice)).status_code == 200
    assert _signed_in(alice).get("/", {"q": "nul"}).status_code == 200


def test_more_query_parameters_than_django_reads_is_a_400_not_a_500(alice):
    query = "&".join("a" for _ in range(1001))
    client, auth = Client(raise_request_exception=False), _bearer(alice)
    for path in ("/api/v1/jobs", "/api/v2/jobs"):
        answer = client.get(f"{path}?{query}", **auth)
        assert answer.status_code == 400 and "more than 1000 query parameters" in answer.json()["message"], path
    assert client.get(f"/api/v1/jobs?{query}").status_code == 401  # anonymous: no further


def test_a_very_long_keyword_matches_nothing_rather_than_failing(alice):
    ended_job(alice, "kw-long")  # SQLite checks a LIKE pattern only once a row reaches it
    client, auth = Client(raise_request_exception=False), _bearer(alice)
    answer = client.get("/api/v2/jobs", {"keyword": "kw-long" + "x" * 60_000}, **auth)
    assert answer.status_code == 200 and answer.json() == []
    assert [job["name"] for job in client.get("/api/v2/jobs", {"keyword": "kw-long"}, **auth).json()] == ["kw-long"]


@pytest.mark.parametrize("since", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:00"])
def test_a_usage_since_past_the_ends_of_the_calendar_is_a_400(alice, bob, since):
    job = ended_job(alice, f"since-{since[:4]}")
    task_attempt(job)
    client = Client(raise_request_exception=False)
    for path in (f"/api/v1/user/{alice.username}/jobs/{job.name}/tasks/main/0/metrics",
                 f"/api/v2/jobs/{alice.username}~{job.name}/metrics"):
        answer = client.get(path, {"since": since}, **_bearer(alice))
        assert answer.status_code == 400 and "years 1 and 9999" in answer.json()["message"], (path, answer.content)
        assert client.get(path, {"since": since}, **_bearer(bob)).status_code == 404
        assert client.get(path, {"since": since}).status_code == 401


def test_an_api_path_holding_a_newline_is_the_apis_json_404(alice):
    client, auth = Client(raise_request_exception=False), _bearer(alice)
    for path in ("/api/v1/jobs/a%0Ab~x/job-attempts", "/api/v2/no%0Athing", "/rest-server/api/v1/x%0A"):
        answer = client.get(path, **auth)
        assert (answer.status_code, answer["Content-Type"]) == (404, "application/json"), path
        assert answer.json()["code"] == "NoApiError"


@pytest.mark.parametrize("odd", ["١٢", "1_0", " 5", "5 ", "+5", "²"])
def test_numbers_in_api_queries_are_plain_ascii_digits(alice, bob, odd):
    # int() takes digits of other scripts, underscores and spaces; the
    # README says numbers in queries are plain ASCII digits.
    job = ended_job(alice, f"digits-{abs(hash(odd))}")
    path = f"/api/v1/user/{alice.username}/jobs/{job.name}/tasks/main/0/log"
    response = Client(raise_request_exception=False).get(path, {"after": odd}, **_bearer(alice))
    assert response.status_code == 400, response.content
    assert "after must be a whole number" in response.json()["message"]
    assert Client().get(path, {"after": "5"}, **_bearer(bob)).status_code == 404  # another user: not theirs
    assert Client().get(path, {"after": "5"}).status_code == 401
