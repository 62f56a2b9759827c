"""jobs/storage/multipart.py, the storage page's upload reader: what it reads
from bodies cut into pieces anywhere (a delimiter or a header split between
two socket reads), what it refuses, and that a file's data are views into
the received pieces, not copies."""

from __future__ import annotations

import random

import pytest
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.storage.multipart import Field, FilePart, Limits, MultipartError, MultipartReader, boundary_of

NO_LIMITS = Limits(max_fields=None, max_files=None, max_field_bytes=None)
BOUNDARY_BYTES = BOUNDARY.encode()


def _read(pieces, limits: Limits = NO_LIMITS, boundary: bytes = BOUNDARY_BYTES) -> list[tuple]:
    """What a reader makes of the pieces: fields as (name, value), files as
    (name, filename, content_type, data)."""
    reader = MultipartReader(pieces, boundary, limits)
    out: list[tuple] = []
    for part in reader:
        if isinstance(part, Field):
            out.append((part.name, part.value))
        else:
            out.append((part.name, part.filename, part.content_type, b"".join(reader.data())))
    return out


def _cut(body: bytes, sizes: list[int]) -> list[bytes]:
    pieces, at = [], 0
    for size in sizes:
        pieces.append(body[at:at + size])
        at += size
    return pieces + [body[at:]]


def _body(**data) -> bytes:
    return encode_multipart(BOUNDARY, data)


# The data of a file holds what could be taken for a delimiter's start.
TRICKY = b"\r\n-\r\n--\r\n--" + BOUNDARY_BYTES[:-1] + b"x\r" + b"\r\n--" + BOUNDARY_BYTES[:5]


def _form() -> bytes:
    """A form like the storage page's (files are read by encoding: made afresh each time)."""
    return _body(path="/alice/code", names=["a/b.py", "c.bin"],
                 files=[SimpleUploadedFile("b.py", b"print('hi')\n"), SimpleUploadedFile("c.bin", TRICKY + b"\r")])


EXPECTED = [("path", "/alice/code"), ("names", "a/b.py"), ("names", "c.bin"),
            ("files", "b.py", "text/plain", b"print('hi')\n"),
            ("files", "c.bin", "text/plain", TRICKY + b"\r")]


def test_a_body_django_encodes_reads_back_field_by_field_and_file_by_file():
    assert boundary_of(MULTIPART_CONTENT) == BOUNDARY_BYTES
    assert _read([_form()]) == EXPECTED


def test_the_same_body_cut_at_every_position_and_into_single_bytes_reads_the_same():
    body = _form()
    for at in range(len(body) + 1):
        assert _read([body[:at], body[at:]]) == EXPECTED, at
    assert _read([bytes([b]) for b in body]) == EXPECTED


def test_random_cuts_of_a_big_file_keep_every_byte():
    rng = random.Random(7)
    data = bytes(rng.getrandbits(8) for _ in range(300_000)) + TRICKY
    body = _body(files=SimpleUploadedFile("big.bin", data), path="/p")
    for _ in range(20):
        sizes = [rng.choice([1, 2, 3, 50, 4096, 65536, 100_000]) for _ in range(40)]
        assert _read(_cut(body, sizes)) == [("files", "big.bin", "text/plain", data), ("path", "/p")]


def test_a_files_data_are_views_into_the_received_pieces():
    data = b"x" * 100_000
    body = _body(files=SimpleUploadedFile("v.bin", data))
    start = body.index(data)
    pieces = [body[:start], body[start:start + 60_000], body[start + 60_000:]]
    reader = MultipartReader(pieces, BOUNDARY_BYTES, NO_LIMITS)
    part = next(iter(reader))
    views = list(reader.data())
    assert isinstance(part, FilePart) and b"".join(views) == data
    assert all(isinstance(view, memoryview) for view in views)
    assert views[0].obj is pieces[1]  # no copy of the piece was made


def test_a_file_left_unread_is_skipped_and_an_empty_file_input_is_no_file():
    body = _body(files=[SimpleUploadedFile("one.bin", b"1" * 5000)], path="/x")
    parts = list(MultipartReader([body], BOUNDARY_BYTES, NO_LIMITS))
    assert [type(p).__name__ for p in parts] == ["FilePart", "Field"] and parts[1].value == "/x"
    empty = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"\"\r\n"
             f"Content-Type: application/octet-stream\r\n\r\n\r\n--{BOUNDARY}--\r\n").encode()
    assert _read([empty]) == []


def test_file_names_keep_their_last_part_only():
    body = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"C:\\\\dir\\\\..\\\\x.txt\"\r\n\r\n"
            f"data\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"../../etc/passwd\"\r\n\r\n"
            f"more\r\n--{BOUNDARY}--").encode()
    assert [(p[1], p[3]) for p in _read([body])] == [("x.txt", b"data"), ("passwd", b"more")]


def test_a_preamble_an_epilogue_and_padding_after_a_boundary_are_ignored():
    body = (f"preamble\r\n--{BOUNDARY} \t\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n"
            f"--{BOUNDARY}--\r\nepilogue").encode()
    assert _read([body]) == [("a", "1")]


@pytest.mark.parametrize("body, expected", [
    (b"", "ended before its closing boundary"),
    (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nno end".encode(), "ended before its closing boundary"),
    (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"a\"\r\n".encode(), "ended inside a part's headers"),
    (f"--{BOUNDARY}".encode(), "without the closing"),
    (f"--{BOUNDARY}junk\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--{BOUNDARY}--".encode(),
     "must end right after the boundary"),
    (f"--{BOUNDARY}\r\nContent-Type: text/plain\r\n\r\n1\r\n--{BOUNDARY}--".encode(), "Content-Disposition: form-data"),
    (f"--{BOUNDARY}\r\nContent-Disposition: attachment; name=\"a\"\r\n\r\n1\r\n--{BOUNDARY}--".encode(),
     "Content-Disposition: form-data"),
    (f"--{BOUNDARY}\r\nno colon here\r\n\r\n1\r\n--{BOUNDARY}--".encode(), "\"Name: value\""),
    (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n".encode() + b"\xff\xfe"
     + f"\r\n--{BOUNDARY}--".encode(), "the field 'a' is not UTF-8"),
    (f"--{BOUNDARY}\r\nX-Long: {'h' * 9000}\r\n\r\n1\r\n--{BOUNDARY}--".encode(), "headers are longer than 8 KB"),
])
def test_a_broken_body_is_refused_saying_what_was_expected(body, expected):
    with pytest.raises(MultipartError, match=expected.replace("(", r"\(")):
        _read([body])
    with pytest.raises(MultipartError, match=expected.replace("(", r"\(")):
        _read([bytes([b]) for b in body])  # the same, a byte at a time


def test_headers_without_end_are_refused_once_past_the_limit_not_read_to_the_end():
    endless = iter([f"--{BOUNDARY}\r\nX: ".encode()] + [b"h" * 4096] * 10_000)
    with pytest.raises(MultipartError, match="longer than 8 KB"):
        _read(endless)
    assert len(list(endless)) > 9_000  # it stopped early


@pytest.mark.parametrize("limits, form, expected", [
    (Limits(max_fields=2, max_files=None, max_field_bytes=None), {"a": "1", "b": "2", "c": "3"},
     "at most 2 form fields"),
    (Limits(max_fields=None, max_files=1, max_field_bytes=None),
     {"files": [SimpleUploadedFile("1", b"1"), SimpleUploadedFile("2", b"2")]}, "at most 1 files"),
    (Limits(max_fields=None, max_files=None, max_field_bytes=2048), {"a": "x" * 1500, "b": "y" * 1500},
     "fields together are larger than 2 KB"),
])
def test_djangos_limits_on_fields_and_files_apply(limits, form, expected):
    with pytest.raises(MultipartError, match=expected):
        _read([_body(**form)], limits)
    _read([_body(**form)], NO_LIMITS)  # fine without the limit


@pytest.mark.parametrize("content_type, expected", [
    ("application/x-www-form-urlencoded", "must be multipart/form-data, not application/x-www-form-urlencoded"),
    ("", "not unnamed"),
    ("multipart/form-data", "boundary must be 1 to 200 printable"),
    ("multipart/form-data; boundary=" + "b" * 201, "boundary must be 1 to 200 printable"),
    ("multipart/form-data; boundary=\"ends with space \"", "boundary must be 1 to 200 printable"),
])
def test_the_content_type_must_name_a_usable_boundary(content_type, expected):
    with pytest.raises(MultipartError, match=expected):
        boundary_of(content_type)
