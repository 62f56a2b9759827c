"""The watchers registry the runner and the watchers share: one watcher per
task attempt, however many ask at once; a finished one can be replaced."""

from __future__ import annotations

import threading

from jobs.node.context import Watchers


class FakeWatch:
    def __init__(self) -> None:
        self.started = 0
        self.stops = 0

    def start(self) -> None:
        self.started += 1

    def request_stop(self) -> None:
        self.stops += 1


def test_it_starts_one_watcher_per_attempt_however_many_ask():
    made: list[tuple[int, str]] = []

    def make(attempt_id: int, container_id: str) -> FakeWatch:
        made.append((attempt_id, container_id))
        return FakeWatch()

    watchers = Watchers(make)
    threads = [threading.Thread(target=watchers.watch, args=(7, "c7")) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == [(7, "c7")]
    assert watchers.is_watching(7) and watchers.get(7).started == 1
    assert not watchers.is_watching(8) and watchers.get(8) is None


def test_it_watches_again_once_the_watcher_is_done():
    watchers = Watchers(lambda attempt_id, container_id: FakeWatch())
    watchers.watch(7, "c7")
    first = watchers.get(7)
    watchers.pop(7)
    assert not watchers.is_watching(7)
    watchers.watch(7, "c7")
    assert watchers.get(7) is not first
