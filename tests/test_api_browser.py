"""The API's pages in a real browser: a token made on the profile page (shown
once) submits a job that then shows in the web UI and runs; revoking the
token in the UI stops it working; the REST API help page's curl commands,
run as printed, get a token and submit a job."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import requests

from jobs.models import Job, State
from tests.browser import login, screenshot
from tests.helpers import config, role, wait_state

pytestmark = [pytest.mark.services, pytest.mark.browser]


def test_a_token_from_the_profile_page_submits_a_job_the_web_ui_shows(page, alice, cluster):
    login(page, alice)
    page.goto("/profile/")
    page.get_by_label("Label").fill("laptop scripts")
    page.get_by_label("Expires after").select_option("7")
    page.get_by_role("button", name="Create token").click()
    shown = page.locator("#new-api-token")
    key = shown.input_value()
    assert key.startswith("pai_")
    screenshot(page, "api-token-created")
    page.reload()
    assert page.locator("#new-api-token").count() == 0  # shown once only
    assert key not in page.content()
    row = page.locator("table.tokens tr", has_text="laptop scripts")
    assert "active" in row.inner_text().lower() and "never" in row.inner_text()  # not used yet

    api = f"{cluster.base_url}/api/v1"
    headers = {"Authorization": f"Bearer {key}"}
    cfg = config("from-token", role(command="echo made through the API"))
    submitted = requests.post(f"{api}/user/{alice.username}/jobs", data=json.dumps(cfg), headers=headers, timeout=30)
    assert submitted.status_code == 202, submitted.text
    job = wait_state(Job.objects.get(owner=alice, name="from-token"), State.SUCCEEDED, State.FAILED)
    assert job.state == State.SUCCEEDED

    page.goto("/")
    page.get_by_role("link", name="from-token").click()
    page.wait_for_url(re.compile(rf"/jobs/{job.pk}/$"))
    page.get_by_text("made through the API").first.wait_for()
    screenshot(page, "api-job-in-web-ui")

    page.goto("/profile/")
    row = page.locator("table.tokens tr", has_text="laptop scripts")
    assert "never" not in row.inner_text()  # it was used
    row.get_by_role("button", name=re.compile("Revoke")).click()
    page.get_by_text("it no longer works").wait_for()
    assert "revoked" in page.locator("table.tokens tr", has_text="laptop scripts").inner_text().lower()
    refused = requests.get(f"{api}/jobs", headers=headers, timeout=30)
    assert refused.status_code == 401 and refused.json()["code"] == "UnauthorizedUserError"


def test_the_api_help_pages_curl_commands_work_as_printed(page, alice, cluster, tmp_path):
    login(page, alice)
    page.goto("/api-help/")
    assert page.locator("#api-base").inner_text() == f"{cluster.base_url}/api/v1"
    screenshot(page, "api-help")
    get_token = page.locator("#curl-token").inner_text().replace("YOUR_PASSWORD", alice.test_password)
    job_json = page.locator("#job-json").inner_text()
    submit = page.locator("#curl-submit").inner_text()
    (tmp_path / "job.json").write_text(job_json)
    script = f"set -e\n{get_token}\ntest -n \"$PAI_TOKEN\"\n{submit}\n"
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"message": "update job hello-api successfully"}
    job = wait_state(Job.objects.get(owner=alice, name="hello-api"), State.SUCCEEDED, State.FAILED)
    assert job.state == State.SUCCEEDED
