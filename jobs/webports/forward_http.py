"""One HTTP request through to a task's web port, streamed both ways.

A plain HTTP/1.1 client (h11, which uvicorn already uses) over one
connection per request, through the node's forwarder (node_link.py):
nothing is pooled between users. Bodies pass piece by piece with the event
loop's back-pressure, never whole in memory; a client that goes away ends
the exchange (uvicorn's send does not say so).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

from jobs.services.webports import WebPortTarget
from jobs.webports import headers as hdrs
from jobs.webports.node_link import CONNECT_SECONDS, NodeBusy, NodeRefused, open_task_socket
from portal.http_bridge import abort_client

READ_BYTES = 64 * 1024
# How often an exchange still open (a streaming answer, a WebSocket) checks
# again that its user may use the port: deactivated, a password changed, no
# longer the owner or an admin, or the task ended.
RECHECK_SECONDS = 5.0
NO_LONGER_ALLOWED = "You may no longer use this task's port (signed out of it, or the task ended)."
# How long a job may take none of a request's body before the proxy gives
# up with a 504: while it waits, nothing tells whether the browser is still
# there, and the connection (and the node forwarder's) would be held for as
# long as the task ran.
STALLED_SEND_SECONDS = 300.0


def job_tls_context() -> ssl.SSLContext:
    """For ports labelled https: the app's own certificate is whatever it
    made for itself, and the connection never leaves the node's loopback."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def plain_response(send: Any, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


class _ClientGone(Exception):
    pass


class _JobStalled(Exception):
    pass


class _Revoked(Exception):
    pass


@dataclass
class _Answer:
    started: bool = False  # the browser has the status line: too late for a 403


async def until_revoked(still_allowed: Callable[[], Awaitable[bool]]) -> None:
    """Returns once the user may no longer use the port."""
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        if not await still_allowed():
            return


async def forward_http(scope: dict[str, Any], receive: Any, send: Any, target: WebPortTarget,
                       still_allowed: Callable[[], Awaitable[bool]]) -> None:
    try:
        sock = await open_task_socket(target)
    except NodeBusy as busy:
        await plain_response(send, 429, f"Too many connections to this user's tasks: {busy}. Close some and try "
                                        "again.", [(b"retry-after", b"10")])
        return
    except NodeRefused as refused:
        await plain_response(send, 502, f"The task's web port cannot be reached: {refused}. Is its app listening "
                                        "on 0.0.0.0 at that port?")
        return
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            sock=sock, ssl=job_tls_context() if target.tls else None,
            server_hostname=target.node_address if target.tls else None), CONNECT_SECONDS)
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        sock.close()
        await plain_response(send, 502, "The task's web port did not complete a TLS handshake.")
        return
    answer = _Answer()
    try:
        await _exchange(scope, receive, send, reader, writer, answer, still_allowed)
    except _ClientGone:
        pass
    except _Revoked:
        if answer.started:
            abort_client(scope)  # cut off, not ended: a shortened answer must not pass for a whole one
        else:
            await plain_response(send, 403, NO_LONGER_ALLOWED)
    except _JobStalled:
        await plain_response(send, 504, f"The task's web port took none of the request for {STALLED_SEND_SECONDS:.0f} s.")
    except (OSError, h11.LocalProtocolError):  # the job hung up on the request
        with contextlib.suppress(Exception):  # unless the response had started
            await plain_response(send, 502, "The task's web port closed the connection.")
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _exchange(scope: dict[str, Any], receive: Any, send: Any, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, answer: _Answer,
                    still_allowed: Callable[[], Awaitable[bool]]) -> None:
    upstream = h11.Connection(our_role=h11.CLIENT)
    revoked = asyncio.ensure_future(until_revoked(still_allowed))
    try:
        sending = asyncio.ensure_future(_send_request(scope, receive, upstream, writer))
        await asyncio.wait({sending, revoked}, return_when=asyncio.FIRST_COMPLETED)
        if not sending.done():
            sending.cancel()
            raise _Revoked
        sending.result()
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        relay = asyncio.ensure_future(_relay_response(scope, send, upstream, reader, answer))
        try:
            await asyncio.wait({gone, relay, revoked}, return_when=asyncio.FIRST_COMPLETED)
            if relay.done():
                relay.result()  # raises what the relay raised
            elif revoked.done():
                raise _Revoked
        finally:
            for task in (gone, relay):
                task.cancel()
    finally:
        revoked.cancel()


async def _send_request(scope: dict[str, Any], receive: Any, upstream: h11.Connection,
                        writer: asyncio.StreamWriter) -> None:
    client = (scope.get("client") or ("", 0))[0]
    headers = hdrs.to_job(scope["headers"], client=client, scheme=scope.get("scheme", "http"))
    first = await receive()
    if first["type"] == "http.disconnect":
        raise _ClientGone
    has_length = any(name == b"content-length" for name, _ in headers)
    has_body = bool(first.get("body")) or first.get("more_body", False)
    if has_body and not has_length:
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"connection", b"close"))
    path = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        path += b"?" + scope["query_string"]
    writer.write(upstream.send(h11.Request(method=scope["method"], target=path, headers=headers)))
    message = first
    while True:
        if message.get("body"):
            writer.write(upstream.send(h11.Data(data=message["body"])))
            await _drain(writer)
        if not message.get("more_body", False):
            break
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
    writer.write(upstream.send(h11.EndOfMessage()))
    await _drain(writer)


async def _drain(writer: asyncio.StreamWriter) -> None:
    try:
        await asyncio.wait_for(writer.drain(), STALLED_SEND_SECONDS)
    except asyncio.TimeoutError:
        raise _JobStalled from None


async def _wait_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _next_event(upstream: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        event = upstream.next_event()
        if event is h11.PAUSED:
            # The job took the request as a protocol switch (a 2xx to
            # CONNECT): h11 has no more HTTP to give, and would say PAUSED
            # for ever, so asking again would spin the worker's event loop.
            return h11.ConnectionClosed()
        if event is not h11.NEED_DATA:
            return event
        upstream.receive_data(await reader.read(READ_BYTES))


async def _relay_response(scope: dict[str, Any], send: Any, upstream: h11.Connection,
                          reader: asyncio.StreamReader, answer: _Answer) -> None:
    try:
        event = await _next_event(upstream, reader)
        while isinstance(event, h11.InformationalResponse):  # 100 Continue and the like
            event = await _next_event(upstream, reader)
    except (h11.RemoteProtocolError, OSError):
        await plain_response(send, 502, "The task's web port did not answer with HTTP.")
        return
    if not isinstance(event, h11.Response):
        await plain_response(send, 502, "The task's web port closed the connection without an answer.")
        return
    answer.started = True
    await send({"type": "http.response.start", "status": event.status_code, "headers": hdrs.to_browser(event.headers)})
    while True:
        try:
            event = await _next_event(upstream, reader)
        except (h11.RemoteProtocolError, OSError):
            # Cut off mid-body: so is the browser's answer. Ended instead, a
            # chunked one would look complete, only shorter (a truncated
            # download taken for a whole one); uvicorn would drop the
            # connection itself as the app returns, but with an error logged.
            abort_client(scope)
            return
        if isinstance(event, h11.Data):
            await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            break
    await send({"type": "http.response.body", "body": b"", "more_body": False})
