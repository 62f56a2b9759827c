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
from tests.test_pages import ended_job

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
