"""portal/http_bridge.py's streamed responses under a real uvicorn: a client
that goes away, or stops reading, lets go of the view's thread at once (the
response is closed: a stream slot freed, a file or HDFS read ended), not
after the view has made the whole response for no one."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from portal import http_bridge
from portal.http_bridge import ThreadedWSGI
from portal.http_protocol import PortalHttpToolsProtocol
from tests.cluster import free_port

PARTS = 500


class _SlowBody:
    """A streamed body of PARTS parts, `pause` seconds apart, that records
    how many parts were made and when it was closed."""

    def __init__(self, part: bytes, pause: float) -> None:
        self.part, self.pause = part, pause
        self.made = 0
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        while self.made < PARTS and not self.closed.is_set():
            self.made += 1
            yield self.part
            time.sleep(self.pause)

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def serve():
    """Start uvicorn on loopback with ThreadedWSGI over a WSGI app that
    answers every request with `body`; yields a function taking the body
    and returning the port."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(body: _SlowBody, headers: list[tuple[str, str]] | None = None) -> int:
        def app(environ, start_response):
            start_response("200 OK", [("Content-Type", "application/octet-stream"), *(headers or [])])
            return body  # no `streaming` attribute: sent piece by piece, as Django's streaming responses

        port = free_port()
        server = uvicorn.Server(uvicorn.Config(ThreadedWSGI(app, workers=2), host="127.0.0.1", port=port,
                                               lifespan="off", log_level="critical", http=PortalHttpToolsProtocol))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        servers.append((server, thread))
        return port

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def _get(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(b"GET /download HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return client


def test_a_client_gone_mid_download_closes_the_response_at_once(serve):
    body = _SlowBody(b"x" * 1024, pause=0.02)  # 10 s for the whole response
    client = _get(serve(body))
    assert client.recv(4096).startswith(b"HTTP/1.1 200")
    client.close()
    assert body.closed.wait(timeout=3), "the response was not closed when its client went away"
    assert body.made < PARTS / 2


def _connections_to(port: int) -> list[str]:
    """The server's end of each established connection on `port`."""
    shown = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"], capture_output=True,
                           text=True, check=True).stdout
    return [line for line in shown.splitlines() if line.strip()]


def test_a_client_that_reads_nothing_is_let_go_after_the_stall_limit_and_dropped(serve, monkeypatch):
    monkeypatch.setattr(http_bridge, "STALLED_SEND_SECONDS", 1.0)
    body = _SlowBody(b"x" * (1 << 20), pause=0)  # a megabyte a part: the socket's buffers fill at once
    port = serve(body)
    client = _get(port)
    try:
        started = time.monotonic()
        assert body.closed.wait(timeout=15), "the response of a client that reads nothing was never closed"
        assert time.monotonic() - started >= 1.0 and body.made < PARTS
        # Aborted, not closed: a close would wait, megabytes buffered, for
        # a client that reads nothing.
        deadline = time.monotonic() + 5
        while _connections_to(port):
            assert time.monotonic() < deadline, "the stalled connection was kept open"
            time.sleep(0.05)
    finally:
        client.close()


def test_an_answer_longer_than_its_content_length_is_closed_not_left_waiting(serve):
    """uvicorn refuses the part past Content-Length (an exception from
    send): the view's thread must not wait on a full queue for ever."""
    body = _SlowBody(b"z" * 64, pause=0.01)
    client = _get(serve(body, headers=[("Content-Length", "100")]))
    try:
        assert body.closed.wait(timeout=5), "the response was never closed"
        assert body.made < PARTS
    finally:
        client.close()


def test_a_client_that_reads_to_the_end_gets_every_byte(serve):
    body = _SlowBody(b"\x07" * 1000, pause=0)
    client = _get(serve(body))
    received = b""
    while not received.endswith(b"0\r\n\r\n"):  # chunked: the last, empty chunk
        piece = client.recv(65536)
        assert piece, "the connection closed before the end"
        received += piece
    client.close()
    assert received.count(b"\x07") == PARTS * 1000 and body.made == PARTS
    # The last chunk may reach the client before the worker thread, done
    # iterating, has closed the body: closing is waited for, not raced.
    assert body.closed.wait(timeout=10), "the response was never closed"
