"""Finding 10: names with a trailing newline.

Python's `$` also matches before a final newline, so `"exp\\n"` passed the
name patterns; a download named after such a job then failed with a 500.
Every name is now matched as a whole string, and the submission is refused
with the field's path, through the parser and through the REST API.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client

from jobs.models import Job
from jobs.services import tokens
from jobs.spec import SpecError, parse_job_config

FS = "file://"


def _config(**changes) -> dict:
    role = {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 0, "command": "true",
            "portList": [{"label": "http", "beginAt": 0, "portNumber": 1}]}
    config = {"jobName": "exp", "image": "busybox", "gpuType": "V100", "virtualCluster": "default",
              "jobEnvs": {"MY_VAR": "1"}, "taskRoles": [role]}
    for path, value in changes.items():
        if path == "role":
            role["name"] = value
        elif path == "label":
            role["portList"][0]["label"] = value
        elif path == "env":
            config["jobEnvs"] = {value: "1"}
        else:
            config[path] = value
    return config


@pytest.mark.parametrize("change, field", [
    ({"jobName": "exp\n"}, "jobName"),
    ({"image": "busybox\n"}, "image"),
    ({"gpuType": "V100\n"}, "gpuType"),
    ({"virtualCluster": "default\n"}, "virtualCluster"),
    ({"role": "main\n"}, "taskRoles[0].name"),
    ({"label": "http\n"}, "taskRoles[0].portList[0].label"),
    ({"env": "MY_VAR\n"}, "jobEnvs"),
])
def test_it_refuses_a_trailing_newline_in_every_name(change, field):
    with pytest.raises(SpecError) as caught:
        parse_job_config(json.dumps(_config(**change)), user_name="alice", default_fs_uri=FS)
    assert any(p.path.startswith(field) for p in caught.value.problems), caught.value.problems


def test_it_still_accepts_the_same_names_without_the_newline():
    parsed = parse_job_config(json.dumps(_config()), user_name="alice", default_fs_uri=FS)
    assert parsed.spec.job_name == "exp"


def test_it_answers_the_rest_api_with_a_400_naming_the_field(alice):
    token = tokens.token_create(user=alice, lifetime=timedelta(hours=1), label="newline").key
    client = Client()
    response = client.post(f"/api/v1/user/{alice.username}/jobs", data=json.dumps(_config(jobName="exp\n")),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400, response.content
    assert "jobName" in response.content.decode()
    assert not Job.objects.filter(owner=alice).exists()
