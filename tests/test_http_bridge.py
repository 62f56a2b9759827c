"""portal/http_bridge.py over real HTTP, against the test cluster's gunicorn:
small bodies read ahead and whole responses sent at once, big uploads and
streamed downloads piece by piece, both byte for byte."""

from __future__ import annotations

import json
import os

import pytest

from jobs.models import Job
from portal.http_bridge import PREREAD_BYTES
from tests.helpers import config, login, role
from tests.test_api import expect
from tests.test_api import login as api_login

pytestmark = pytest.mark.services


def padded(body: dict, size: int) -> bytes:
    """`body` as JSON with trailing spaces up to exactly `size` bytes."""
    text = json.dumps(body).encode()
    return text + b" " * (size - len(text))


def test_request_bodies_on_both_sides_of_the_read_ahead_limit_arrive_whole(cluster, alice):
    api = api_login(cluster.base_url, alice)
    at_limit = padded(config("atlimit", role(), virtualCluster="default"), PREREAD_BYTES)
    expect(api.post(f"/user/{alice.username}/jobs", raw=at_limit, headers={"Content-Type": "application/json"}), 202)
    assert Job.objects.get(owner=alice, name="atlimit").config_raw.encode() == at_limit  # stored as sent

    past = padded(config("pastlimit", role(), virtualCluster="default"), PREREAD_BYTES + 1)
    refused = expect(api.post(f"/user/{alice.username}/jobs", raw=past, headers={"Content-Type": "application/json"}),
                     400, "InvalidParametersError")
    assert "the limit is 256 KB" in refused["message"]  # counted from the whole body, read piece by piece


def test_a_big_upload_and_its_streamed_download_keep_every_byte(cluster, alice):
    web = login(cluster.base_url, alice)
    data = os.urandom(3 * PREREAD_BYTES + 17)
    headers = {"X-CSRFToken": web.cookies["csrftoken"], "Referer": cluster.base_url + "/", "Accept": "application/json"}
    saved = web.post(f"{cluster.base_url}/storage/upload/", data={"path": f"/{alice.username}", "names": "big.bin"},
                     files={"files": ("big.bin", data)}, headers=headers, timeout=30)
    assert saved.status_code == 200, saved.text
    download = web.get(f"{cluster.base_url}/storage/download/", params={"path": f"/{alice.username}/big.bin"},
                       stream=True, timeout=30)
    assert download.status_code == 200 and download.headers["Content-Length"] == str(len(data))
    assert b"".join(download.iter_content(65536)) == data


def test_pages_answer_whole_with_their_length(cluster, alice):
    web = login(cluster.base_url, alice)
    page = web.get(f"{cluster.base_url}/", timeout=30)
    assert page.status_code == 200 and page.text.rstrip().endswith("</html>")
    assert page.headers["Content-Length"] == str(len(page.content)) and "Transfer-Encoding" not in page.headers
