"""The node agent's lines while the database is away: the log writer holds
at most LOG_WRITER_QUEUE_BYTES of them, and the log follower reads no more
from the engine meanwhile (the engine keeps them, as json-file logs do).
Once the database is back, every line is stored once and in order.

The database is made unavailable for real: this test's connection holds its
write lock (SQLite's, taken at BEGIN IMMEDIATE; PostgreSQL: the log lines'
table). The engine is the test's own at the agent's interface (Engine):
Docker needs a daemon, and what matters here is what a daemon does with a
followed log nobody reads: it keeps the entries and waits on its socket.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services
from jobs.models import LogCursor, LogLine, Node, Stream, TaskAttempt, TaskState
from jobs.node.agent import NodeAgent
from jobs.node.context import NodeContext
from jobs.node.launcher import ContainerState
from jobs.node.launcher.docker_logs import SocketLogStream
from tests.cluster import wait_for
from tests.helpers import log_writes_locked, rows_only_attempt

BOUND = 256 * 1024  # LOG_WRITER_QUEUE_BYTES here
LINES = 40_000  # of 100 bytes: 4 MB, sixteen times the bound
FIRST_NS = 1_795_507_308_000_000_000


# ------------------------------------------------- an engine that keeps logs


@dataclass(eq=False)
class _Container:
    entries: list[tuple[int, int, bytes]]  # (stream, ns, payload), as json-file keeps them
    running: bool = True
    served: int = 0  # bytes sent on its followed logs, over all connections
    connections: list[socket.socket] = field(default_factory=list)


class KeptLogsEngine:
    """The few Engine calls a TaskWatcher makes, with logs answered as
    Docker answers GET /containers/<id>/logs: a raw stream of frames on a
    socket, from the second of `since_ns` on, sent as fast as the reader
    takes them (sendall blocks when it does not)."""

    def __init__(self) -> None:
        self._containers: dict[str, _Container] = {}
        self._changed = threading.Condition()

    def run(self, container_id: str) -> None:
        self._containers[container_id] = _Container([])

    def print(self, container_id: str, lines: list[bytes]) -> None:
        """The container prints `lines` (numbered on from what it printed)."""
        with self._changed:
            entries = self._containers[container_id].entries
            first = len(entries)
            entries += [(Stream.STDOUT, FIRST_NS + (first + i) * 1000, line + b"\n") for i, line in enumerate(lines)]
            self._changed.notify_all()

    def served(self, container_id: str) -> int:
        return self._containers[container_id].served

    def end(self, container_id: str) -> None:
        with self._changed:
            self._containers[container_id].running = False
            self._changed.notify_all()

    def break_connections(self, container_id: str) -> None:
        """As an engine restart does: the followed logs end mid-way."""
        for sock in self._containers[container_id].connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # ended already

    def close(self) -> None:
        for container_id in self._containers:
            self.end(container_id)
            self.break_connections(container_id)

    # --------------------------------------------------- the Engine interface

    def open_logs(self, container_id: str, *, since_ns: int = 0, follow: bool = True) -> SocketLogStream:
        ours, theirs = socket.socketpair()
        container = self._containers[container_id]
        container.connections.append(theirs)
        threading.Thread(target=self._serve, args=(theirs, container, since_ns, follow), daemon=True).start()
        return SocketLogStream(ours)

    def state(self, container_id: str) -> ContainerState | None:
        container = self._containers[container_id]
        return ContainerState(id=container_id, running=container.running, exit_code=None if container.running else 0,
                              oom_killed=False, error="", started_at=None,
                              finished_at=None if container.running else timezone.now(), labels={})

    def exec_status(self, container_id: str, command: list[str]) -> int | None:
        return None

    def signal(self, container_id: str, signal: str = "SIGTERM") -> None:
        pass

    def remove(self, container_id: str) -> None:
        pass

    def _serve(self, sock: socket.socket, container: _Container, since_ns: int, follow: bool) -> None:
        since_second = since_ns - since_ns % 1_000_000_000  # Docker's `since` is whole seconds
        with self._changed:
            done = sum(1 for _, ns, _ in container.entries if ns < since_second)
        try:
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n")
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: done < len(container.entries)
                                           or not (follow and container.running))
                    chunk = container.entries[done:done + 500]
                if not chunk:
                    break
                body = b"".join(_frame(stream, ns, payload) for stream, ns, payload in chunk)
                sock.sendall(body)
                container.served += len(body)
                done += len(chunk)
        except OSError:
            pass  # broken (break_connections): the reader sees its end
        finally:
            sock.close()


def _frame(stream: int, ns: int, payload: bytes) -> bytes:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 1_000_000_000)).encode()
    text = b"%s.%09dZ %s" % (stamp, ns % 1_000_000_000, payload)
    return struct.pack(">BxxxI", stream, len(text)) + text


def numbered_lines(count: int = LINES) -> list[bytes]:
    return [b"line %06d " % i + b"x" * 88 for i in range(count)]  # 100 bytes each, with the newline


# ---------------------------------------------------------------- the agent


def stop_logs(agent: NodeAgent) -> None:
    """As the agent's shutdown stops its log path: the follower, then the writer."""
    agent.follower.stop()
    agent.writer.stop()


@pytest.fixture
def node() -> Iterator[Node]:
    """A node nothing is placed on; its agent is the test's."""
    made = Node.objects.create(name=f"t-logq-{uuid.uuid4().hex[:8]}", address="127.0.0.2",
                               docker_host="unix:///nonexistent", cpus=1, memory_mb=1, schedulable=False,
                               last_heartbeat=timezone.now() + timedelta(hours=1))
    yield made
    TaskAttempt.objects.filter(node=made).update(state=TaskState.SUCCEEDED)


@pytest.fixture
def engine() -> Iterator[KeptLogsEngine]:
    made = KeptLogsEngine()
    yield made
    made.close()


@pytest.fixture
def start_agent(settings, node, engine) -> Iterator[Callable[[], NodeAgent]]:
    """A node agent's log path as the agent wires it (its log writer, its
    log follower asking the writer for room, the watchers of its tasks),
    started as the agent starts it."""
    settings.LOG_WRITER_QUEUE_BYTES = BOUND
    started: list[NodeAgent] = []

    def start() -> NodeAgent:
        info = services.NodeInfo(name=node.name, address=node.address, docker_host=node.docker_host,
                                 engine_id="", cpus=node.cpus, memory_mb=node.memory_mb)
        made = NodeAgent(info, engine, 1)  # type: ignore[arg-type]
        made.context = NodeContext(node=node, engine=engine, engine_cpus=1,  # type: ignore[arg-type]
                                   writer=made.writer, watchers=made.watchers, follower=made.follower)
        made.writer.start()
        made.follower.start()
        started.append(made)
        return made

    yield start
    for agent in started:
        stop_logs(agent)


@pytest.fixture
def attempt(alice, node) -> TaskAttempt:
    return rows_only_attempt(alice, f"logq{uuid.uuid4().hex[:8]}", running_on=node)


def stalled(read: Callable[[], int], *, quiet: float = 1.0, timeout: float = 30.0) -> int:
    """`read()` once it has not changed for `quiet` seconds."""
    last, since = read(), time.monotonic()
    deadline = since + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"still changing after {timeout} s: {last}")


def stored_lines(attempt: TaskAttempt) -> list[tuple[int, str]]:
    return list(LogLine.objects.filter(attempt=attempt, stream=Stream.STDOUT).order_by("seq")
                .values_list("seq", "text"))


def platform_notes(attempt: TaskAttempt) -> list[str]:
    return [text.split("Z ", 1)[1] for text in LogLine.objects.filter(attempt=attempt, stream=Stream.PLATFORM)
            .order_by("seq").values_list("text", flat=True)]


def _no_wake() -> None:
    pass


def full(agent: NodeAgent) -> bool:
    return not agent.writer.has_room(_no_wake)


def assert_stored_once_in_order(attempt: TaskAttempt, count: int = LINES) -> None:
    def all_stored() -> bool:
        cursor = LogCursor.objects.filter(attempt=attempt, stream=Stream.STDOUT).first()
        return cursor is not None and cursor.next_seq >= count

    wait_for(all_stored, timeout=120, what=f"{count} lines to be stored")
    expected = [(i, line.decode()) for i, line in enumerate(numbered_lines(count))]
    assert stored_lines(attempt) == expected


def following(agent: NodeAgent, engine: KeptLogsEngine, attempt: TaskAttempt, container_id: str) -> None:
    """Watch a new container of `attempt`'s (before the database goes away:
    the watcher reads its stored cursors first)."""
    engine.run(container_id)
    agent.watchers.watch(attempt.pk, container_id)
    wait_for(lambda: agent.follower.following == 1, what="the container's logs to be followed")


# -------------------------------------------------------------------- tests


def test_the_agent_takes_no_more_from_the_engine_than_its_writer_may_hold_while_the_database_is_away(
        start_agent, engine, attempt):
    agent = start_agent()
    following(agent, engine, attempt, "c-busy")
    with log_writes_locked():
        engine.print("c-busy", numbered_lines())
        taken = stalled(lambda: engine.served("c-busy"))
        # The bound, one read past it (256 KB) and what the socket holds; not the 4 MB the task printed.
        assert taken < 4 * BOUND, f"the agent took {taken} bytes off the engine while nothing could be stored"
    assert_stored_once_in_order(attempt)


def test_a_stream_the_engine_broke_while_the_writer_was_full_is_followed_again_from_its_cursor(
        start_agent, engine, attempt):
    agent = start_agent()
    following(agent, engine, attempt, "c-again")
    with log_writes_locked():
        engine.print("c-again", numbered_lines())
        wait_for(lambda: full(agent), what="the log writer to be full")
        engine.break_connections("c-again")  # the engine restarted meanwhile
        time.sleep(0.5)
    # Read again from where the lines handed over end (the engine sends the
    # whole second again; what is stored or queued already is skipped).
    assert_stored_once_in_order(attempt)
    assert agent.follower.following == 1


def test_notes_barriers_and_timers_go_on_while_the_writer_is_full(start_agent, engine, attempt):
    agent = start_agent()
    following(agent, engine, attempt, "c-notes")
    with log_writes_locked():
        engine.print("c-notes", numbered_lines())
        wait_for(lambda: full(agent), what="the log writer to be full")
        # A launch's notes from other threads are taken at once ...
        senders = [threading.Thread(target=lambda n=n: [agent.writer.note(attempt.pk, f"t{n} {i}") for i in range(20)])
                   for n in range(3)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(5)
            assert not sender.is_alive(), "a note waited for room"
        # ... a barrier waits no longer than it was told to ...
        began = time.monotonic()
        assert not agent.writer.barrier(timeout=0.5)
        assert time.monotonic() - began < 5
        # ... and the follower's loop, which reads nothing now, still fires
        # its timers (a stop's SIGKILL after the grace period).
        fired = threading.Event()
        agent.follower.call_later(0.05, fired.set)
        assert fired.wait(5)
        assert full(agent)
    assert agent.writer.barrier(timeout=60)
    assert_stored_once_in_order(attempt)
    notes = platform_notes(attempt)
    assert sorted(notes) == sorted(f"t{n} {i}" for n in range(3) for i in range(20))
    assert [note for note in notes if note.startswith("t1 ")] == [f"t1 {i}" for i in range(20)]


def test_a_container_that_ends_while_the_writer_is_full_is_recorded_once_its_lines_are_stored(
        start_agent, engine, attempt):
    agent = start_agent()
    following(agent, engine, attempt, "c-ends")
    with log_writes_locked():
        engine.print("c-ends", numbered_lines())
        wait_for(lambda: full(agent), what="the log writer to be full")
        engine.end("c-ends")
        time.sleep(0.5)
        assert TaskAttempt.objects.get(pk=attempt.pk).state == TaskState.RUNNING
    wait_for(lambda: TaskAttempt.objects.get(pk=attempt.pk).state == TaskState.SUCCEEDED, timeout=120,
             what="the task's exit to be recorded")
    assert_stored_once_in_order(attempt)
    assert not agent.watchers.is_watching(attempt.pk)


def test_an_agent_stopped_while_its_follower_waits_for_room_leaves_the_rest_to_the_next_agent(
        start_agent, engine, attempt):
    first = start_agent()
    following(first, engine, attempt, "c-stop")
    with log_writes_locked():
        engine.print("c-stop", numbered_lines())
        wait_for(lambda: full(first), what="the log writer to be full")
        began = time.monotonic()
        first.follower.stop()  # as the agent's shutdown does, before the writer's
        assert time.monotonic() - began < 2, "the follower's loop was stuck waiting for room"
        stopping = threading.Thread(target=first.writer.stop)
        stopping.start()
        time.sleep(0.5)
    stopping.join(60)
    assert not stopping.is_alive()
    assert 0 < LogCursor.objects.get(attempt=attempt, stream=Stream.STDOUT).next_seq < LINES
    engine.break_connections("c-stop")  # gone with the first agent's process
    second = start_agent()
    second.watchers.watch(attempt.pk, "c-stop")
    assert_stored_once_in_order(attempt)
