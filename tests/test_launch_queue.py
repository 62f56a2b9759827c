"""LaunchQueue: a node's launches taken in turn by owner (round-robin), each
owner's in their own order. The end-to-end test, with a node agent and
Docker, is test_node_launch_fairness.py."""

from __future__ import annotations

import threading

from jobs.node.launch_queue import LaunchQueue


def taken(line: LaunchQueue[str], count: int) -> list[str]:
    return [line.get()[0] for _ in range(count)]


def test_it_takes_one_owners_launches_in_their_own_order():
    line: LaunchQueue[str] = LaunchQueue()
    for number in range(5):
        line.put(1, f"a{number}")
    assert taken(line, 5) == ["a0", "a1", "a2", "a3", "a4"]


def test_another_owners_launch_waits_for_at_most_one_of_a_long_line():
    line: LaunchQueue[str] = LaunchQueue()
    for number in range(500):
        line.put(1, f"a{number}")
    assert line.put(2, "b0") == 0  # nothing taken yet
    assert taken(line, 3) == ["a0", "b0", "a1"]


def test_it_takes_owners_in_turn_and_an_owner_new_to_the_line_after_the_others_once():
    line: LaunchQueue[str] = LaunchQueue()
    for owner in ("a", "b"):
        for number in range(3):
            line.put(ord(owner), f"{owner}{number}")
    assert taken(line, 1) == ["a0"]
    line.put(ord("c"), "c0")  # behind b (whose turn is next) and a, once each
    assert taken(line, 6) == ["b0", "a1", "c0", "b1", "a2", "b2"]


def test_it_gives_the_positions_of_the_launch_order():
    line: LaunchQueue[str] = LaunchQueue()
    line.put(1, "a0")
    line.put(1, "a1")
    assert line.get() == ("a0", 0)
    assert line.put(2, "b0") == 1  # one launch taken before it was queued
    assert line.get() == ("a1", 1)  # a's turn came first: it was in line before b
    assert line.get() == ("b0", 2)


def test_launches_whose_owner_is_not_known_wait_in_a_line_of_their_own():
    line: LaunchQueue[str] = LaunchQueue()
    for number in range(3):
        line.put(None, f"unknown{number}")
    line.put(7, "b0")
    assert taken(line, 3) == ["unknown0", "b0", "unknown1"]


def test_a_launch_thread_waits_for_a_launch_to_be_queued():
    line: LaunchQueue[str] = LaunchQueue()
    got: list[tuple[str, int]] = []
    thread = threading.Thread(target=lambda: got.append(line.get()))
    thread.start()
    line.put(1, "a0")
    thread.join(30)
    assert got == [("a0", 0)]
