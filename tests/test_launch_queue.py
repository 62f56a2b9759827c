"""LaunchQueue: a node's launches taken in turn by owner (round-robin), each
owner's in their own order, at most `per_owner` of one owner's under way.
The end-to-end tests, with a node agent and Docker, are in
test_node_launch_fairness.py."""

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
    assert line.get() == ("a0", 1, 0)  # (launch, owner, position)
    assert line.put(2, "b0") == 1  # one launch taken before it was queued
    assert line.get() == ("a1", 1, 1)  # a's turn came first: it was in line before b
    assert line.get() == ("b0", 2, 2)


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
    assert got == [("a0", 1, 0)]


def test_an_owner_at_their_limit_waits_while_others_launch_and_goes_first_once_under_it():
    line: LaunchQueue[str] = LaunchQueue(per_owner=2)
    for number in range(4):
        line.put(1, f"a{number}")
    assert taken(line, 2) == ["a0", "a1"]  # a's two under way (staging, say)
    line.put(2, "b0")
    line.put(2, "b1")
    assert taken(line, 1) == ["b0"]  # a's turn, but a is at the limit
    line.done(1)
    assert taken(line, 2) == ["a2", "b1"]  # a kept its place in the turn


def test_a_launch_thread_waits_while_the_only_owner_with_launches_is_at_their_limit():
    line: LaunchQueue[str] = LaunchQueue(per_owner=1)
    line.put(1, "a0")
    line.put(1, "a1")
    first = line.get()
    got: list[str] = []
    thread = threading.Thread(target=lambda: got.append(line.get().item))
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and got == []  # a1 waits for a0's launch to be over
    line.done(first.owner)
    thread.join(30)
    assert got == ["a1"]


def test_without_a_limit_one_owner_takes_every_launch():
    line: LaunchQueue[str] = LaunchQueue()
    for number in range(10):
        line.put(1, f"a{number}")
    assert taken(line, 10) == [f"a{number}" for number in range(10)]
