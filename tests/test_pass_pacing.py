"""Scheduling passes under a burst: one every SCHEDULER_MIN_PASS_GAP
seconds, and after a long pass that started nothing (a long queue that
cannot start) one per ten times as long as it took, at most
SCHEDULER_MAX_PASS_GAP; a pass may come one minimum gap early, so a lone
pass never waits (jobs/queues.py). The pacing on a clock of the tests' own,
then against the tests' real Redis, each test under an instance name of
its own."""

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


def _starts(requests: list[float], seconds: float, *, started_tasks: bool = False) -> list[float]:
    """When passes asked for at `requests` (seconds) start, each taking
    `seconds`, by pass_pacing on a clock of our own."""
    starts: list[float] = []
    last = last_seconds = due = None
    for asked in requests:
        now = max(asked, starts[-1] + seconds if starts else asked)  # one agent: one pass at a time
        delay, due = queues.pass_pacing(now, last, last_seconds, due, min_gap=0.1, max_gap=1.0)
        last = now + delay
        last_seconds = 0.0 if started_tasks else seconds
        starts.append(last)
    return starts


def test_a_stream_of_requests_gets_one_pass_per_gap_after_one_early_pass():
    starts = _starts([0.0] * 21, 0.002)  # a burst: every request as soon as the last pass began
    assert starts[:2] == [0.0, 0.002]  # the second may come a minimum gap early
    gaps = [later - earlier for earlier, later in zip(starts[2:], starts[3:])]
    assert gaps == pytest.approx([0.1] * 18)  # then one every gap: a pass keeps up with the burst, no more
    assert starts[-1] == pytest.approx(1.9)


def test_passes_over_a_long_queue_that_start_nothing_come_ten_times_their_length_apart():
    starts = _starts([0.0] * 6, 0.04)
    assert [round(b - a, 3) for a, b in zip(starts[1:], starts[2:])] == [0.4] * 4
    # 0.5 s passes: ten times that is 5 s, but the maximum gap (1 s) is what
    # they wait for, counted from each one's start (the second comes early).
    assert _starts([0.0] * 3, 0.5) == pytest.approx([0.0, 0.9, 1.9])
    starts = _starts([0.0] * 4, 30.0)  # a very long one: the maximum gap, and it is long over
    assert starts == pytest.approx([0.0, 30.0, 60.0, 90.0])


def test_passes_that_start_tasks_come_a_minimum_gap_apart_however_long_they_take():
    starts = _starts([0.0] * 6, 0.04, started_tasks=True)  # the cluster moves: a freed place must not wait
    assert [round(b - a, 3) for a, b in zip(starts[2:], starts[3:])] == [0.1] * 3


def test_a_lone_pass_never_waits_even_just_after_another_one():
    # A task ends and its pass runs; a job is submitted 30 ms later: its
    # pass starts at once (this waited 70 ms before), and so do lone passes
    # a second apart.
    assert _starts([0.0, 0.03, 1.0, 1.02, 2.0], 0.01) == [0.0, 0.03, 1.0, 1.02, 2.0]


def test_a_first_pass_never_waits(own_instance, sleeps):
    queues.wait_for_pass_slot(0.1, 1.0)
    assert sleeps == []


def test_the_third_pass_of_a_burst_waits_the_minimum_gap_in_redis(own_instance, sleeps):
    for _ in range(2):
        queues.wait_for_pass_slot(0.1, 1.0)
        queues.record_pass_duration(0.002)
    assert sleeps == []
    queues.wait_for_pass_slot(0.1, 1.0)
    assert len(sleeps) == 1 and 0.05 < sleeps[0] <= 0.1


def test_a_pass_right_after_a_long_one_waits_its_gap_less_the_minimum_gap(own_instance, sleeps):
    queues.wait_for_pass_slot(0.1, 1.0)
    queues.record_pass_duration(0.04)
    queues.wait_for_pass_slot(0.1, 1.0)
    assert len(sleeps) == 1 and 0.2 < sleeps[0] <= 0.3


def test_a_pass_long_after_the_last_one_does_not_wait(own_instance, sleeps):
    queues.wait_for_pass_slot(0.1, 1.0)
    queues.record_pass_duration(0.04)
    queues.connection().set(f"{own_instance}:last-pass-started", repr(time.time() - 2), ex=60)
    queues.connection().set(f"{own_instance}:pass-due", repr(time.time() - 2), ex=60)
    queues.wait_for_pass_slot(0.1, 1.0)
    assert sleeps == []


def test_a_real_pass_that_starts_nothing_is_what_paces_the_next(own_instance):
    services.schedule_pass()  # nothing waits: it starts nothing
    assert float(queues.connection().get(f"{own_instance}:last-pass-seconds")) > 0
