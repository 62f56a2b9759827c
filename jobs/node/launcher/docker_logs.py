"""Docker's log stream read without a thread: the raw bytes of one
`GET /containers/<id>/logs?follow=1&stdout=1&stderr=1&timestamps=1`
response, fed in as they arrive on a non-blocking socket, come out as
(stream, timestamp in ns, payload) entries.

Three layers, each incremental (any byte may arrive split from the next):
the HTTP status line and headers; the body's chunked transfer encoding (the
daemon streams the response without a length); and Docker's multiplexed
frames inside it, an 8-byte header (stream 1 or 2, three zero bytes, the
payload's length as a big-endian uint32) before each payload. With
`timestamps=1` each frame is one log entry that starts with its RFC 3339
timestamp and a space.

Pure: no Docker SDK, no sockets; docker.py owns the connection.
"""

from __future__ import annotations

import re
import socket
import struct
from datetime import datetime, timezone

_TS_RE = re.compile(rb"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z ")
_FRAME_HEADER = struct.Struct(">BxxxI")
# A log entry is at most 16 KB of output plus its timestamp; anything far
# larger is a stream we misread, better stopped than buffered without end.
_MAX_FRAME = 1 << 20


# The last few whole seconds seen, by their text: a busy task prints
# thousands of entries within one second, and building a datetime for each
# would cost more than the rest of the parsing.
_SECONDS_OF: dict[bytes, int] = {}


def parse_log_timestamp(frame: bytes) -> tuple[int, bytes]:
    """Split a `timestamps=true` log frame into (ns since epoch, payload)."""
    # The daemon writes RFC3339NanoFixed: always nine digits after the
    # second, "2026-11-24T08:01:48.636123811Z ". Read that by position.
    if frame[29:31] == b"Z " and frame[19:20] == b".":
        seconds = _SECONDS_OF.get(frame[:19])
        if seconds is not None and frame[20:29].isdigit():
            return seconds * 1_000_000_000 + int(frame[20:29]), frame[31:]
    match = _TS_RE.match(frame)
    if match is None:
        return 0, frame
    whole = frame[:19]
    seconds = _SECONDS_OF.get(whole)
    if seconds is None:
        year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
        seconds = int(datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc).timestamp())
        if len(_SECONDS_OF) > 64:
            _SECONDS_OF.clear()
        _SECONDS_OF[whole] = seconds
    fraction = (match.group(7) or b"0").ljust(9, b"0")
    return seconds * 1_000_000_000 + int(fraction), frame[match.end():]


class LogStreamError(Exception):
    """The engine answered with an error or with bytes we cannot read."""


class LogResponseParser:
    """Feeds on the response's bytes; `feed` returns the complete entries
    so far, `ended` tells the response is over (the container stopped, or
    the engine closed the connection)."""

    def __init__(self) -> None:
        self._buffer = bytearray()  # raw bytes not yet understood
        self._frames = bytearray()  # de-chunked body not yet split into frames
        self._headers_done = False
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still to come
        # The whole second of the last entry read, as its text and in ns: a
        # busy task prints thousands of entries within one second. At first
        # 20 bytes no entry starts with (its 20th byte is the ".").
        self._second: tuple[bytes, int] = (b"\xff" * 20, 0)
        self.ended = False

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        if not data:
            self.ended = True
            return self._entries()
        self._buffer += data
        if not self._headers_done and not self._read_headers():
            return []
        if self._chunked:
            self._dechunk()
        else:
            self._frames += self._buffer
            self._buffer.clear()
        return self._entries()

    def _read_headers(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > 65536:
                raise LogStreamError("the engine sent no end of headers")
            return False
        head = bytes(self._buffer[:end]).decode("latin-1")
        del self._buffer[: end + 4]
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[1] != "200":
            raise LogStreamError(f"the engine answered {status_line!r}")
        headers = {name.strip().lower(): value.strip().lower()
                   for name, _, value in (line.partition(":") for line in header_lines)}
        self._chunked = headers.get("transfer-encoding") == "chunked"
        self._headers_done = True
        return True

    def _dechunk(self) -> None:
        # The daemon flushes every entry as a chunk of its own: walk the
        # buffer with an index and cut what was read once, at the end (a cut
        # per chunk would move the rest of the buffer each time).
        buffer, frames = self._buffer, self._frames
        position, size_of_buffer = 0, len(buffer)
        while position < size_of_buffer:
            if self._chunk_left:
                take = min(self._chunk_left, size_of_buffer - position)
                frames += buffer[position:position + take]
                position += take
                self._chunk_left -= take
                continue
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                break
            line = bytes(buffer[position:line_end]).split(b";", 1)[0].strip()
            position = line_end + 2
            if not line:
                continue  # the CRLF that closes the previous chunk
            try:
                size = int(line, 16)
            except ValueError:
                raise LogStreamError(f"bad chunk size {line[:20]!r}") from None
            if size == 0:
                self.ended = True
                position = size_of_buffer
                break
            self._chunk_left = size
        del buffer[:position]

    def _entries(self) -> list[tuple[int, int, bytes]]:
        if len(self._frames) < _FRAME_HEADER.size:
            return []
        frames = bytes(self._frames)  # slicing bytes makes one copy; a bytearray slice needs a second
        entries: list[tuple[int, int, bytes]] = []
        append, unpack = entries.append, _FRAME_HEADER.unpack_from
        second_text, second_ns = self._second
        start, total, size_of_header = 0, len(frames), _FRAME_HEADER.size
        while total - start >= size_of_header:
            stream, length = unpack(frames, start)
            if length > _MAX_FRAME or stream > 2:
                raise LogStreamError(f"not a multiplexed log frame (stream {stream}, {length} bytes)")
            body = start + size_of_header
            end = body + length
            if end > total:
                break
            start = end
            if stream == 0:
                continue
            # Most entries: the daemon's fixed "2026-11-24T08:01:48.636123811Z "
            # within the second of the one before, read in place (slicing out
            # the frame and its parts first was most of the parsing).
            fixed = length >= 31 and frames[body + 19] == 46 and frames.startswith(b"Z ", body + 29)
            if fixed and frames.startswith(second_text, body):
                fraction = frames[body + 20:body + 29]
                if fraction.isdigit():
                    append((stream, second_ns + int(fraction), frames[body + 31:end]))
                    continue
            ts_ns, payload = parse_log_timestamp(frames[body:end])
            append((stream, ts_ns, payload))
            if fixed and ts_ns:
                second_text, second_ns = frames[body:body + 19], ts_ns - ts_ns % 1_000_000_000
        self._second = (second_text, second_ns)
        if start:
            del self._frames[:start]
        return entries


def logs_request(*, api_version: str, container_id: str, since_ns: int, follow: bool = True,
                 host: str = "docker") -> bytes:
    """The request for both streams from `since_ns` (whole seconds: the
    engine also sends entries at or a little before it; the reader skips
    what it stored), following new ones or only what is there.

    HTTP/1.0: the daemon then sends the body as it comes and closes the
    connection at its end, where HTTP/1.1 would wrap every entry in a chunk
    of its own (the parser reads both)."""
    since = f"&since={since_ns // 1_000_000_000}" if since_ns else ""
    return (f"GET /v{api_version}/containers/{container_id}/logs?follow={int(follow)}&stdout=1&stderr=1&timestamps=1{since} "
            f"HTTP/1.0\r\nHost: {host}\r\n\r\n").encode()


class SocketLogStream:
    """One container's followed log response on a non-blocking socket; the
    node's one log-following thread selects on `fileno()` and calls `read()`
    when it is readable."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._parser = LogResponseParser()
        self.error = ""

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def ended(self) -> bool:
        return self._parser.ended

    def read(self, max_bytes: int = 262144) -> list[tuple[int, int, bytes]]:
        """The entries that arrived; after the last ones `ended` is True.
        A broken connection ends the stream like its orderly end does."""
        try:
            data = self._sock.recv(max_bytes)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        try:
            return self._parser.feed(data)
        except LogStreamError as exc:  # a gone container (404), a log driver that cannot be read ...
            self.error = str(exc)
            self._parser.ended = True
            return []

    def close(self) -> None:
        self._sock.close()
