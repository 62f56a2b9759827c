"""Silence counts as a lost node only when it was watched for the whole
window (jobs/services/nodes._Watch): a database outage or a stalled process
is a gap in the watching, not silence. The end-to-end case, a PostgreSQL
restart longer than NODE_LOST_AFTER_SECONDS with a job running, is in
tests/test_restarts.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from jobs.services.nodes import _Watch

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _checks(watch: _Watch, seconds: list[float]) -> list[datetime]:
    return [watch.since(T0 + timedelta(seconds=s)) for s in seconds]


def test_an_unbroken_watch_keeps_its_start(settings):
    settings.NODE_LOST_AFTER_SECONDS = 8
    assert _checks(_Watch(), [0, 1, 2, 5, 9, 12.5]) == [T0] * 6


def test_a_gap_longer_than_half_the_window_starts_the_watch_again(settings):
    settings.NODE_LOST_AFTER_SECONDS = 8
    watch = _Watch()
    _checks(watch, [0, 1, 2])
    # The database was away from 2 s to 14 s: no check could run.
    assert watch.since(T0 + timedelta(seconds=14)) == T0 + timedelta(seconds=14)
    assert watch.since(T0 + timedelta(seconds=15)) == T0 + timedelta(seconds=14)


def test_a_clock_going_back_starts_the_watch_again(settings):
    settings.NODE_LOST_AFTER_SECONDS = 8
    watch = _Watch()
    _checks(watch, [10, 11])
    assert watch.since(T0 + timedelta(seconds=5)) == T0 + timedelta(seconds=5)
