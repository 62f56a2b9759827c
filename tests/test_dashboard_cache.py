"""The dashboard's cache of each window (jobs/services/dashboard.py
`dashboard_figures`): when a window's figures run out, one caller computes
them while the others wait for its answer or are shown the figures before,
across threads against the tests' real Redis (the portal's cache backend:
each web process's threads and every other process share it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.db import connection
from django.test import override_settings

from jobs.services import dashboard

SLOW = 0.5  # seconds each computation takes here (a busy week's takes 1.5 s on SQLite)


def _lock(hours: int) -> str:
    return f"{dashboard.cache_key(hours)}:computing"


@pytest.fixture
def computations(monkeypatch) -> Iterator[list[float]]:
    """The start time of every real computation of figures, each made SLOW
    seconds slower so that callers overlap it; the window's cache emptied."""
    assert isinstance(caches["default"], RedisCache), "the portal's cache is Redis; test against it"
    started: list[float] = []
    compute = dashboard._figures

    def slow(hours: int, now: Any) -> dict[str, Any]:
        started.append(time.monotonic())
        time.sleep(SLOW)
        return compute(hours, now)

    monkeypatch.setattr(dashboard, "_figures", slow)
    for hours in dashboard.WINDOWS:
        cache.delete_many([dashboard.cache_key(hours), _lock(hours)])
    yield started
    for hours in dashboard.WINDOWS:
        cache.delete_many([dashboard.cache_key(hours), _lock(hours)])


def _at_once(count: int, hours: int) -> list[tuple[float, dict[str, Any]]]:
    """(seconds taken, figures) of `count` threads asking for a window at once."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def ask(i: int) -> None:
        try:
            barrier.wait()
            started = time.monotonic()
            figures = dashboard.dashboard_figures(hours=hours)
            results[i] = (time.monotonic() - started, figures)
        except BaseException as error:  # noqa: BLE001  (reported below)
            results[i] = error
        finally:
            connection.close()  # each thread's own

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(isinstance(r, BaseException) or r is None for r in results), results
    return results


@override_settings(DASHBOARD_CACHE_SECONDS=60)
def test_many_admins_at_once_on_an_empty_cache_compute_a_window_once(computations):
    answers = _at_once(8, 168)
    assert len(computations) == 1
    figures = answers[0][1]
    assert all(f == figures for _, f in answers)  # the others waited for the computer's
    assert cache.get(_lock(168)) is None  # freed, not left to lapse


@override_settings(DASHBOARD_CACHE_SECONDS=60)
def test_when_the_figures_run_out_one_computes_and_the_others_get_the_figures_before(computations):
    dashboard.dashboard_figures(hours=6)
    kept = cache.get(dashboard.cache_key(6))
    cache.set(dashboard.cache_key(6), {**kept, "computed": kept["computed"] - 61}, timeout=300)  # ran out
    assert len(computations) == 1
    answers = _at_once(8, 6)
    assert len(computations) == 2
    slow, fast = [a for a in answers if a[0] >= SLOW], [a for a in answers if a[0] < SLOW]
    assert len(slow) == 1 and len(fast) == 7, [a[0] for a in answers]
    assert all(f == dashboard._with_free(kept["figures"], None) for _, f in fast)  # at once, the figures before
    assert cache.get(dashboard.cache_key(6))["computed"] > kept["computed"]
    dashboard.dashboard_figures(hours=6)
    assert len(computations) == 2  # fresh again


@override_settings(DASHBOARD_CACHE_SECONDS=60)
def test_a_computer_that_died_holding_the_lock_delays_the_others_only_until_it_lapses(computations):
    assert cache.add(_lock(24), "a process that died", timeout=1)
    started = time.monotonic()
    dashboard.dashboard_figures(hours=24)
    waited = time.monotonic() - started - SLOW
    assert len(computations) == 1
    assert 0.2 < waited < 2.5, waited  # Redis lets the lock lapse after its second


@override_settings(DASHBOARD_CACHE_SECONDS=60)
def test_a_computation_that_fails_frees_the_window_at_once(computations, monkeypatch):
    def broken(hours: int, now: Any) -> dict[str, Any]:
        raise RuntimeError("the database went away")

    slow = dashboard._figures
    monkeypatch.setattr(dashboard, "_figures", broken)
    with pytest.raises(RuntimeError):
        dashboard.dashboard_figures(hours=6)
    assert cache.get(_lock(6)) is None
    monkeypatch.setattr(dashboard, "_figures", slow)
    started = time.monotonic()
    dashboard.dashboard_figures(hours=6)
    assert time.monotonic() - started < SLOW + 1 and len(computations) == 1
