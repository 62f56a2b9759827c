"""The node agent's lines while the database is away: the log writer holds
at most LOG_WRITER_QUEUE_BYTES of them, and the log follower reads no more
from the engine meanwhile (Docker keeps them in its json-file log). Once the
database is back, every line is stored once and in order.

The database is made unavailable for real: this test's connection holds its
write lock (SQLite's, taken at BEGIN IMMEDIATE; PostgreSQL: the log lines'
table). The containers are real busybox ones on the real engine; each waits
for the test's word (a file made by `docker exec`) before it prints, so that
its lines come while the database is away.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from jobs import services
from jobs.models import LogCursor, LogLine, Node, Stream, TaskAttempt, TaskState
from jobs.node import launcher
from jobs.node.agent import NodeAgent
from jobs.node.context import NodeContext
from jobs.node.launcher.docker import DockerEngine
from tests.cluster import wait_for
from tests.helpers import BUSYBOX_IMAGE, log_writes_locked, rows_only_attempt, settled

pytestmark = pytest.mark.services
BOUND = 256 * 1024  # LOG_WRITER_QUEUE_BYTES here
LINES = 40_000  # of 100 bytes: 4 MB, sixteen times the bound
# Prints LINES numbered lines of 100 bytes (with the newline) once /tmp/go exists.
PRINTER = ("while [ ! -e /tmp/go ]; do sleep 0.05; done; x=$(printf '%088d' 0 | tr 0 x); i=0; "
           f"while [ $i -lt {LINES} ]; do printf 'line %06d %s\\n' $i \"$x\"; i=$((i+1)); done")


def numbered_lines(count: int = LINES) -> list[bytes]:
    return [b"line %06d " % i + b"x" * 88 for i in range(count)]


@pytest.fixture
def engine(docker_engine: str) -> Iterator[DockerEngine]:
    """The real engine; what a test leaves on it is removed by its label."""
    real = DockerEngine(docker_engine)
    yield real
    for left in real.containers({launcher.LABEL_INSTANCE: django_settings.PAI_INSTANCE, "pai.test": "logq"}):
        real.remove(left.id)


def printer(engine: DockerEngine) -> str:
    """A running container that prints LINES lines once told to (`go`)."""
    made = engine.api.create_container(BUSYBOX_IMAGE, ["sh", "-c", PRINTER],
                                       labels={launcher.LABEL_INSTANCE: django_settings.PAI_INSTANCE,
                                               "pai.test": "logq"})
    engine.api.start(made["Id"])
    return made["Id"]


def go(engine: DockerEngine, container_id: str) -> None:
    assert engine.exec_status(container_id, ["touch", "/tmp/go"]) == 0


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
def start_agent(settings, node, engine) -> Iterator[Callable[[], NodeAgent]]:
    """A node agent's log path as the agent wires it (its log writer, its
    log follower asking the writer for room, the watchers of its tasks),
    started as the agent starts it."""
    settings.LOG_WRITER_QUEUE_BYTES = BOUND
    started: list[NodeAgent] = []

    def start() -> NodeAgent:
        info = services.NodeInfo(name=node.name, address=node.address, docker_host=node.docker_host,
                                 engine_id="", cpus=node.cpus, memory_mb=node.memory_mb)
        made = NodeAgent(info, engine, 1)
        made.context = NodeContext(node=node, engine=engine, engine_cpus=1, writer=made.writer,
                                   watchers=made.watchers, follower=made.follower)
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


def held(agent: NodeAgent) -> int:
    """What the agent's log writer holds of the lines handed to it."""
    return agent.writer._held


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


def following(agent: NodeAgent, attempt: TaskAttempt, container_id: str) -> None:
    """Watch `attempt`'s container (before the database goes away: the
    watcher reads its stored cursors first)."""
    agent.watchers.watch(attempt.pk, container_id)
    wait_for(lambda: agent.follower.following == 1, what="the container's logs to be followed")


@contextlib.contextmanager
def database_away_writer_full(agent: NodeAgent, engine: DockerEngine, attempt: TaskAttempt) -> Iterator[str]:
    """A printing container of `attempt`'s, followed by `agent`, whose lines
    have filled the agent's log writer while the database is away (the
    block runs so); the container's id."""
    container = printer(engine)
    following(agent, attempt, container)
    with log_writes_locked():
        go(engine, container)
        wait_for(lambda: full(agent), what="the log writer to be full")
        yield container


# -------------------------------------------------------------------- tests


def test_the_agent_holds_no_more_than_its_writer_may_while_the_database_is_away(start_agent, engine, attempt):
    agent = start_agent()
    with database_away_writer_full(agent, engine, attempt):
        # The bound and one read past it; not the 4 MB the task printed.
        assert settled(lambda: held(agent)) < 2 * BOUND
        assert not LogLine.objects.filter(attempt=attempt).exists()
    assert_stored_once_in_order(attempt)
    assert held(agent) == 0


def test_notes_barriers_and_timers_go_on_while_the_writer_is_full(start_agent, engine, attempt):
    agent = start_agent()
    with database_away_writer_full(agent, engine, attempt):
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
    with database_away_writer_full(agent, engine, attempt) as container:
        wait_for(lambda: not engine.state(container).running, timeout=60, what="the container to end")
        time.sleep(0.5)
        assert TaskAttempt.objects.get(pk=attempt.pk).state == TaskState.RUNNING
    wait_for(lambda: TaskAttempt.objects.get(pk=attempt.pk).state == TaskState.SUCCEEDED, timeout=120,
             what="the task's exit to be recorded")
    assert_stored_once_in_order(attempt)
    assert not agent.watchers.is_watching(attempt.pk)


def test_an_agent_stopped_while_its_follower_waits_for_room_leaves_the_rest_to_the_next_agent(
        start_agent, engine, attempt):
    first = start_agent()
    with database_away_writer_full(first, engine, attempt) as container:
        began = time.monotonic()
        first.follower.stop()  # as the agent's shutdown does, before the writer's
        assert time.monotonic() - began < 2, "the follower's loop was stuck waiting for room"
        stopping = threading.Thread(target=first.writer.stop)
        stopping.start()
        time.sleep(0.5)
    stopping.join(60)
    assert not stopping.is_alive()
    assert 0 < LogCursor.objects.get(attempt=attempt, stream=Stream.STDOUT).next_seq < LINES
    second = start_agent()
    second.watchers.watch(attempt.pk, container)
    assert_stored_once_in_order(attempt)
