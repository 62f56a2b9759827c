"""A Content-Type Django cannot parse while it builds the request (an RFC
2231 parameter naming an unknown charset) used to be a 500 at any URL,
before any middleware ran. Through the portal's own WSGI handler, as
gunicorn serves it (the test client builds its requests itself)."""

from __future__ import annotations

import io
import json
from wsgiref.util import setup_testing_defaults

import pytest

from jobs.storage.multipart import MultipartError, boundary_of
from portal.handler import PortalWSGIHandler

UNREADABLE = "multipart/form-data; boundary*=zzz''x"


def _call(path: str, content_type: str, body: bytes) -> tuple[str, bytes]:
    environ: dict = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "CONTENT_TYPE": content_type,
                     "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
                     "SERVER_NAME": "127.0.0.1", "HTTP_HOST": "127.0.0.1"}
    setup_testing_defaults(environ)
    status: list[str] = []
    chunks = PortalWSGIHandler()(environ, lambda line, headers, exc_info=None: status.append(line))
    return status[0], b"".join(chunks)


def test_the_api_answers_an_unreadable_content_type_as_a_bad_body(alice):
    status, body = _call("/api/v1/token", UNREADABLE, b"--x--")
    assert status.startswith("400"), (status, body)
    assert json.loads(body)["code"] == "InvalidParametersError"


def test_the_same_request_with_a_readable_content_type_still_works(alice):
    body = json.dumps({"username": alice.username, "password": alice.test_password}).encode()
    status, answer = _call("/api/v1/token", "application/json", body)
    assert status.startswith("200") and json.loads(answer)["token"]


def test_the_upload_reader_names_the_header_it_cannot_read():
    with pytest.raises(MultipartError, match="the Content-Type header cannot be read"):
        boundary_of(UNREADABLE)


@pytest.mark.parametrize("content_type, body, words", [
    ("multipart/form-data", b"username=a&password=b", "multipart/form-data body cannot be read"),
    ("multipart/form-data; boundary=", b"username=a&password=b", "multipart/form-data body cannot be read"),
    ("application/x-www-form-urlencoded", b"a=1&" * 1001, "more than 1000 fields"),
])
def test_a_body_django_refuses_to_read_is_a_400_naming_why(alice, content_type, body, words):
    """Django's own refusals while reading a form (no boundary, too many
    fields) are 400s on pages; the API's catch-all made them 500s."""
    status, answer = _call("/api/v1/token", content_type, body)
    assert status.startswith("400"), (status, answer)
    assert json.loads(answer)["code"] == "InvalidParametersError" and words in json.loads(answer)["message"]
