"""Bodies that decode but cannot be handled or stored: nesting deep enough to
crash a recursive reader, lone UTF-16 surrogates ("\\ud800" written as an
escape), NUL, raw control characters, and form fields of the wrong type.
Each must get a clear 400-style answer naming what is wrong, through the
real endpoints (the API's JSON error, or Submit Job's problem list), never
a 500 or a stored job whose page then fails.

Users: alice (owner) and an admin; each test makes its own.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from jobs.models import ApiToken, Job, JobTag, NodeJoinToken, State
from jobs.services import job_submit, tokens
from tests.conftest import unique
from tests.helpers import BUSYBOX_IMAGE, config, hold_vc, role

VALIDATE = reverse("jobs:submit_validate")
SUBMIT = reverse("jobs:submit")
DEEP = "[" * 100_000
# Parses with json.loads (under the recursion limit), then trips the writers.
DEEP_BUT_READABLE = "[" * 900 + "]" * 900


def _auth(user) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}"}


def _send(method: str, path: str, body: str, user=None) -> dict:
    """The JSON error the API answers `body` with, after checking it is a 400."""
    headers = _auth(user) if user is not None else {}
    response = Client().generic(method, path, body.encode("utf-8"), content_type="application/json", **headers)
    assert response.status_code == 400, (response.status_code, response.content[:300])
    answer = response.json()
    assert answer["code"] == "InvalidParametersError", answer
    return answer


def _v2(name: str, vc: str, **replace: str) -> str:
    text = f"""protocolVersion: 2
name: {name}
type: job
description: fine
prerequisites:
  - name: busybox
    type: dockerimage
    uri: {BUSYBOX_IMAGE}
taskRoles:
  main:
    instances: 1
    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}
    dockerImage: busybox
    commands:
      - echo one
defaults:
  virtualCluster: {vc}
"""
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    return text


@pytest.fixture
def job(alice):
    return job_submit(owner=alice, config=json.dumps(config(unique("tagged"), role())))


@pytest.fixture
def held_vc(alice):
    return hold_vc(unique("hold"), alice)


# ------------------------------------------------------- API: deep nesting


@pytest.mark.parametrize("body", [DEEP, '{"username": ' + DEEP_BUT_READABLE + "}"])
def test_it_refuses_a_token_request_nested_too_deep(body):
    answer = _send("POST", "/api/v1/token", body)
    assert "nested more than 32 levels" in answer["message"] and "request body" in answer["message"]


def test_it_refuses_a_tag_body_nested_too_deep(alice, job):
    path = f"/api/v2/jobs/{alice.username}~{job.name}/tag"
    for body in (DEEP, '{"value": ' + DEEP_BUT_READABLE + "}"):
        assert "nested more than 32 levels" in _send("PUT", path, body, alice)["message"]
    assert not JobTag.objects.filter(job=job).exists()


def test_it_still_takes_a_body_nested_as_deep_as_a_config_may_be(alice, job):
    path = f"/api/v2/jobs/{alice.username}~{job.name}/tag"
    within = '{"value": ' + "[" * 31 + "]" * 31 + "}"  # 32 levels with the body itself
    answer = _send("PUT", path, within, alice)
    assert "nested" not in answer["message"] and "value" in answer["message"]  # a tag is text, not a list


# --------------------------------------------------- API: lone surrogates


def test_it_refuses_a_lone_surrogate_in_a_token_requests_username_and_label(alice):
    before = ApiToken.objects.count()
    answer = _send("POST", "/api/v1/token", r'{"username": "\ud800", "password": "x"}')
    assert answer["message"].startswith("username: ") and "half of a unicode surrogate pair" in answer["message"]
    body = json.dumps({"username": alice.username, "password": alice.test_password, "label": "x"})
    answer = _send("POST", "/api/v1/token", body.replace('"x"', r'"a\udfffb"'))
    assert answer["message"].startswith("label: ") and "surrogate" in answer["message"]
    assert ApiToken.objects.count() == before


def test_it_takes_a_whole_surrogate_pair_as_the_character_it_stands_for(alice):
    body = json.dumps({"username": alice.username, "password": alice.test_password, "label": "x"})
    response = Client().post("/api/v1/token", body.replace('"x"', r'"\ud83d\ude00"'), content_type="application/json")
    assert response.status_code == 200, response.content
    assert ApiToken.objects.filter(user=alice, label="\U0001F600").exists()


def test_it_refuses_a_lone_surrogate_in_a_tag_and_in_a_key(alice, job):
    path = f"/api/v2/jobs/{alice.username}~{job.name}/tag"
    for method in ("PUT", "DELETE"):
        assert _send(method, path, r'{"value": "\ud800"}', alice)["message"].startswith("value: ")
    answer = _send("PUT", path, r'{"value": "ok", "\udc00": 1}', alice)
    assert answer["message"].startswith("a key in the request body: ")
    assert not JobTag.objects.filter(job=job).exists()


def test_it_refuses_a_lone_surrogate_in_a_webhook_secret_and_a_new_password(alice):
    answer = _send("PUT", f"/api/v1/user/{alice.username}/webhook",
                   r'{"url": "https://hooks.example/x", "secret": "s\ud800"}', alice)
    assert answer["message"].startswith("secret: ")
    answer = _send("PUT", "/api/v1/user", json.dumps({
        "username": alice.username, "modify": True, "oldPassword": alice.test_password, "password": "P",
    }).replace('"P"', r'"new-\ud800-password"'), alice)
    assert answer["message"].startswith("password: ")
    alice.refresh_from_db()
    assert alice.check_password(alice.test_password)


def test_it_refuses_a_lone_surrogate_in_admin_bodies(alice, admin_user):
    answer = _send("PUT", f"/api/v1/user/{alice.username}/virtualClusters", r'{"virtualClusters": ["\ud800"]}',
                   admin_user)
    assert answer["message"].startswith("virtualClusters[0]: ")
    assert _send("DELETE", "/api/v1/user", r'{"username": "\ud800"}', admin_user)["message"].startswith("username: ")
    before = NodeJoinToken.objects.count()
    answer = _send("POST", "/api/v2/node-join-tokens", r'{"label": "\ud800"}', admin_user)
    assert answer["message"].startswith("label: ")
    assert NodeJoinToken.objects.count() == before


def test_it_refuses_nul_in_a_json_body_and_in_a_form(alice):
    answer = _send("POST", "/api/v1/token", r'{"username": "a\u0000", "password": "x"}')
    assert answer["message"] == "username: strings may not contain the NUL character (\\u0000)."
    response = Client().post("/api/v1/token", "username=a%00&password=x",
                             content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400 and response.json()["message"].startswith("username: ")


@pytest.mark.parametrize("content_type, body, words", [
    ("application/x-www-form-urlencoded; charset=latin-1", b"value=STOP", "must be UTF-8 text, not charset=latin-1"),
    ("application/x-www-form-urlencoded; charset=no-such-codec", b"value=STOP", "not charset=no-such-codec"),
    ("application/x-www-form-urlencoded", b"value=ST\xd6P", "not UTF-8 text"),
    ("application/x-www-form-urlencoded", b"value=ST%D6P", "not UTF-8 text"),
    ("application/x-www-form-urlencoded", b"&".join(b"f%d=1" % i for i in range(1001)), "more than 1000 fields"),
])
def test_it_refuses_a_form_body_it_cannot_read_whatever_the_method(alice, job, content_type, body, words):
    """Forms are read for PUT and DELETE too (OpenPAI's jQuery portal stops a
    job with one); text that is not UTF-8 is refused, not guessed at."""
    for method, path in (("POST", "/api/v1/token"),
                         ("PUT", f"/api/v1/user/{alice.username}/jobs/{job.name}/executionType"),
                         ("DELETE", f"/api/v2/jobs/{alice.username}~{job.name}/tag")):
        response = Client().generic(method, path, body, content_type=content_type, **_auth(alice))
        assert response.status_code == 400, (method, response.status_code, response.content[:300])
        assert response.json()["code"] == "InvalidParametersError" and words in response.json()["message"], method
    job.refresh_from_db()
    assert job.state != State.STOPPED


def test_it_refuses_a_form_django_cannot_parse_read_by_a_view_or_by_the_csrf_check(alice):
    """A session's POST form is read by Django's CSRF check first (no
    X-CSRFToken header here), before the view could refuse it itself."""
    session = Client(enforce_csrf_checks=True)
    session.force_login(alice)
    session.cookies["csrftoken"] = "a" * 32
    for client, path, content_type, body, words in (
            (Client(), "/api/v1/token", "multipart/form-data", b"--x--", "Invalid boundary in multipart"),
            (session, "/api/v1/jobs", "application/x-www-form-urlencoded; charset=latin-1", b"value=x", "UTF-8"),
            (session, "/api/v1/jobs", "multipart/form-data", b"--x--", "Invalid boundary in multipart")):
        response = client.post(path, body, content_type=content_type)
        assert response.status_code == 400, (path, response.content[:300])
        message = response.json()["message"]
        assert "body cannot be read: " in message and words in message, message


# ------------------------------------------- API: v2 YAML the reader refuses


@pytest.mark.parametrize("replace, words", [
    ({"- echo one": r'- "echo \ud800"'}, "string holds half of a unicode surrogate pair"),
    ({"description: fine": r'description: "\udfff"'}, "string holds half of a unicode surrogate pair"),
    ({"description: fine": 'description: fine\nsecrets: {a: "\\ud800"}'}, "surrogate pair"),
    ({"description: fine": r'"\ud800": fine'}, "surrogate pair"),
    ({"description: fine": r'description: "a\0b"'}, "strings may not contain the NUL character (\\u0000)"),
    ({"description: fine": "description: a\x01b"}, "unacceptable character #x0001"),
    ({"- echo one": "- echo \x1b[31mred"}, "unacceptable character #x001b"),
    ({"description: fine": "description: a\x7f"}, "unacceptable character #x007f"),
    ({"description: fine": "description: a\ufffe"}, "unacceptable character #xfffe"),
    ({"description: fine": "description: a\x00b"}, "may not contain the NUL character (\\u0000)"),
])
def test_it_refuses_a_v2_config_with_text_it_cannot_keep_and_says_where(alice, held_vc, replace, words):
    name = unique("v2bad")
    text = _v2(name, held_vc.name, **replace)
    answer = _send("POST", "/api/v2/jobs", text, alice)
    [problem] = answer["problems"]
    assert words in problem["message"], problem
    [new] = replace.values()
    bad_line = text.split("\n").index(new.split("\n")[-1]) + 1 if "\n" in new else \
        next(i for i, line in enumerate(text.split("\n"), 1) if line.strip() == new.strip())
    assert problem["line"] == bad_line and problem["column"] >= 1, problem
    assert not Job.objects.filter(owner=alice, name=name).exists()


def test_it_keeps_a_v2_config_with_a_whole_surrogate_pair_as_that_character(alice, held_vc):
    name = unique("v2pair")
    text = _v2(name, held_vc.name, **{"description: fine": r'description: "smile \ud83d\ude00"'})
    response = Client().post("/api/v2/jobs", text, content_type="text/yaml", **_auth(alice))
    assert response.status_code == 202, response.content
    assert Job.objects.get(owner=alice, name=name).config_raw == text
    assert Client(**_auth(alice)).get(f"/api/v2/jobs/{alice.username}~{name}").status_code == 200


# ------------------------------------------------------ Submit Job's pages


def _validate(user, **data: str) -> dict:
    client = Client()
    client.force_login(user)
    response = client.post(VALIDATE, {"config": "", **data})
    assert response.status_code == 200, response.content[:300]
    return response.json()


@pytest.mark.parametrize("replace, path_words", [
    ({"name: NAME": r'name: "\ud800"'}, "surrogate pair"),
    ({"virtualCluster: VC": r'virtualCluster: "\ud800"'}, "surrogate pair"),
    ({"description: fine": 'description: fine\nsecrets: {a: "\\ud800"}'}, "surrogate pair"),
    ({"description: fine": "description: a\x01b"}, "unacceptable character #x0001"),
    ({"description: fine": "description: \ufffe"}, "unacceptable character #xfffe"),
    ({"description: fine": "description: a\x00b"}, "may not contain the NUL character"),
])
def test_the_live_check_and_submit_name_text_a_v2_config_cannot_keep(alice, replace, path_words):
    text = _v2("NAME", "VC", **replace).replace("NAME", unique("v2page")).replace("VC", "default")
    result = _validate(alice, config=text)
    assert result["syntaxOk"] is False
    [problem] = result["problems"]
    assert path_words in problem["message"] and problem["line"] and problem["column"], problem
    client = Client()
    client.force_login(alice)
    before = Job.objects.filter(owner=alice).count()
    response = client.post(SUBMIT, {"config": text, "mode": "json"})
    assert response.status_code == 200
    assert [p.message for p in response.context["check"].problems] == [problem["message"]]
    assert Job.objects.filter(owner=alice).count() == before


@pytest.mark.parametrize("form, words", [
    (DEEP, "nested deeper than 32 levels"),
    (json.dumps({"taskRoles": [], "description": json.loads(DEEP_BUT_READABLE)}), "nested deeper than 32 levels"),
    ('{"taskRoles": [], "jobName": "\\ud800"}', "half of a unicode surrogate pair"),
    ('{"taskRoles": [], "jobName": "a\\u0000"}', "NUL character"),
])
def test_the_live_check_refuses_form_fields_it_cannot_read(alice, form, words):
    [problem] = _validate(alice, form=form)["problems"]
    assert "form fields that do not read as JSON" in problem["message"] and words in problem["message"], problem
    assert "line 1, column" in problem["message"]


@pytest.mark.parametrize("form, field", [
    ({"taskRoles": [], "extras": 5}, "extras (not an object)"),
    ({"taskRoles": [], "extras": [1]}, "extras (not an object)"),
    ({"taskRoles": [], "extras": "abc"}, "extras (not an object)"),
    ({"taskRoles": [{"name": 5, "command": "x"}]}, "taskRoles[0].name (not a string)"),
    ({"taskRoles": [{"name": ["a"], "command": "x"}]}, "taskRoles[0].name (not a string)"),
    ({"taskRoles": [{"command": "x"}]}, "taskRoles[0].name (missing)"),
    ({"taskRoles": [{"name": "a", "command": ["x"]}]}, "taskRoles[0].command (not a string)"),
    ({"taskRoles": [{"name": "a", "portList": 5}]}, "taskRoles[0].portList (not a list of objects)"),
    ({"taskRoles": [{"name": "a"}, {"name": "a"}]}, 'taskRoles[1].name (a second task role named "a")'),
])
def test_the_live_check_names_a_form_field_of_the_wrong_type(alice, form, field):
    result = _validate(alice, form=json.dumps(form))
    [problem] = result["problems"]
    assert field in problem["message"], problem
    assert "did not arrive as JSON" not in problem["message"]


def test_the_live_check_of_a_v1_config_with_extras_of_the_wrong_type_says_so(alice):
    text = json.dumps(config(unique("v1extras"), role(), extras=5))
    result = _validate(alice, config=text)
    assert result["syntaxOk"] is True and result["otherText"] is None
    assert "extras (not an object)" in result["otherNote"]
    assert any(p["path"] == "extras" for p in result["problems"]), result["problems"]
