"""The browser terminal and the web-port proxy against hostile clients and
hostile containers, without Docker: the portal's ASGI application served by
a real uvicorn in this process, the node agent's real forwarder, and a
task's "container" that is a socket of the test's. (The terminal's
part is in tests/security/test_terminal_without_bounds.py, on a real
container.)"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from jobs.models import Node, TaskAttempt, TaskState
from tests.helpers import rows_only_attempt, settled
from tests.raw_http import RawHttpServer
from tests.task_hosts import portal_in_thread

ENGINE_SCHEME = "termreview"


# ------------------------------------------------------------ the portal


@pytest.fixture(scope="module")
def portal(redis_server) -> Iterator[str]:
    """portal.asgi's application under uvicorn with the gunicorn worker's
    settings, in a thread of this process; its base URL."""
    with portal_in_thread() as base_url:
        yield base_url


def _running_attempt(owner, node: Node, *, ports: dict[str, list[int]]) -> TaskAttempt:
    """A running task attempt as database rows only, on `node`."""
    return rows_only_attempt(owner, f"rev_{uuid.uuid4().hex[:8]}", running_on=node, ports=ports)


@pytest.fixture
def node() -> Iterator[Node]:
    """A node nothing is placed on, whose engine is the test's."""
    # Its heartbeat an hour ahead: the test cluster's agents, which look for
    # lost nodes, would otherwise give its tasks up mid-test (a 403 then).
    made = Node.objects.create(name=f"rev-{uuid.uuid4().hex[:8]}", address="127.0.0.2",
                               docker_host=f"{ENGINE_SCHEME}://{uuid.uuid4().hex[:8]}", cpus=1, memory_mb=1,
                               schedulable=False, last_heartbeat=timezone.now() + timedelta(hours=1))
    yield made
    TaskAttempt.objects.filter(node=made).update(state=TaskState.SUCCEEDED)


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


# ------------------------------------------------------------ web ports


class JobApp(RawHttpServer):
    """A task's web port: on the node's web-port address, answering each
    connection with what `answer` makes of the request's bytes."""

    def __init__(self, answer: Callable[[bytes], bytes]) -> None:
        from django.conf import settings

        super().__init__(answer, address=settings.NODE_WEB_PORT_ADDRESS)


@dataclass
class WebTask:
    attempt: TaskAttempt
    app: JobApp
    host: str  # the task host, as the browser names it
    portal: tuple[str, int]
    cookie: str = ""

    def raw(self, request: bytes, *, timeout: float = 10) -> bytes:
        """The portal's whole answer to one raw request on one connection."""
        with socket.create_connection(self.portal, timeout=timeout) as sock:
            sock.sendall(request)
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except TimeoutError:
                pass
            return answer

    def get(self, path: str = "/", *, method: str = "GET", headers: str = "", body: bytes = b"") -> bytes:
        return self.raw(f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nCookie: {self.cookie}\r\n{headers}"
                        "Connection: close\r\n\r\n".encode() + body)


@pytest.fixture
def web_task(portal, node, alice) -> Iterator[Callable[[Callable[[bytes], bytes]], WebTask]]:
    """A running task of alice's whose http port answers as the test says,
    reached through the node's real forwarder; alice signed in to it."""
    from jobs.node.webforward import WebForwarder
    from jobs.services import webports

    forwarder = WebForwarder(node_name=node.name, address=node.address)
    forwarder.start()
    apps: list[JobApp] = []

    def make(answer: Callable[[bytes], bytes]) -> WebTask:
        app = JobApp(answer)
        apps.append(app)
        attempt = _running_attempt(alice, node, ports={"http": [app.port]})
        address = ("127.0.0.1", int(portal.rsplit(":", 1)[1]))
        task = WebTask(attempt, app, f"t{attempt.pk}-{app.port}.localhost:{address[1]}", address)
        ticket = webports.ticket_issue(user=alice, attempt_id=attempt.pk, port=app.port, next_path="/",
                                       origin=portal)
        body = f"ticket={ticket}"
        entered = task.get(webports.ENTER_PATH, method="POST", headers=(
            f"Origin: {portal}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(body)}\r\n"), body=body.encode())
        assert entered.startswith(b"HTTP/1.1 303"), entered
        task.cookie = next(line for line in entered.split(b"\r\n") if line.lower().startswith(b"set-cookie:")
                           ).split(b":", 1)[1].split(b";")[0].strip().decode()
        return task

    yield make
    forwarder.stop()
    for app in apps:
        app.close()


def _ok(body: bytes, *headers: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def test_it_forwards_a_plain_request(web_task):
    task = web_task(lambda request: _ok(b"hello", b"Content-Length: 5"))
    answer = task.get("/x")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")


def test_it_survives_a_job_that_takes_a_connect_as_a_tunnel(web_task):
    """A 2xx to CONNECT switches h11's connection to another protocol, where
    it has no more events to give: the relay asked again and again without
    waiting, and the worker's event loop served no one any more."""
    task = web_task(lambda request: _ok(b"tunnel bytes"))
    answer = task.raw(f"CONNECT / HTTP/1.1\r\nHost: {task.host}\r\nCookie: {task.cookie}\r\n\r\n".encode(), timeout=5)
    assert answer.startswith(b"HTTP/1.1 ") and answer.endswith(b"0\r\n\r\n")  # ended, not held
    started = time.monotonic()
    assert task.get("/after").startswith(b"HTTP/1.1 200")
    assert time.monotonic() - started < 3


def test_it_frames_a_chunked_answer_that_also_names_a_length_by_its_chunks(web_task):
    # RFC 9112, 6.3: Transfer-Encoding overrides Content-Length, and a proxy
    # must drop the latter; passed on, it contradicted the body sent.
    task = web_task(lambda request: _ok(b"5\r\nhello\r\n0\r\n\r\n", b"Content-Length: 3", b"Transfer-Encoding: chunked"))
    head, _, body = task.get("/x").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length" not in head.lower()
    assert body == b"5\r\nhello\r\n0\r\n\r\n"



@pytest.mark.parametrize("framing, cut", [(b"Content-Length: 5", b"he"), (b"Transfer-Encoding: chunked", b"2\r\nhe\r\n")])
def test_it_cuts_the_browsers_answer_off_where_the_job_cut_its_off(web_task, framing, cut):
    """A job (or its container) that dies mid-body: the browser must see a
    broken answer, not a complete one with less in it."""
    task = web_task(lambda request: _ok(cut, framing))
    head, _, body = task.get("/x").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert body in (b"he", b"2\r\nhe\r\n")  # what came, and no end of a chunked body after it


def test_it_passes_the_job_no_x_forwarded_header_of_the_clients(web_task):
    # SECURITY.md, "Web ports": the client's X-Forwarded-* are dropped, all of them.
    task = web_task(lambda request: _ok(b"", b"Content-Length: 0"))
    task.get("/x", headers="X-Forwarded-Port: 1\r\nX-Forwarded-Prefix: /elsewhere\r\nX-Forwarded-Ssl: on\r\n"
                           "X-Forwarded-For: 10.9.9.9\r\n")
    seen = [line.split(b":", 1)[0] for line in task.app.requests[-1].split(b"\r\n")[1:] if line]
    assert sorted(name for name in seen if name.startswith(b"x-forwarded-")) == [
        b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto"]  # the proxy's own
    assert b"10.9.9.9" not in task.app.requests[-1]


@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/terminal/abc/", "/ws/terminal/1/x", "/"])
def test_it_refuses_a_websocket_to_no_route_cleanly(portal, alice, path):
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        ws_connect(portal.replace("http://", "ws://") + path, origin=portal, proxy=None, open_timeout=10,
                   additional_headers={"Cookie": _session_cookie(alice)})
    assert refused.value.response.status_code == 403  # refused, not a 500 from an exception


class JobWebSocketApp:
    """A task's web port serving a WebSocket that sends `count` messages of
    `size` bytes as fast as it is let, counting those sent."""

    def __init__(self, *, count: int, size: int) -> None:
        from django.conf import settings
        from websockets.sync.server import serve

        self.sent = 0

        def handler(connection) -> None:
            with contextlib.suppress(ConnectionClosed):
                for _ in range(count):
                    connection.send(b"x" * size)
                    self.sent += 1

        self.server = serve(handler, settings.NODE_WEB_PORT_ADDRESS, 0, max_size=None, compression=None)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_it_holds_few_of_a_jobs_websocket_messages_for_a_browser_that_reads_none(portal, node, alice):
    """The proxy reads the job's messages only as the browser takes them:
    a browser that takes none must not make the portal hold many (each may
    be 16 MB)."""
    from jobs.node.webforward import WebForwarder
    from jobs.services import webports

    forwarder = WebForwarder(node_name=node.name, address=node.address)
    forwarder.start()
    app = JobWebSocketApp(count=24, size=8 * 1024 * 1024)
    try:
        attempt = _running_attempt(alice, node, ports={"http": [app.port]})
        grant = webports.Grant(user_id=alice.pk, auth_tag=webports._auth_tag(alice),
                               host=webports.TaskHost(attempt.pk, app.port))
        address = ("127.0.0.1", int(portal.rsplit(":", 1)[1]))
        with socket.create_connection(address, timeout=10) as browser:
            browser.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            browser.sendall(f"GET / HTTP/1.1\r\nHost: t{attempt.pk}-{app.port}.localhost:{address[1]}\r\n"
                            f"Cookie: {webports.COOKIE_NAME}={webports.cookie_value(grant)}\r\nUpgrade: websocket\r\n"
                            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                            "Sec-WebSocket-Version: 13\r\n\r\n".encode())
            assert browser.recv(12) == b"HTTP/1.1 101"
            sent = settled(lambda: app.sent, quiet=1.5, timeout=30)  # and the browser reads nothing more
            # What the kernel's socket buffers take on three hops (a few
            # messages), one being sent and one or two read ahead in the
            # proxy: not 16 more (it held 21-22 before).
            assert sent <= 12, f"the job sent {sent} messages of 8 MB to a browser that read none"
    finally:
        forwarder.stop()
        app.close()


def test_it_answers_504_when_the_job_takes_none_of_a_request_body(web_task, monkeypatch):
    # The proxy waited on the job to take the body with no time limit: a job
    # that reads none held the browser's connection, and the node
    # forwarder's, for as long as the task ran, gone browser or not.
    from jobs.webports import forward_http

    monkeypatch.setattr(forward_http, "STALLED_SEND_SECONDS", 1.0)
    release = threading.Event()
    task = web_task(lambda request: (release.wait(60), b"")[1])
    size = 256 * 1024 * 1024
    with socket.create_connection(task.portal, timeout=30) as sock:
        sock.sendall(f"POST /up HTTP/1.1\r\nHost: {task.host}\r\nCookie: {task.cookie}\r\n"
                     f"Content-Length: {size}\r\n\r\n".encode())

        def send_body() -> None:
            piece = b"x" * (1 << 20)
            with contextlib.suppress(OSError):
                for _ in range(size // len(piece)):
                    sock.sendall(piece)

        threading.Thread(target=send_body, daemon=True).start()
        started = time.monotonic()
        answer = sock.recv(65536)
        release.set()
    assert answer.startswith(b"HTTP/1.1 504"), answer[:200]
    assert b"took none of the request" in answer
    assert time.monotonic() - started < 20
