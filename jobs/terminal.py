"""A shell in the browser: a WebSocket bridged to `docker exec` with a TTY.

Messages from the browser are JSON text frames:
    {"type": "input", "data": "ls\\r"}          keystrokes
    {"type": "resize", "rows": 40, "cols": 120}
The terminal's output goes back as binary frames, byte for byte, so colours
and control sequences reach xterm.js untouched. Only the job's owner or an
admin may open one, only on a running task, and every session is recorded
(TerminalSession, the audit log admins see): jobs/services/terminals.py
checks and records, this module bridges. The session closes when the shell
exits or the task ends, and when the right to open it is gone (the user
signed out, changed their password, was deactivated or lost the job), and
when the browser has sent no input for TERMINAL_IDLE_SECONDS (a forgotten
tab; resizes, which the page sends by itself, do not count).

Input is back-pressured: every write to the shell waits until the engine
has taken it (drain), and Channels hands this consumer its next message only
after the last one was handled, so a client that sends faster than the
shell reads is paused (uvicorn stops reading its socket) instead of
buffered; portal/workers.py bounds the size of one message. Until the
client blocks, the kernel's socket buffers take what it sends (a few MB;
with permessage-deflate, a few MB of compressed frames, which may stand for
far more input): still unread, and bounded by those buffers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from django.conf import settings

from jobs.node.launcher import Engine, engine_for
from jobs.models import TaskAttempt, TaskState
from jobs.services import terminals

log = logging.getLogger(__name__)

# The shell first prints its PID (read and dropped by us): Docker does not
# end an exec when its connection closes, so on disconnect we hang it up.
SHELL = [
    "/bin/sh", "-c",
    'echo "pai-terminal-pid=$$"; if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi',
]
SHELL_ENV = ["TERM=xterm-256color", "COLORTERM=truecolor"]
# Close codes the page explains to the user (4000-4999 are free for apps).
CLOSE_SIGNED_OUT = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_MANY = 4429
CLOSE_IDLE = 4408
CLOSE_NOT_RUNNING = 4409
CLOSE_TASK_ENDED = 4410
CLOSE_ERROR = 4500
WATCH_SECONDS = 2.0
CONTAINER_STOP_CHECKS = 8
MAX_INPUT_CHARS = 64 * 1024
SHELL_LOST = "the connection to the shell was lost"
SHELL_STALLED = "the shell took no input for {seconds:g} s; the session is closed"
IDLE = "no input for {seconds} s: the terminal is closed"

# One Engine per Docker host: its clients are per thread, and the thread pool
# behind asyncio.to_thread is small, so this stays bounded.
_engines: dict[str, Engine] = {}


def _engine(docker_host: str) -> Engine:
    engine = _engines.get(docker_host)
    if engine is None:
        engine = _engines[docker_host] = engine_for(docker_host)
    return engine


# Why a session was refused, as the close code the page explains.
_REFUSAL_CODES = {terminals.TerminalForbidden: CLOSE_FORBIDDEN, terminals.TerminalNotRunning: CLOSE_NOT_RUNNING,
                  terminals.TerminalTooMany: CLOSE_TOO_MANY}


def task_running(attempt_id: int) -> bool:
    return TaskAttempt.objects.filter(pk=attempt_id, state=TaskState.RUNNING).exists()


async def _read_shell_pid(reader: asyncio.StreamReader) -> tuple[int | None, bytes]:
    """(the shell's PID, output that followed it) from the start of the stream."""
    buffered = b""
    try:
        while b"\n" not in buffered and len(buffered) < 4096:
            chunk = await asyncio.wait_for(reader.read(4096), timeout=10)
            if not chunk:
                break
            buffered += chunk
    except asyncio.TimeoutError:
        return None, buffered
    match = re.search(rb"pai-terminal-pid=(\d+)\r?\n", buffered)
    if match is None:
        return None, buffered
    return int(match.group(1)), buffered[:match.start()] + buffered[match.end():]


class TerminalConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.attempt_id = int(self.scope["url_route"]["kwargs"]["attempt_id"])
        self.target: terminals.TerminalTarget | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.shell_pid: int | None = None
        self.tasks: list[asyncio.Task] = []
        self.end_reason = "closed by the browser"
        self.last_input = time.monotonic()
        user = self.scope["user"]
        self.user_id = user.pk if user.is_authenticated else None
        session = self.scope.get("session")
        self.session_key = session.session_key if session is not None else None
        client = self.scope.get("client") or ("", 0)
        # Accept first, so a refusal can say why before it closes.
        await self.accept()
        try:
            self.target = await database_sync_to_async(terminals.terminal_session_open)(
                user=self.scope["user"], attempt_id=self.attempt_id, client_address=client[0] or "")
            first_output = await self._open_shell()
        except terminals.TerminalRefused as refused:
            await self._refuse(_REFUSAL_CODES[type(refused)], refused.message)
            return
        except Exception as exc:  # the engine said no: tell the user, keep the details in the log
            log.exception("opening a terminal into task attempt %s failed", self.attempt_id)
            await self._refuse(CLOSE_ERROR, f"could not open a shell: {exc.__class__.__name__}")
            return
        if first_output:
            await self.send(bytes_data=first_output)
        self.tasks = [asyncio.create_task(self._pump()), asyncio.create_task(self._watch())]

    async def _open_shell(self) -> bytes:
        """Start the shell in the container; return its first output."""
        self.engine = _engine(self.target.docker_host)
        self.exec_id, sock = await asyncio.to_thread(
            self.engine.open_terminal, self.target.container_id, command=SHELL, env=SHELL_ENV
        )
        sock.setblocking(False)
        self.reader, self.writer = await asyncio.open_connection(sock=sock)
        self.shell_pid, first_output = await _read_shell_pid(self.reader)
        return first_output

    async def _refuse(self, code: int, message: str) -> None:
        self.end_reason = message
        await self.send(text_data=json.dumps({"type": "error", "message": message}))
        await self.close(code=code)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.writer is None:
            return
        if bytes_data:
            self.last_input = time.monotonic()
            await self._write(bytes_data[:MAX_INPUT_CHARS])
            return
        try:
            message = json.loads(text_data or "{}")
        except (ValueError, RecursionError):  # a message nested deeper than Python's json goes
            return
        if not isinstance(message, dict):
            return
        if message.get("type") == "input" and isinstance(message.get("data"), str):
            self.last_input = time.monotonic()
            # JSON may carry a lone surrogate ("\ud800"), which UTF-8 cannot
            # hold: an exception here would end the consumer without its
            # disconnect (the session left open, the shell not hung up).
            await self._write(message["data"][:MAX_INPUT_CHARS].encode(errors="replace"))
        elif message.get("type") == "resize":
            rows, cols = message.get("rows"), message.get("cols")
            if isinstance(rows, int) and isinstance(cols, int) and 0 < rows < 1000 and 0 < cols < 1000:
                await asyncio.to_thread(self.engine.resize_terminal, self.exec_id, rows=rows, cols=cols)

    async def _write(self, data: bytes) -> None:
        """To the shell, waiting until the engine has taken it: while this
        waits, no further message of the client is read. Not for ever: a
        shell that takes no input for TERMINAL_INPUT_STALL_SECONDS ends the
        session (while this waits, not even the client's goodbye is read, so
        the shell could not be hung up)."""
        try:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), timeout=settings.TERMINAL_INPUT_STALL_SECONDS)
        except asyncio.TimeoutError:
            await self._end(SHELL_STALLED.format(seconds=settings.TERMINAL_INPUT_STALL_SECONDS))
        except (ConnectionError, RuntimeError):  # the engine dropped the stream
            await self._end(SHELL_LOST)

    async def _end(self, reason: str) -> None:
        """The shell cannot take input (the stream broke, or it stalled; the
        shell may live on: disconnect hangs it up). Say so once, and close,
        rather than drop input."""
        if self.writer is None:
            return  # input was off already: the first reason stands (a revoke's, the task's end)
        self.end_reason = reason
        # No more input goes anywhere: messages the client sent meanwhile
        # are dropped at once, so its goodbye (and the hang-up) comes soon.
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        await self.send(text_data=json.dumps({"type": "error", "message": reason}))
        await self.close(code=CLOSE_ERROR)

    async def _pump(self) -> None:
        """Terminal output to the browser until the shell exits."""
        while True:
            try:
                data = await self.reader.read(65536)
            except ConnectionError:  # the engine dropped the stream
                await self._end(SHELL_LOST)
                return
            if not data:
                break
            await self.send(bytes_data=data)
        self.shell_pid = None  # nothing left to hang up
        if await self._container_stopping():
            await self._task_ended()
        else:
            self.end_reason = "the shell exited"
            await self.close(code=1000)

    async def _container_stopping(self) -> bool:
        """Did the shell end because its container is going away? The exec's
        stream closes a moment before Docker (and later our database) says
        the container stopped, so look for a little while."""
        for _ in range(CONTAINER_STOP_CHECKS):
            state = await asyncio.to_thread(self.engine.state, self.target.container_id)
            if state is None or not state.running:
                return True
            await asyncio.sleep(0.1)
        return not await database_sync_to_async(task_running)(self.attempt_id)

    async def _watch(self) -> None:
        """Close the session when the task ends (its container may linger),
        when the user may no longer have it open, or when nobody typed in it
        for TERMINAL_IDLE_SECONDS."""
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            if not await database_sync_to_async(task_running)(self.attempt_id):
                await self._task_ended()
                return
            gone = await database_sync_to_async(terminals.terminal_session_check)(
                user_id=self.user_id, session_key=self.session_key, attempt_id=self.attempt_id)
            if gone:
                await self._revoke(gone, CLOSE_SIGNED_OUT if gone == terminals.SIGNED_OUT else CLOSE_FORBIDDEN)
                return
            if time.monotonic() - self.last_input > settings.TERMINAL_IDLE_SECONDS:
                await self._revoke(IDLE.format(seconds=settings.TERMINAL_IDLE_SECONDS), CLOSE_IDLE)
                return

    async def _revoke(self, reason: str, code: int) -> None:
        self.end_reason = reason
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()  # the pump would see the stream end and call it "the shell exited"
        # A write waiting for a shell that reads nothing would hold the
        # consumer: drop the stream now rather than flush it.
        if self.writer is not None:
            self.writer.transport.abort()
            self.writer = None  # input queued meanwhile is dropped, and cannot re-word the end
        await self.send(text_data=json.dumps({"type": "error", "message": reason}))
        await self.close(code=code)

    async def _task_ended(self) -> None:
        self.end_reason = "the task ended"
        self.shell_pid = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        await self.send(text_data=json.dumps({"type": "error", "message": "the task has ended"}))
        await self.close(code=CLOSE_TASK_ENDED)

    async def disconnect(self, code: int) -> None:
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.writer is not None:
            self.writer.close()
        if self.target is None:
            return
        try:
            if self.shell_pid is not None:
                # SIGHUP to the shell; the kernel passes it on to its foreground job.
                await asyncio.to_thread(self.engine.exec_status, self.target.container_id,
                                        ["/bin/sh", "-c", f"kill -HUP {self.shell_pid} 2>/dev/null"])
        except Exception:  # the engine is unreachable: the shell ends with the container
            log.exception("hanging up the shell of terminal session %s failed", self.target.session_id)
        finally:
            await database_sync_to_async(terminals.terminal_session_close)(
                session_id=self.target.session_id, attempt_id=self.attempt_id, reason=self.end_reason)
