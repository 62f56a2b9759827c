"""Finding 40: an answer through the web-port proxy outlived its user's
right to it. Every request was checked as it came, and an open WebSocket
every few seconds, but an answer still streaming (server-sent events, a
long download, a log the app tails) went on flowing after the user was
deactivated, changed their password (a stolen session's way out) or lost
admin rights, for as long as the app kept it open.

Now a streaming answer is checked again as a WebSocket is, every
RECHECK_SECONDS, and cut off once its user may no longer use the port."""

from __future__ import annotations

import time

import pytest
import requests
import urllib3

from jobs.webports.forward_http import RECHECK_SECONDS
from tests.helpers import hashed_password, login
from tests.task_hosts import TaskHostClient, follow_to_task_host, running_app

LABEL = "http"
FIRST_LINE = b"first line\n"


@pytest.fixture(scope="module")
def web_task(cluster):
    with running_app("streams", LABEL) as (owner, attempt):
        yield owner, attempt


def _signed_in(cluster, user, attempt) -> TaskHostClient:
    link = f"/jobs/{attempt.job_id}/tasks/{attempt.pk}/ports/{attempt.ports[LABEL][0]}/"
    client, _landing = follow_to_task_host(login(cluster.base_url, user), cluster.base_url, link)
    return client


def _seconds_until_cut(response: requests.Response) -> float:
    """How long the rest of a streaming answer took to end (the app holds
    it for a minute), reading it as it comes."""
    started = time.monotonic()
    rest = b""
    try:
        while chunk := response.raw.read(64, decode_content=False):
            rest += chunk
    except (urllib3.exceptions.HTTPError, requests.RequestException, OSError):
        pass  # cut off mid-answer: what the proxy does
    assert b"last line" not in rest
    return time.monotonic() - started


@pytest.mark.services
@pytest.mark.parametrize("revoke", ["deactivated", "password changed", "admin rights lost"])
def test_it_cuts_a_streaming_answer_off_once_its_user_may_no_longer_have_it(web_task, cluster, make_user, revoke):
    owner, attempt = web_task
    user = make_user("admin", admin=True) if revoke == "admin rights lost" else owner
    client = _signed_in(cluster, user, attempt)
    response = client.get("/stream", stream=True, timeout=30)
    assert response.status_code == 200 and response.raw.read(len(FIRST_LINE)) == FIRST_LINE
    if revoke == "deactivated":
        type(user).objects.filter(pk=user.pk).update(is_active=False)
    elif revoke == "password changed":
        user.set_password("another-password-for-tests")
        user.save(update_fields=["password"])
    else:
        type(user).objects.filter(pk=user.pk).update(is_superuser=False, is_staff=False)
    try:
        assert _seconds_until_cut(response) < RECHECK_SECONDS + 5
    finally:
        response.close()
        type(user).objects.filter(pk=user.pk).update(is_active=True, password=hashed_password(user.test_password))
