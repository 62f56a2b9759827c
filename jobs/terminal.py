"""A shell in the browser: a WebSocket bridged to `docker exec` with a TTY.

Messages from the browser are JSON text frames:
    {"type": "input", "data": "ls\\r"}          keystrokes
    {"type": "resize", "rows": 40, "cols": 120}
The terminal's output goes back as binary frames, byte for byte, so colours
and control sequences reach xterm.js untouched. Only the job's owner or an
admin may open one, only on a running task, and every session is recorded
(TerminalSession, the audit log admins see). The session closes when the
shell exits or the task ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs.launcher import Engine
from jobs.models import Job, TaskAttempt, TaskState, TerminalSession
from jobs.services import access

log = logging.getLogger(__name__)

# The shell first prints its PID (read and dropped by us): Docker does not
# end an exec when its connection closes, so on disconnect we hang it up.
SHELL = [
    "/bin/sh", "-c",
    'echo "pai-terminal-pid=$$"; if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi',
]
SHELL_ENV = ["TERM=xterm-256color", "COLORTERM=truecolor"]
# Close codes the page explains to the user (4000-4999 are free for apps).
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_RUNNING = 4409
CLOSE_TASK_ENDED = 4410
CLOSE_ERROR = 4500
WATCH_SECONDS = 2.0
CONTAINER_STOP_CHECKS = 8
MAX_INPUT_CHARS = 64 * 1024

# One Engine per Docker host: its clients are per thread, and the thread pool
# behind asyncio.to_thread is small, so this stays bounded.
_engines: dict[str, Engine] = {}


def _engine(docker_host: str) -> Engine:
    engine = _engines.get(docker_host)
    if engine is None:
        engine = _engines[docker_host] = Engine(docker_host)
    return engine


@dataclass(frozen=True)
class _Target:
    session_id: int
    docker_host: str
    container_id: str


class TerminalRefused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def open_session(user, attempt_id: int, client_address: str) -> _Target:
    """Check the user may open a shell in this task; record the session."""
    attempt = None
    if user.is_authenticated:  # visible_to: the job's owner, or an admin
        attempt = TaskAttempt.objects.select_related("node").filter(
            pk=attempt_id, job__in=Job.objects.visible_to(user)).first()
    if attempt is None:
        raise TerminalRefused(CLOSE_FORBIDDEN, "no such task, or it is not yours")
    if not access.terminal_ready(attempt) or attempt.node is None:
        raise TerminalRefused(CLOSE_NOT_RUNNING, "the task is not running")
    now = timezone.now()
    with transaction.atomic():
        session = TerminalSession.objects.create(user=user, attempt=attempt, client_address=client_address[:64],
                                                 started_at=now)
        _note_activity(attempt.pk, now)
    return _Target(session.pk, attempt.node.docker_host, attempt.container_id)


def close_session(session_id: int, attempt_id: int, reason: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        closed = TerminalSession.objects.filter(pk=session_id, ended_at__isnull=True).update(
            ended_at=now, end_reason=reason[:200]
        )
        if closed:
            _note_activity(attempt_id, now)


def _note_activity(attempt_id: int, now: datetime) -> None:
    """A terminal opened or closed is use of the task: its idle notice
    (access.last_activity) reads last_activity_at. Only ever move it forward."""
    TaskAttempt.objects.filter(Q(last_activity_at__isnull=True) | Q(last_activity_at__lt=now), pk=attempt_id).update(
        last_activity_at=now
    )


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
        self.target: _Target | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.shell_pid: int | None = None
        self.tasks: list[asyncio.Task] = []
        self.end_reason = "closed by the browser"
        client = self.scope.get("client") or ("", 0)
        # Accept first, so a refusal can say why before it closes.
        await self.accept()
        try:
            self.target = await database_sync_to_async(open_session)(self.scope["user"], self.attempt_id, client[0] or "")
            first_output = await self._open_shell()
        except TerminalRefused as refused:
            await self._refuse(refused.code, refused.message)
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
            self.writer.write(bytes_data[:MAX_INPUT_CHARS])
            return
        try:
            message = json.loads(text_data or "{}")
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if message.get("type") == "input" and isinstance(message.get("data"), str):
            self.writer.write(message["data"][:MAX_INPUT_CHARS].encode())
            await self.writer.drain()
        elif message.get("type") == "resize":
            rows, cols = message.get("rows"), message.get("cols")
            if isinstance(rows, int) and isinstance(cols, int) and 0 < rows < 1000 and 0 < cols < 1000:
                await asyncio.to_thread(self.engine.resize_terminal, self.exec_id, rows=rows, cols=cols)

    async def _pump(self) -> None:
        """Terminal output to the browser until the shell exits."""
        while True:
            data = await self.reader.read(65536)
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
        """Close the session when the task ends (its container may linger)."""
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            if not await database_sync_to_async(task_running)(self.attempt_id):
                await self._task_ended()
                return

    async def _task_ended(self) -> None:
        self.end_reason = "the task ended"
        self.shell_pid = None
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
            await database_sync_to_async(close_session)(self.target.session_id, self.attempt_id, self.end_reason)
