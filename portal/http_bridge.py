"""Plain HTTP for the ASGI server: Django's WSGI handler on a fixed pool of
threads (a2wsgi), with fewer hand-overs between the event loop and the
threads for the common request.

a2wsgi passes every piece of an exchange between the event loop and the
view's thread with a blocking round trip: each part of the request body,
the status line, each part of the response, its end. An API call or a page
has a small body and a response made whole in memory, so here:
- a request body of known length up to PREREAD_BYTES is read in the event
  loop before the view's thread starts;
- a response that is not streaming is collected in the view's thread and
  sent from the loop once the view returns, straight to the server: a2wsgi's
  send queue and the task that empties it are made only for a streaming
  response (2-14% less of the web workers' CPU a submission, in four pairs
  of runs side by side with bench/api_submit_rate.py's set-up).
That is one hand-over each way instead of four or more: about 15% of the
CPU a job submission costs (measured with bench/api_submit_rate.py). Streaming responses (log and file
downloads) and bigger or chunked uploads keep a2wsgi's piece-by-piece path,
so memory stays bounded for them.

A bigger body of known length (a file upload) is read ahead by the loop, up
to READ_AHEAD_BYTES, while the view's thread parses what came before: with
a2wsgi's own body each piece waited for a round trip to the loop, which only
then let uvicorn read on from the socket, so receiving and parsing took
turns (bench/hdfs_transfer.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from a2wsgi.wsgi import Body, WSGIMiddleware, WSGIResponder, build_environ

log = logging.getLogger(__name__)

# The scope extension through which portal/http_protocol.py lets the bridge
# drop a connection at once.
ABORT_EXTENSION = "portal.abort"


def abort_client(scope: Any) -> None:
    """Drop the client's connection at once, without the usual close, which
    would wait for the client to take what is buffered (nothing when the
    protocol gives no abort: portal/http_protocol.py does)."""
    abort = (scope.get("extensions") or {}).get(ABORT_EXTENSION)
    if abort is not None:
        abort()

PREREAD_BYTES = 256 * 1024
READ_AHEAD_BYTES = 1024 * 1024
# A streamed response whose client takes nothing for this long is let go:
# its thread (and its user's stream slot, jobs/services/stream_slots.py)
# goes back to others. Minutes: a browser's paused download, a slow link.
STALLED_SEND_SECONDS = 300.0


class _PiecesBody(Body):
    """A body that can also be read as the pieces the server received
    (jobs/storage/multipart.py reads uploads so, without the copies read()
    makes into and out of a2wsgi's buffer)."""

    def pieces(self) -> Iterator[bytes]:
        if self.buffer:  # what a read() left over
            yield bytes(self.buffer)
            self.buffer.clear()
        while self._has_more:
            if piece := self._receive_more_data():
                yield piece


class _ReadBody(_PiecesBody):
    """a2wsgi's request body, already read whole by the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, receive: Any, data: bytes) -> None:
        super().__init__(loop, receive)
        self.buffer.extend(data)
        self._has_more = False


class _ReadAheadBody(_PiecesBody):
    """a2wsgi's request body, received by a task on the loop as fast as the
    client sends it, up to READ_AHEAD_BYTES ahead of the view's reads (plus
    one message: memory stays bounded). The view's thread takes what came
    without a round trip to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, receive: Any) -> None:
        super().__init__(loop, receive)
        self._ready: deque[bytes] = deque()
        self._ready_bytes = 0
        self._ended = False
        self._changed = threading.Condition()
        self._room = asyncio.Event()  # made on the loop: _Responder runs there
        self._room.set()
        self.task = loop.create_task(self._receive_ahead())

    async def _receive_ahead(self) -> None:
        try:
            more = True
            while more:
                await self._room.wait()
                message = await self.receive()
                # A disconnect ends the body: the view sees it short, as with a2wsgi's.
                more = message["type"] == "http.request" and message.get("more_body", False)
                body = message.get("body", b"") if message["type"] == "http.request" else b""
                with self._changed:
                    if body:
                        self._ready.append(body)
                        self._ready_bytes += len(body)
                    if self._ready_bytes >= READ_AHEAD_BYTES:
                        self._room.clear()
                    self._changed.notify()
        finally:  # the end, a failure or the response done (cancelled)
            with self._changed:
                self._ended = True
                self._changed.notify()

    def _receive_more_data(self) -> bytes:
        """What a2wsgi's read and readline call for the next message."""
        with self._changed:
            while not self._ready and not self._ended:
                self._changed.wait()
            if not self._ready:
                self._has_more = False
                return b""
            body = self._ready.popleft()
            self._ready_bytes -= len(body)
            if self._ended and not self._ready:
                self._has_more = False
            if self._ready_bytes < READ_AHEAD_BYTES and not self._room.is_set():
                self.loop.call_soon_threadsafe(self._room.set)
        return body


def _client(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "a client"


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read_body(receive: Any) -> bytes:
    """The whole body (its length is known and small)."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: the view sees a short body
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


class _Responder(WSGIResponder):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.held: list[dict[str, Any]] = []  # messages the loop sends after the view returns
        self.holding = True
        self.send_to_client: Any = None
        self.sender_task: asyncio.Task[None] | None = None  # only for a streaming response
        self.receive: Any = None
        self.body: Body | None = None
        self.scope: dict[str, Any] = {}
        self.send_error: BaseException | None = None  # raised once the view's thread is done
        # A streaming response's client went away (or stopped reading): set
        # on the loop, read by the view's thread between two parts.
        self.gone = threading.Event()
        self.watch_task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        length = _content_length(scope)
        if length is not None and length <= PREREAD_BYTES:
            body: Body = _ReadBody(self.loop, receive, await _read_body(receive))
        elif length is not None:
            body = _ReadAheadBody(self.loop, receive)
        else:
            body = _PiecesBody(self.loop, receive)  # chunked: a2wsgi's, which can also give its pieces
        environ = build_environ(scope, body)
        self.send_to_client, self.receive, self.body, self.scope = send, receive, body, scope
        try:
            func = functools.partial(contextvars.copy_context().run, self.wsgi)
            await self.loop.run_in_executor(self.executor, func, environ, self.start_response)
            if self.sender_task is None:  # the response was held whole: no queue, no task
                for message in self.held:
                    await send(message)
            else:
                await self.send_queue.put(None)
                await self.sender_task
                if self.send_error is not None:
                    raise self.send_error
            if self.exc_info is not None:
                raise self.exc_info[0].with_traceback(self.exc_info[1], self.exc_info[2])
        finally:
            if self.sender_task is not None and not self.sender_task.done():
                self.sender_task.cancel()
            if self.watch_task is not None and not self.watch_task.done():
                self.watch_task.cancel()
            if isinstance(body, _ReadAheadBody) and not body.task.done():
                body.task.cancel()  # the view did not read it all

    def send(self, message: Any) -> None:
        if self.holding:
            self.held.append(message)
        else:
            super().send(message)

    def _stream(self) -> None:
        """From here on, send each message as it comes (a2wsgi's way)."""
        self.holding = False
        asyncio.run_coroutine_threadsafe(self._start_sender(), self.loop).result()
        held, self.held = self.held, []
        for message in held:
            super().send(message)

    async def _start_sender(self) -> None:
        """The task that sends what the view's thread queues, in order, and
        the one that watches for the client's going away."""
        self.sender_task = self.loop.create_task(self.sender(self.send_to_client))
        if isinstance(self.body, _ReadAheadBody) and not self.body.task.done():
            self.body.task.cancel()  # the view has answered: the rest of its body is not read
        self.watch_task = self.loop.create_task(self._watch_for_disconnect())

    async def _watch_for_disconnect(self) -> None:
        """uvicorn's send() returns quietly once the client has gone, and
        a view would go on making its whole response (a log, a file out of
        HDFS) for no one, holding its thread: only receive() tells. What is
        left of a request body nobody read is passed over."""
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone.set()

    async def sender(self, send: Any) -> None:
        """a2wsgi's, letting go of a client that takes nothing for
        STALLED_SEND_SECONDS. Once the client is gone, or a send failed (an
        answer longer than its Content-Length), what the view's thread still
        queues is dropped: it must never wait on a full queue, or its
        response would never be closed."""
        while True:
            message = await self.send_queue.get()
            if message is None:
                break
            if not self.gone.is_set():
                try:
                    await asyncio.wait_for(send(message), STALLED_SEND_SECONDS)
                except asyncio.TimeoutError:
                    self.gone.set()
                    self._abort_stalled()
                except Exception as exc:
                    self.gone.set()
                    self.send_error = exc
            self.send_queue.task_done()

    def _abort_stalled(self) -> None:
        """Drop the connection: closed the usual way, it would wait for the
        client to take what is buffered, which it does not (megabytes held
        for as long as it stays). portal/http_protocol.py gives the abort."""
        log.warning("let go of %s, which took nothing of %s for %.0f s", _client(self.scope),
                    self.scope.get("path", "?"), STALLED_SEND_SECONDS)
        abort_client(self.scope)

    def wsgi(self, environ: Any, start_response: Any) -> None:
        iterable: Iterable[bytes] = self.app(environ, start_response)
        try:
            if getattr(iterable, "streaming", True):  # Django's streaming and file responses
                self._stream()
                for chunk in iterable:
                    if self.gone.is_set():  # closed below now, not after its last part
                        return
                    self.send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.send({"type": "http.response.body", "body": b""})
            else:
                self.send({"type": "http.response.body", "body": b"".join(iterable)})
        finally:
            getattr(iterable, "close", lambda: None)()


class ThreadedWSGI(WSGIMiddleware):
    """a2wsgi's WSGIMiddleware for plain HTTP, with the shortcuts above."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await _Responder(self.app, self.executor, self.send_queue_size)(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)
