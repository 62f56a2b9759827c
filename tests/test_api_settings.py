"""The API's switches (CORS origins, anonymous read) and its last-resort
error handling, through Django's full request stack in this process, where
settings can be changed per test."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import path

from jobs.api.auth import Access
from jobs.api.http import handler, resource
from jobs import queues
from jobs.models import Job
from jobs.services import job_submit, ratelimit, tokens
from tests.helpers import config, role


@handler(Access.PUBLIC)
def _broken(request):
    raise RuntimeError("a bug")


# Routes for the last test only (pytest.mark.urls points here).
urlpatterns = [path("api/v1/broken", resource(GET=_broken))]


@pytest.fixture
def client() -> Client:
    return Client()


def _streamed(response) -> list:
    """A whole job list, which the API writes as it reads it."""
    assert response.status_code == 200 and response.streaming
    return json.loads(b"".join(response.streaming_content))


def _auth(user) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}"}


def test_it_answers_allowed_origins_only(client, alice, settings):
    settings.CORS_ALLOWED_ORIGINS = ["https://tools.example"]
    allowed = client.get("/api/v1/jobs", HTTP_ORIGIN="https://tools.example", **_auth(alice))
    assert allowed.status_code == 200
    assert allowed["Access-Control-Allow-Origin"] == "https://tools.example" and "Origin" in allowed["Vary"]
    assert "X-Total-Count" in allowed["Access-Control-Expose-Headers"]
    assert "Access-Control-Allow-Credentials" not in allowed  # tokens, never cookies, cross-origin
    preflight = client.options("/api/v1/user/x/jobs", HTTP_ORIGIN="https://tools.example",
                               HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST")
    assert preflight.status_code == 204
    assert preflight["Access-Control-Allow-Methods"] == "GET, HEAD, OPTIONS, POST"
    assert "Authorization" in preflight["Access-Control-Allow-Headers"]
    other = client.get("/api/v1/jobs", HTTP_ORIGIN="https://elsewhere.example", **_auth(alice))
    assert "Access-Control-Allow-Origin" not in other
    settings.CORS_ALLOWED_ORIGINS = ["*"]
    assert client.get("/api/v1", HTTP_ORIGIN="https://any.example")["Access-Control-Allow-Origin"] == "*"


def test_anonymous_read_opens_job_list_and_status_only(client, alice, settings):
    job = job_submit(owner=alice, config=json.dumps(config("public", role())))
    base = f"/api/v1/user/{alice.username}/jobs/{job.name}"
    assert client.get("/api/v1/jobs").status_code == 401  # off by default
    settings.API_ANONYMOUS_READ = True
    assert job.name in [j["name"] for j in _streamed(client.get("/api/v1/jobs"))]
    assert _streamed(client.get(f"/api/v1/user/{alice.username}/jobs"))[0]["name"] == job.name
    assert client.get(base).json()["jobStatus"]["username"] == alice.username
    for closed in (base + "/config", base + "/ssh", base + "/ssh/key", base + "/tasks/main/0/log",
                   "/api/v1/virtual-clusters"):
        response = client.get(closed)
        assert response.status_code == 401 and response.json()["code"] == "UnauthorizedUserError", closed
    stop = client.put(base + "/executionType", json.dumps({"value": "STOP"}), content_type="application/json")
    assert stop.status_code == 401


@pytest.mark.urls("tests.test_api_settings")
def test_an_unexpected_error_is_a_json_500_without_details(client):
    response = client.get("/api/v1/broken")
    assert response.status_code == 500
    assert response.json() == {"code": "UnknownError",
                               "message": "The server failed to handle this request; the error is in the portal's log."}


def test_it_refuses_bodies_over_the_upload_limit(client, alice, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    response = client.post(f"/api/v1/user/{alice.username}/jobs", "x" * 4096, content_type="application/json",
                           **_auth(alice))
    assert response.status_code == 413 and response.json()["code"] == "RequestTooLargeError"


def test_a_job_without_a_stored_config_answers_no_job_config_error(client, alice):
    # Jobs made by the API always keep their config; a row brought in some
    # other way (an import, an old schema) may not, and says so.
    job = job_submit(owner=alice, config=json.dumps(config("legacy", role())))
    type(job).objects.filter(pk=job.pk).update(config_raw="")
    response = client.get(f"/api/v1/user/{alice.username}/jobs/legacy/config", **_auth(alice))
    assert response.status_code == 404 and response.json()["code"] == "NoJobConfigError"


def test_api_submissions_are_limited_per_user_and_the_refusal_says_when_to_retry(client, alice, bob, settings,
                                                                                redis_server):
    settings.API_SUBMISSIONS_PER_MINUTE = 2
    token, other_token = _auth(alice), _auth(alice)
    url = f"/api/v1/user/{alice.username}/jobs"

    def submit(name: str, headers: dict[str, str], to: str = url):
        return client.post(to, json.dumps(config(name, role())), content_type="application/json", **headers)

    assert [submit(f"limited-{i}", token).status_code for i in range(2)] == [202, 202]
    refused = submit("limited-2", token)
    assert refused.status_code == 429 and refused.json()["code"] == "TooManyRequestsError"
    assert f"More than 2 job submissions a minute by {alice.username} (all tokens together)" in refused.json()["message"]
    assert 1 <= int(refused["Retry-After"]) <= 61
    assert not Job.objects.filter(owner=alice, name="limited-2").exists()
    # Another token of hers counts with the first (tokens are free to make);
    # another user's is untouched; no token, no submission.
    assert submit("limited-3", other_token).status_code == 429
    assert submit("bobs", _auth(bob), to=f"/api/v1/user/{bob.username}/jobs").status_code == 202
    assert submit("anonymous", {}).status_code == 401


def test_an_action_count_goes_on_when_redis_forgets_the_counting_script(redis_server):
    who = f"token:{secrets.token_hex(8)}"
    assert [ratelimit.action_wait_seconds(action="test", who=who, limit=2, window=60) for _ in range(2)] == [0, 0]
    queues.connection().script_flush()  # as after a restart of Redis
    assert 1 <= ratelimit.action_wait_seconds(action="test", who=who, limit=2, window=60) <= 61
    assert ratelimit.action_wait_seconds(action="test", who="token:another", limit=2, window=60) == 0


def test_the_whole_job_list_is_written_in_chunks_and_reads_as_one_list(client, alice, bob, make_user, monkeypatch):
    # v1 clients that send no `limit` get every job: written as read, a
    # few at a time, it is the same list as the pages together.
    from jobs.api.views import jobs as v1

    # Jobs that stay WAITING (a GPU type no node has): the test cluster's
    # agents must not change them between the reads compared.
    parked = dict(gpuType="NO-SUCH-GPU")
    names = [job_submit(owner=alice, config=json.dumps(config(f"whole-{i}", role(gpus=1), **parked))).name
             for i in range(5)]
    job_submit(owner=bob, config=json.dumps(config("not-alices", role(gpus=1), **parked)))
    paged = client.get(f"/api/v1/user/{alice.username}/jobs", {"limit": 5}, **_auth(alice)).json()
    for chunk in (1, 2, 5, 10):  # one job a chunk, chunks and a bit, exactly one, less than one
        monkeypatch.setattr(v1, "WHOLE_LIST_CHUNK", chunk)
        whole = _streamed(client.get(f"/api/v1/user/{alice.username}/jobs", **_auth(alice)))
        assert [j["name"] for j in whole] == names[::-1] and whole == paged  # newest first
    nobody = make_user("nojobs")
    assert _streamed(client.get(f"/api/v1/user/{nobody.username}/jobs", **_auth(nobody))) == []
