"""A streaming reader of multipart/form-data bodies, for the storage page's
uploads (jobs/storage/uploads.py).

It takes the body as the pieces the server received and hands a file's
data on as views into those same pieces: no copy of its own, no thread, no
temporary file. Django's parser is push-based (it calls upload handlers),
so storing while receiving needed a thread per file and a queue between
them; with this reader the storage client pulls the data as it sends it.
Profiling a 200 MB upload through Django's parser showed a third of the
worker's CPU in copying (the WSGI body's buffer, the parser's pieces, the
queue) and a tenth in switching between the threads.

Only what browsers and HTTP clients send is accepted (RFC 7578): parts with
a Content-Disposition of form-data and a name; a part with a filename is a
file. The limits are Django's settings for request bodies (the number of
fields and files, the fields' size together), and every refusal says what
was expected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.utils.http import parse_header_parameters

MAX_HEADER_BYTES = 8 * 1024  # one part's headers together
# RFC 2046: 1 to 70 characters; Django accepts up to 200 printable ones.
_BOUNDARY = re.compile(r"^[ -~]{0,199}[!-~]$")
# RFC 2231 parameters (filename*=UTF-8''%e2%82%ac.txt) and the plain name,
# found again only to say which part and parameter a refusal is about.
_ENCODED_PARAM = re.compile(r";\s*([^;=\s]+)\*\s*=")
_NAME_PARAM = re.compile(r';\s*name\s*=\s*(?:"([^"]*)"|([^;\s]*))', re.IGNORECASE)


class MultipartError(ValueError):
    """The body is not the multipart/form-data it says it is, or passes a limit."""


@dataclass(frozen=True)
class Limits:
    max_fields: int | None  # DATA_UPLOAD_MAX_NUMBER_FIELDS (None: no limit)
    max_files: int | None  # DATA_UPLOAD_MAX_NUMBER_FILES
    max_field_bytes: int | None  # DATA_UPLOAD_MAX_MEMORY_SIZE: every field's value together


@dataclass(frozen=True)
class Field:
    name: str
    value: str


@dataclass(frozen=True)
class FilePart:
    """A file: its data must be read (`MultipartReader.data`) or is skipped
    when the next part is asked for."""

    name: str
    filename: str  # its last path part, as Django keeps it
    content_type: str


def boundary_of(content_type: str) -> bytes:
    """The boundary a Content-Type header names, checked."""
    try:
        kind, params = parse_header_parameters(content_type)
    except ValueError as exc:  # boundary*= naming a charset Python does not know
        raise MultipartError(f"the Content-Type header cannot be read ({exc}); expected "
                             'multipart/form-data; boundary="..."') from None
    if kind != "multipart/form-data":
        raise MultipartError(f"the body must be multipart/form-data, not {kind or 'unnamed'}")
    boundary = params.get("boundary", "")
    if not _BOUNDARY.match(boundary):
        raise MultipartError("the Content-Type's boundary must be 1 to 200 printable ASCII characters")
    return boundary.encode("ascii")


class MultipartReader:
    """Iterate for the parts; read a FilePart's data with `data()` before
    asking for the next part (what is left unread is skipped)."""

    def __init__(self, chunks: Iterable[bytes], boundary: bytes, limits: Limits) -> None:
        self._source = iter(chunks)
        self._delimiter = b"\r\n--" + boundary
        self._limits = limits
        # The body opens with "--boundary": with a line break in front, the
        # first delimiter is found like every other one.
        self._buf, self._pos = b"\r\n", 0
        self._in_file = False
        self._done = False
        self._fields = self._files = self._field_bytes = 0

    def __iter__(self) -> Iterator[Field | FilePart]:
        for _ in self._until_delimiter():
            pass  # the preamble, which RFC 2046 says to ignore
        while True:
            if self._in_file:
                for _ in self._until_delimiter():
                    pass  # a file the caller did not read
                self._in_file = False
            if self._closing():
                self._done = True
                for _ in self._source:
                    pass  # the epilogue: ignored, but read, so the connection stays usable
                return
            part = self._part()
            if part is not None:
                yield part

    def data(self) -> Iterator[memoryview]:
        """The current file's data, as views into the received pieces."""
        if not self._in_file:
            return
        yield from self._until_delimiter()
        self._in_file = False

    def _part(self) -> Field | FilePart | None:
        headers = self._headers()
        disposition, params = _parameters(headers.get("content-disposition", ""))
        name = params.get("name")
        if disposition != "form-data" or name is None:
            raise MultipartError('every part needs a header "Content-Disposition: form-data; name=..."')
        if "filename" not in params:
            return self._field(name)
        self._files += 1
        if self._limits.max_files is not None and self._files > self._limits.max_files:
            raise MultipartError(f"at most {self._limits.max_files} files may be sent in one upload")
        self._in_file = True
        filename = params["filename"].replace("\\", "/").rsplit("/", 1)[-1].strip()
        if not filename:
            return None  # a file input left empty: browsers send such a part; Django skips it too
        return FilePart(name=name, filename=filename,
                        content_type=headers.get("content-type", "application/octet-stream"))

    def _field(self, name: str) -> Field:
        self._fields += 1
        if self._limits.max_fields is not None and self._fields > self._limits.max_fields:
            raise MultipartError(f"at most {self._limits.max_fields} form fields may be sent in one request")
        value = bytearray()
        limit = self._limits.max_field_bytes
        for piece in self._until_delimiter():
            self._field_bytes += len(piece)
            if limit is not None and self._field_bytes > limit:
                raise MultipartError(f"the form's fields together are larger than {limit // 1024} KB")
            value += piece
        try:
            return Field(name=name, value=value.decode("utf-8"))
        except UnicodeDecodeError:
            raise MultipartError(f"the field {name!r} is not UTF-8 text") from None

    def _headers(self) -> dict[str, str]:
        """A part's headers (names in lower case). What follows the boundary
        up to the blank line: a line break, then the headers."""
        block = self._read_until(b"\r\n\r\n", MAX_HEADER_BYTES, "a part's headers")
        first, line_break, rest = block.partition(b"\r\n")
        if first.strip(b" \t") or (block and not line_break):
            raise MultipartError("a boundary line must end right after the boundary")
        try:
            text = rest.decode("utf-8")
        except UnicodeDecodeError:
            raise MultipartError("a part's headers must be UTF-8 text") from None
        headers: dict[str, str] = {}
        for line in filter(None, text.split("\r\n")):
            key, colon, value = line.partition(":")
            if not colon or not key.strip():
                raise MultipartError(f"a part's header line must be \"Name: value\", not {line[:80]!r}")
            headers[key.strip().lower()] = value.strip()
        return headers

    def _closing(self) -> bool:
        """After a delimiter: "--" closes the body, anything else opens a part."""
        if not self._ensure(2):
            raise MultipartError("the body ended right after a boundary, without the closing \"--\"")
        return self._buf[self._pos:self._pos + 2] == b"--"

    # Reading the pieces ------------------------------------------------

    def _next(self) -> bool:
        """The next non-empty piece into the buffer; False at the end."""
        for piece in self._source:
            if piece:
                self._buf, self._pos = bytes(piece), 0
                return True
        return False

    def _join_next(self) -> bool:
        """Keep what is left of the buffer and add the next piece to it (a
        delimiter or a header may span two pieces)."""
        left = self._buf[self._pos:]
        if not self._next():
            self._buf, self._pos = left, 0
            return False
        self._buf = left + self._buf
        return True

    def _ensure(self, size: int) -> bool:
        while len(self._buf) - self._pos < size:
            if not self._join_next():
                return False
        return True

    def _until_delimiter(self) -> Iterator[memoryview]:
        """The data up to the next delimiter, which is then passed."""
        delimiter = self._delimiter
        while True:
            if self._pos >= len(self._buf) and not self._next():
                raise MultipartError("the body ended before its closing boundary (the upload was cut short?)")
            buf, pos = self._buf, self._pos
            found = buf.find(delimiter, pos)
            if found >= 0:
                self._pos = found + len(delimiter)
                if found > pos:
                    yield memoryview(buf)[pos:found]
                return
            end = _safe_end(buf, pos, delimiter)
            self._pos = end
            if end > pos:
                yield memoryview(buf)[pos:end]
            if end < len(buf) and not self._join_next():  # the tail might begin a delimiter
                raise MultipartError("the body ended before its closing boundary (the upload was cut short?)")

    def _read_until(self, marker: bytes, limit: int, what: str) -> bytes:
        """Bytes up to `marker` (passed), at most `limit` of them."""
        while True:
            found = self._buf.find(marker, self._pos, self._pos + limit + len(marker))
            if found >= 0:
                text = self._buf[self._pos:found]
                self._pos = found + len(marker)
                return text
            if len(self._buf) - self._pos >= limit + len(marker):
                raise MultipartError(f"{what} are longer than {limit // 1024} KB")
            if not self._join_next():
                raise MultipartError(f"the body ended inside {what}")


def _parameters(disposition: str) -> tuple[str, dict[str, str]]:
    """A part's Content-Disposition and its parameters. An RFC 2231 value
    (filename*=charset'lang'%-encoded) is decoded with the charset it names:
    one Python does not know (ValueError), or a codec that cannot decode the
    bytes (idna, punycode: UnicodeError, a ValueError) is the client's
    mistake, not ours. LookupError too, in case a codec lookup fails later."""
    try:
        return parse_header_parameters(disposition)
    except (ValueError, LookupError) as exc:
        encoded = ", ".join(dict.fromkeys(f"{key}*" for key in _ENCODED_PARAM.findall(disposition))) or "a parameter"
        found = _NAME_PARAM.search(disposition)
        part = f"the field {(found.group(1) or found.group(2))!r}" if found else "a part"
        raise MultipartError(f"{part} has a Content-Disposition whose {encoded} cannot be decoded ({exc}); "
                             "expected filename=\"<name>\" or filename*=UTF-8''<the name's UTF-8 bytes, %-encoded>"
                             ) from None


def _safe_end(buf: bytes, pos: int, delimiter: bytes) -> int:
    """Where the data that cannot be part of a delimiter ends: the start of
    the buffer's shortest tail that could begin one, or its end."""
    start = max(pos, len(buf) - len(delimiter) + 1)
    while (start := buf.find(b"\r", start)) >= 0:
        if delimiter.startswith(buf[start:]):
            return start
        start += 1
    return len(buf)
