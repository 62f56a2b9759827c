"""Configs within the size limit that stand for far more: references that
expand a long parameter, thousands of secrets, YAML aliases of long text.
Each must be refused quickly, naming what is too big, without building it,
or storing it with the job; ordinary use of each stays accepted.

Users: alice (owner); each test makes its own.
"""

from __future__ import annotations

import time
import tracemalloc
from datetime import timedelta

import pytest
from django.test import Client

from jobs.models import Job
from jobs.services import tokens
from jobs.spec import SpecError, parse_config_text
from tests.conftest import unique
from tests.helpers import hold_vc


def _v2_with_parameter(parameter: str, command: str) -> str:
    return f"""protocolVersion: 2
name: expanding
type: job
parameters:
{parameter}
prerequisites:
  - name: img
    type: dockerimage
    uri: busybox
taskRoles:
  main:
    instances: 1
    dockerImage: img
    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}
    commands:
      - "{command}"
"""


@pytest.mark.parametrize("parameter, references", [
    ("  p: " + "x" * 100_000, 1000),  # a long value, referenced many times
    ("  s: &s " + "x" * 10_000 + "\n  p: [" + ", ".join(["*s"] * 90) + "]", 50),  # a list of aliases of one
])
def test_it_refuses_commands_that_expand_past_the_limit_without_building_them(parameter, references):
    text = _v2_with_parameter(parameter, "<% $parameters.p %>" * references)
    assert len(text.encode()) < 256 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as refused:
            parse_config_text(text, user_name="alice", default_fs_uri="file:///")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "taskRoles.main.commands" in str(refused.value)
    assert "65536 characters" in str(refused.value)
    assert peak < 30 * 1024 * 1024, f"{peak // 2**20} MB to refuse a config of {len(text) // 1024} KB"


def test_it_refuses_more_secrets_than_the_limit_quickly():
    # Each secret is looked for in every command, message and stretch of the
    # text as it is masked: 1,500 of them took a worker 10 s, 9,000 (within
    # the size limit) many minutes.
    secrets = "\n".join(f"  s{index}: v{index:06d}" for index in range(1500))
    text = _v2_with_parameter("  p: 1", "echo hi").replace("prerequisites:", f"secrets:\n{secrets}\nprerequisites:")
    started = time.monotonic()
    with pytest.raises(SpecError) as refused:
        parse_config_text(text, user_name="alice", default_fs_uri="file:///")
    assert time.monotonic() - started < 3
    assert [(p.path, p.message) for p in refused.value.problems] == [("secrets", "expected at most 100 secrets")]


def test_it_takes_a_hundred_secrets_beside_thousands_of_values():
    secrets = "\n".join(f"  s{index}: abcd{index:04d}" for index in range(100))
    parameters = "\n".join(f"  p{index}: abcdefghijklmnopqrstu{index}" for index in range(6000))
    text = _v2_with_parameter(parameters, "echo <% $secrets.s7 %>").replace(
        "prerequisites:", f"secrets:\n{secrets}\nprerequisites:")
    started = time.monotonic()
    parsed = parse_config_text(text, user_name="alice", default_fs_uri="file:///")
    assert time.monotonic() - started < 3
    assert "abcd0007" not in parsed.raw and parsed.spec.task_roles[0].command == "echo <% $secrets.s7 %>"


def _auth(user) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}"}


def test_it_refuses_a_yaml_config_whose_aliases_stand_for_far_more_text_than_it_holds(alice):
    # 1,000 aliases of one 200 KB string in extras: a 204 KB config whose
    # normalized form, stored with the job and read by every page and
    # scheduling pass, was 200 MB.
    vc = hold_vc(unique("vc"), alice)
    text = _v2_with_parameter("  p: 1", "echo hi").replace("name: expanding", "name: aliased") + (
        f"defaults:\n  virtualCluster: {vc.name}\n"
        "extras:\n  s: &s " + "x" * 200_000 + "\n  big: [" + ", ".join(["*s"] * 999) + "]\n")
    response = Client().post("/api/v2/jobs", text, content_type="text/yaml", **_auth(alice))
    assert response.status_code == 400, response.content[:300]
    answer = response.json()
    assert answer["code"] == "InvalidParametersError"
    assert "aliases" in answer["message"], answer
    assert not Job.objects.filter(owner=alice, name="aliased").exists()


def test_it_takes_aliases_that_repeat_a_few_commands(alice):
    vc = hold_vc(unique("vc"), alice)
    text = f"""protocolVersion: 2
name: repeated
type: job
defaults:
  virtualCluster: {vc.name}
prerequisites:
  - name: img
    type: dockerimage
    uri: busybox
taskRoles:
  first:
    instances: 1
    dockerImage: img
    resourcePerInstance: &resources {{cpu: 1, memoryMB: 256, gpu: 0}}
    commands: &commands
      - echo {"x" * 2000}
  second:
    instances: 1
    dockerImage: img
    resourcePerInstance: *resources
    commands: *commands
"""
    response = Client().post("/api/v2/jobs", text, content_type="text/yaml", **_auth(alice))
    assert response.status_code == 202, response.content[:300]
