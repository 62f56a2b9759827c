"""Found in a review of the browser pages and forms: odd input a hostile
user can send to a page, each an answer rather than a 500, and data kept
out of other users' reach.

Through Django's test client on the session's database; no node is needed.
"""

from __future__ import annotations

import pytest
from django.test import Client

from tests.test_pages import ended_job, task_attempt, waiting_job


def _signed_in(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.mark.parametrize("target", ["jobs", "1e9", "-5", "list"])
def test_bulk_stop_takes_a_next_that_is_no_path_as_no_next(alice, target):
    """`redirect()` reads a bare word as a URL name to reverse: a `next`
    without a slash was a 500 after the jobs were already stopped."""
    job = waiting_job(alice, "bulk-next")
    response = _signed_in(alice).post("/jobs/stop/", {"job": [job.pk], "next": target})
    assert response.status_code == 302 and response["Location"] == "/"
    job.refresh_from_db()
    assert job.is_final or job.state == "STOPPING"


@pytest.mark.parametrize("view", ["", "search/", "download/"])
def test_a_log_url_with_a_job_id_past_64_bits_is_a_404(alice, view):
    """The job's id is matched through the attempt's foreign key, which
    Django hands to SQLite as it is: a 30-digit id overflowed there."""
    job = ended_job(alice, "log-huge-id")
    attempt = task_attempt(job)
    response = _signed_in(alice).get(f"/jobs/{'9' * 30}/logs/{attempt.pk}/stdout/{view}", {"q": "x"})
    assert response.status_code == 404


@pytest.mark.parametrize("target", ["/login/", "/login/?next=/login/", "http://testserver/login/"])
def test_a_signed_in_user_sent_to_the_login_page_with_itself_as_next_lands_on_the_jobs(alice, target):
    """Django's LoginView raises for a `next` that is its own path (a 500)
    and redirects to itself for one with a query (the browser's redirect
    loop); either came from a link anyone can send."""
    response = _signed_in(alice).get("/login/", {"next": target})
    assert response.status_code == 302 and response["Location"] == "/"


def test_a_login_with_the_login_page_as_next_lands_on_the_jobs(alice):
    response = Client().post("/login/", {"username": alice.username, "password": alice.test_password,
                                         "next": "/login/?next=/login/"})
    assert response.status_code == 302 and response["Location"] == "/"


@pytest.mark.parametrize("log", ['1"]', "1\\", "x'y"])
def test_the_log_viewer_is_handed_only_an_attempt_id_from_the_url(alice, log):
    """static/jobs/log_viewer.js looks `data-attempt` up with a CSS selector
    (option[value="..."]): a quote or backslash from `?log=` made it throw,
    and a link could leave a job's log viewer empty."""
    job = ended_job(alice, "log-param")
    task_attempt(job)
    html = _signed_in(alice).get(f"/jobs/{job.pk}/", {"log": log, "stream": "stderr"}).content.decode()
    assert 'data-stream="stderr" data-attempt=""' in html


def test_a_refused_paste_comes_back_in_the_no_script_box_with_its_first_blank_line(alice):
    """An HTML parser drops one line break right after <textarea>: a paste
    starting with a blank line came back a line short, its problems' line
    numbers one off from the box."""
    text = '\n{\n  "jobName": 5\n}'
    html = _signed_in(alice).post("/submit/", {"config": text, "mode": "json"}).content.decode()
    box = html.split('id="id_config"', 1)[1].split(">", 1)[1].split("</textarea>", 1)[0]
    assert box.removeprefix("\n") == text.replace('"', "&quot;")
