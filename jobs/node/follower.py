"""Every container's logs on one thread: the node agent's log follower.

A thread per log stream (as the watchers had) costs a stack, a connection
pool and a wake-up for every task, and a node with a thousand small tasks
spends more memory on those than on anything it does. Here one thread
selects (epoll) on every container's log socket, hands each readable one's
entries to its owner (a TaskWatcher, which turns them into lines for the
log writer without blocking), and notices when a stream ends.

Everything that blocks (the database, the engine's answers: opening a
stream, inspecting, removing a container, waiting for the log writer) runs
on a few helper threads shared by all tasks (`submit`), and delayed work
(SIGKILL after a stop's grace period) is timed by the same loop
(`call_later`), so the number of threads does not grow with the tasks.

While the log writer is full (the database is away, or slower than the
tasks print), the loop reads no stream: before each read it asks the writer
for room (`room`), and without it selects on its wake-up socket alone until
the writer wakes it. The engine keeps what the tasks print meanwhile (a
followed log nobody reads waits on its socket; the json-file log driver
goes on writing to its file), so memory stays bounded and no line is lost.
The loop itself never blocks on the writer: timers (a stop's SIGKILL), new
streams and the helpers go on, and `stop()` ends it at once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import close_old_connections, connection

from jobs.node.launcher import LogStream

log = logging.getLogger(__name__)

Entries = list[tuple[int, int, bytes]]


@dataclass(eq=False)
class _Follow:
    stream: LogStream
    on_entries: Callable[[Entries], None]  # runs on the loop thread: must not block
    on_end: Callable[[], None]  # runs on a helper thread


def _always_room(wake: Callable[[], None]) -> bool:
    return True


class LogFollower:
    def __init__(self, *, helpers: int = 8, room: Callable[[Callable[[], None]], bool] = _always_room) -> None:
        """`room(wake)`: whether what is read may be handed over now; if not,
        the reader of it calls `wake()` once it may (LogWriter.has_room)."""
        self._room = room
        self._selector = selectors.DefaultSelector()  # every stream's socket, and the wake-up one
        self._waiting = selectors.DefaultSelector()  # the wake-up socket alone, while there is no room
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._waiting.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._pending: list[_Follow] = []
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._stopping = threading.Event()
        self._loop = threading.Thread(target=self._run, name="log-follower", daemon=True)
        self._helpers = [threading.Thread(target=self._help, name=f"task-helper-{i}", daemon=True)
                         for i in range(helpers)]
        self.following = 0  # streams being read now (for the agent's metrics and benches)

    def start(self) -> None:
        _raise_open_files_limit()
        self._loop.start()
        for helper in self._helpers:
            helper.start()

    def stop(self) -> None:
        """Stop reading; streams stay open until the process ends (their
        containers keep running and are followed again after a restart)."""
        self._stopping.set()
        self._wake()
        for _ in self._helpers:
            self._work.put(None)
        if self._loop.ident is not None:  # started (an agent's start may fail before)
            self._loop.join(timeout=5)

    # ------------------------------------------------------------- interface

    def follow(self, stream: LogStream, *, on_entries: Callable[[Entries], None], on_end: Callable[[], None]) -> None:
        """Read `stream` from now on: `on_entries(entries)` on the loop thread
        as they arrive (in order), then `on_end()` on a helper once it ended;
        the stream is closed by then."""
        with self._lock:
            self._pending.append(_Follow(stream, on_entries, on_end))
        self._wake()

    def submit(self, work: Callable[[], None]) -> None:
        """Run `work` on a helper thread (which may block)."""
        self._work.put(work)

    def call_later(self, delay: float, work: Callable[[], None]) -> None:
        """Run `work` on a helper thread after `delay` seconds."""
        with self._lock:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), work))
        self._wake()

    # ------------------------------------------------------------------ loop

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:
            pass  # already woken: the loop will look at everything anyway

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                reading = self._room(self._wake)
                for key, _events in (self._selector if reading else self._waiting).select(self._timeout()):
                    if key.data is None:
                        self._drain_wake()
                    elif reading:
                        self._read(key.data)
                        # Asked before every read, not once per select: a
                        # thousand streams readable at once would each
                        # hand over a read's worth past the bound.
                        reading = self._room(self._wake)
                    # else: left unread, its socket still readable; selected again once there is room
                self._take_pending()
                self._fire_timers()
            except Exception:  # never let one bad stream end the node's log following
                log.exception("the log follower's loop failed; going on")
                time.sleep(0.1)

    def _timeout(self) -> float | None:
        with self._lock:
            if self._pending:
                return 0
            if not self._timers:
                return None
            return max(0.0, self._timers[0][0] - time.monotonic())

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _take_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for follow in pending:
            try:
                self._selector.register(follow.stream, selectors.EVENT_READ, follow)
                self.following += 1
            except (ValueError, OSError):  # closed before we got to it
                self._end(follow, registered=False)

    def _fire_timers(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = []
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers)[2])
        for work in due:
            self.submit(work)

    def _read(self, follow: _Follow) -> None:
        try:
            entries = follow.stream.read()
            ended = follow.stream.ended
        except Exception:
            log.exception("reading a log stream failed; following it again")
            entries, ended = [], True
        if entries:
            try:
                follow.on_entries(entries)
            except Exception:
                log.exception("handling log entries failed")
        if ended:
            self._end(follow, registered=True)

    def _end(self, follow: _Follow, *, registered: bool) -> None:
        if registered:
            self._selector.unregister(follow.stream)
            self.following -= 1
        follow.stream.close()
        self.submit(follow.on_end)

    # --------------------------------------------------------------- helpers

    def _help(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                break
            try:
                close_old_connections()
                work()
            except Exception:
                log.exception("a task helper's work failed")
                connection.close()
        connection.close()


def _raise_open_files_limit() -> None:
    """Each followed container holds a socket: lift the soft limit of open
    files (often 1024) to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            log.warning("could not raise the open files limit from %s; following many tasks may fail", soft)
