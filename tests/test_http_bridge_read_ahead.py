"""portal/http_bridge.py's read-ahead of big request bodies, over real HTTP
against the test cluster's gunicorn: a body several times READ_AHEAD_BYTES
arrives byte for byte (the loop pauses and resumes its reading), and a big
body the view never reads leaves the connection usable."""

from __future__ import annotations

import os
import socket
import time

import pytest
import requests

from jobs import storage
from jobs.storage.base import PARTIAL_PREFIX
from jobs.storage.files import UPLOAD_STAGING
from portal.http_bridge import READ_AHEAD_BYTES
from tests.helpers import login

pytestmark = pytest.mark.services


def _upload(web: requests.Session, base_url: str, folder: str, name: str, data: bytes) -> requests.Response:
    headers = {"X-CSRFToken": web.cookies.get("csrftoken", ""), "Referer": base_url + "/", "Accept": "application/json"}
    return web.post(f"{base_url}/storage/upload/", data={"path": folder, "names": name},
                    files={"files": (name, data)}, headers=headers, timeout=60)


def test_a_body_many_times_the_read_ahead_arrives_whole(cluster, alice):
    web = login(cluster.base_url, alice)
    data = os.urandom(5 * READ_AHEAD_BYTES + 17)
    saved = _upload(web, cluster.base_url, f"/{alice.username}", "ahead.bin", data)
    assert saved.status_code == 200, saved.text
    download = web.get(f"{cluster.base_url}/storage/download/", params={"path": f"/{alice.username}/ahead.bin"},
                       stream=True, timeout=60)
    assert download.status_code == 200
    assert b"".join(download.iter_content(65536)) == data


def test_a_big_body_nobody_reads_leaves_the_connection_usable(cluster, alice, bob):
    data = os.urandom(3 * READ_AHEAD_BYTES)
    anonymous = requests.Session()
    anonymous.trust_env = False
    refused = _upload(anonymous, cluster.base_url, "/", "x.bin", data)
    assert refused.status_code in (302, 403) or "/login/" in refused.url  # the login wall answers, unread
    web = login(cluster.base_url, alice)
    other = _upload(web, cluster.base_url, f"/{bob.username}", "into-bob.bin", data)
    assert other.status_code == 403 and "error" in other.json()  # another user's home: refused
    again = web.get(f"{cluster.base_url}/storage/", params={"path": f"/{alice.username}"}, timeout=30)
    assert again.status_code == 200 and "into-bob.bin" not in again.text


def _partials(alice) -> list[str]:
    """The upload's temporary files in the user's staging folder (local storage)."""
    folder = storage.backend().root / UPLOAD_STAGING.strip("/") / alice.username
    return [p.name for p in folder.glob(PARTIAL_PREFIX + "*")] if folder.is_dir() else []


def _wait_for(condition, what: str) -> None:
    """Polls a condition the server reaches on its own time (bounded)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_client_gone_mid_upload_stores_nothing(cluster, alice):
    """The body ends short (the client closes its connection mid-file): the
    temporary file is removed and no file, not even a cut one, is saved."""
    web = login(cluster.base_url, alice)
    boundary = "----cutoff" + os.urandom(6).hex()
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"path\"\r\n\r\n/{alice.username}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"cut.bin\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    whole = len(head) + 4 * READ_AHEAD_BYTES + len(f"\r\n--{boundary}--\r\n")
    host, port = cluster.base_url.removeprefix("http://").split(":")
    cookies = "; ".join(f"{name}={value}" for name, value in web.cookies.items())
    request = (f"POST /storage/upload/ HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {whole}\r\n"
               f"Content-Type: multipart/form-data; boundary={boundary}\r\nAccept: application/json\r\n"
               f"Cookie: {cookies}\r\nX-CSRFToken: {web.cookies['csrftoken']}\r\nReferer: {cluster.base_url}/\r\n\r\n")
    assert not _partials(alice)
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(request.encode() + head + os.urandom(2 * READ_AHEAD_BYTES))
        _wait_for(lambda: _partials(alice), "the upload to start")  # the view waits for the rest
    _wait_for(lambda: not _partials(alice), "the cut upload to be discarded")
    listing = web.get(f"{cluster.base_url}/storage/", params={"path": f"/{alice.username}"}, timeout=30)
    assert listing.status_code == 200 and "cut.bin" not in listing.text
    assert storage.backend().stat(f"/{alice.username}/cut.bin") is None


def test_a_chunked_upload_without_a_length_arrives_whole(cluster, alice):
    """A client that sends the body chunk-encoded, with no Content-Length
    (Django's own request stream would read it as empty): the upload reader
    takes the pieces the bridge receives until the body ends."""
    web = login(cluster.base_url, alice)
    boundary = "----chunked" + os.urandom(6).hex()
    data = os.urandom(2 * READ_AHEAD_BYTES + 3)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"path\"\r\n\r\n/{alice.username}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"chunked.bin\"\r\n\r\n"
            ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Accept": "application/json",
               "X-CSRFToken": web.cookies["csrftoken"], "Referer": cluster.base_url + "/"}
    pieces = (body[at:at + 100_000] for at in range(0, len(body), 100_000))  # a generator: sent chunked
    saved = web.post(f"{cluster.base_url}/storage/upload/", data=pieces, headers=headers, timeout=60)
    assert saved.status_code == 200, saved.text
    assert saved.json() == {"saved": [f"/{alice.username}/chunked.bin"]}
    download = web.get(f"{cluster.base_url}/storage/download/", params={"path": f"/{alice.username}/chunked.bin"},
                       timeout=60)
    assert download.content == data


def test_a_broken_upload_body_is_refused_with_what_was_expected(cluster, alice):
    web = login(cluster.base_url, alice)
    headers = {"Content-Type": "multipart/form-data; boundary=xyz", "Accept": "application/json",
               "X-CSRFToken": web.cookies["csrftoken"], "Referer": cluster.base_url + "/"}
    broken = web.post(f"{cluster.base_url}/storage/upload/", data=b"--xyz\r\nno header\r\n\r\n" + b"x" * 500_000,
                      headers=headers, timeout=60)
    assert broken.status_code == 400
    assert broken.json()["error"] == ("the upload could not be read: a part's header line must be "
                                      "\"Name: value\", not 'no header'")
    assert not _partials(alice)
