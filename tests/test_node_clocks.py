"""Heartbeats by the database's clock: a node agent stamps its node's
heartbeat and judges the others' (declares them lost, picks the nodes a
scheduling pass may use) with jobs/services/db_clock.database_now, so a
host whose clock is off cannot make the cluster lose its nodes. The other
times a process stamps (a task's launch, start and end, usage samples) are
its clock corrected by its measured offset from the database's
(db_clock.now and from_local).

The agent's clock is set ahead or behind with time-machine, in this process
only: the PostgreSQL server keeps the machine's. On SQLite the database is
a library in the process and its clock is the host's, as the portal runs
it on one host: these tests are for PostgreSQL (scripts/test's second pass).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection
from django.utils import timezone

from jobs.models import Node, TaskState
from jobs.services import db_clock, nodes
from jobs.services.db_clock import database_now
from jobs.services.lifecycle import ContainerExit, attempt_record_exit
from jobs.services.scheduling import ready_nodes
from tests.helpers import rows_only_attempt, unique
from tests.test_metrics import make_node

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql",
                                reason="on SQLite the database's clock is this host's (run with PostgreSQL)")

WINDOW = timedelta(seconds=settings.NODE_LOST_AFTER_SECONDS)
SKEW = timedelta(minutes=10)  # far more than NODE_LOST_AFTER_SECONDS either way


@pytest.fixture
def made() -> Iterator[list[Node]]:
    kept: list[Node] = []
    yield kept
    Node.objects.filter(pk__in=[node.pk for node in kept]).delete()


@pytest.fixture
def watched(monkeypatch) -> None:
    """This process has watched heartbeats, without a gap, for longer than
    the window (by the database's clock): silence it did not hear counts."""
    watch, now = nodes._Watch(), database_now()
    for seconds in range(int(WINDOW.total_seconds()) * 2 + 2, 0, -1):
        watch.since(now - timedelta(seconds=seconds))
    monkeypatch.setattr(nodes, "_watch", watch)


def node(made: list[Node], **fields) -> Node:
    made.append(make_node(unique("clock-"), gpus=[], **fields))
    return made[-1]


def test_an_agent_whose_clock_runs_ahead_stamps_the_database_time_and_loses_no_other_node(made, watched):
    other = node(made, last_heartbeat=database_now())  # its agent beat just now
    mine = node(made, last_heartbeat=None)
    with time_machine.travel(database_now() + SKEW, tick=True):
        assert nodes.node_heartbeat(mine.pk)
        lost = nodes.nodes_mark_lost()
        ready = {n.pk for n in ready_nodes()}
    mine.refresh_from_db()
    other.refresh_from_db()
    # Its heartbeat is not ten minutes in the future, where it would stay
    # fresh for ten minutes after its agent died.
    assert abs(mine.last_heartbeat - database_now()) < WINDOW / 2
    assert other.name not in lost and other.status == Node.Status.READY
    assert {mine.pk, other.pk} <= ready


def test_an_agent_whose_clock_runs_behind_is_not_lost_and_still_finds_a_silent_node(made, watched):
    silent = node(made, last_heartbeat=database_now() - 2 * WINDOW)  # its agent died a minute ago
    mine = node(made, last_heartbeat=None)
    with time_machine.travel(database_now() - SKEW, tick=True):
        assert nodes.node_heartbeat(mine.pk)
        ready = {n.pk for n in ready_nodes()}
        nodes.nodes_mark_lost()
    mine.refresh_from_db()
    silent.refresh_from_db()
    # Stamped ten minutes back, it would be declared lost by every other
    # agent's next look, and all its tasks failed.
    assert mine.heartbeat_fresh(database_now())
    assert mine.pk in ready and silent.pk not in ready
    assert silent.status == Node.Status.LOST


def close_to_database_time(at) -> bool:
    return abs(at - database_now()) < 2 * db_clock.TOLERANCE


def test_a_host_clock_that_agrees_with_the_database_is_taken_as_it_is():
    assert db_clock.offset() == timedelta(0)
    local = timezone.now()
    assert db_clock.from_local(local) == local  # the Docker engine's times stored as they are


def test_a_host_clock_off_either_way_is_corrected_by_its_offset_from_the_database():
    for skew in (SKEW, -SKEW):
        with time_machine.travel(database_now() + skew, tick=True):
            # Measured again at once: the clock stepped against the monotonic one.
            assert close_to_database_time(db_clock.now())
            assert close_to_database_time(db_clock.from_local(timezone.now()))
            assert abs(db_clock.offset() + skew) < 2 * db_clock.TOLERANCE
    assert db_clock.offset() == timedelta(0)  # and again once it is set right


def test_a_task_ended_by_an_agent_whose_clock_runs_ahead_ends_on_the_database_clock(alice, made):
    attempt = rows_only_attempt(alice, unique("clock-"), running_on=node(made))
    with time_machine.travel(database_now() + SKEW, tick=True):
        assert attempt_record_exit(attempt.pk, ContainerExit(0))
    attempt.refresh_from_db()
    # Ten minutes in the future, the task would have run for minus ten
    # minutes, and the job's end would sort after every job ended since.
    assert attempt.state == TaskState.SUCCEEDED and close_to_database_time(attempt.finished_at)
