"""Scheduling passes under a burst: at most every SCHEDULER_MIN_PASS_GAP
seconds, and after a long pass that started nothing (a long queue that
cannot start) ten times as long as it took, at most SCHEDULER_MAX_PASS_GAP
(jobs/queues.py). Against the tests' real Redis, each test under an
instance name of its own."""

from __future__ import annotations

import time

import pytest

from jobs import queues, services

pytestmark = pytest.mark.services


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """What wait_for_pass_slot asks time.sleep for, instead of sleeping."""
    asked: list[float] = []
    monkeypatch.setattr(queues.time, "sleep", asked.append)
    return asked


def test_the_gap_is_the_minimum_after_a_short_pass_and_grows_with_a_long_one_up_to_the_maximum():
    assert queues.pass_gap(None, min_gap=0.1, max_gap=1.0) == 0.1  # no pass timed yet
    assert queues.pass_gap(0.004, min_gap=0.1, max_gap=1.0) == 0.1
    assert queues.pass_gap(0.03, min_gap=0.1, max_gap=1.0) == pytest.approx(0.3)
    assert queues.pass_gap(5.0, min_gap=0.1, max_gap=1.0) == 1.0
    assert queues.pass_gap(0.03, min_gap=0.5, max_gap=1.0) == 0.5  # the minimum wins over the share


def test_a_first_pass_never_waits(own_instance, sleeps):
    queues.wait_for_pass_slot(0.1, 1.0)
    assert sleeps == []


def test_a_pass_right_after_a_short_one_waits_the_minimum_gap(own_instance, sleeps):
    queues.wait_for_pass_slot(0.1, 1.0)
    queues.record_pass_duration(0.002)
    queues.wait_for_pass_slot(0.1, 1.0)
    assert len(sleeps) == 1 and 0.05 < sleeps[0] <= 0.1


def test_a_pass_right_after_a_long_one_waits_ten_times_as_long_as_it_took(own_instance, sleeps):
    queues.wait_for_pass_slot(0.1, 1.0)
    queues.record_pass_duration(0.04)
    queues.wait_for_pass_slot(0.1, 1.0)
    assert len(sleeps) == 1 and 0.3 < sleeps[0] <= 0.4
    queues.record_pass_duration(30.0)  # a very long one: the maximum gap
    queues.wait_for_pass_slot(0.1, 1.0)
    assert len(sleeps) == 2 and 0.9 < sleeps[1] <= 1.0


def test_a_pass_long_after_the_last_one_does_not_wait(own_instance, sleeps):
    queues.wait_for_pass_slot(0.1, 1.0)
    queues.record_pass_duration(0.04)
    queues.connection().set(f"{own_instance}:last-pass-started", repr(time.time() - 2), ex=60)
    queues.wait_for_pass_slot(0.1, 1.0)
    assert sleeps == []


def test_a_pass_right_after_a_long_one_that_started_tasks_waits_only_the_minimum_gap(own_instance, sleeps):
    queues.wait_for_pass_slot(0.1, 1.0)
    queues.record_pass_duration(0.04, started_tasks=True)  # the cluster moves: a freed place must not wait
    queues.wait_for_pass_slot(0.1, 1.0)
    assert len(sleeps) == 1 and 0.05 < sleeps[0] <= 0.1


def test_a_real_pass_that_starts_nothing_is_what_paces_the_next(own_instance):
    services.schedule_pass()  # nothing waits: it starts nothing
    assert float(queues.connection().get(f"{own_instance}:last-pass-seconds")) > 0
