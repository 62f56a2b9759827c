"""The node's launches waiting for a launch thread, taken in turn by owner.

A plain first-in first-out line let one user who submitted 500 tasks at
once hold every other user's launch on the node behind all of them: the
node has a few launch threads (runner.LAUNCH_THREADS) and each launch takes
a few hundred ms. Here each owner has a line of their own, and the launch
threads take from the owners in turn (round-robin): another user's launch
waits for at most one launch of each other owner with launches waiting,
while a single user's burst is taken in its own order, at the cost of a
deque and a dictionary look-up, with no database query.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Generic, TypeVar

Item = TypeVar("Item")
Owner = int | None  # None: a launch whose owner the request did not say (sent by an older portal)


class LaunchQueue(Generic[Item]):
    """Round-robin between owners, first-in first-out within one owner's."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        # Owners with launches waiting, the one whose turn is next first.
        self._lines: OrderedDict[Owner, deque[Item]] = OrderedDict()
        self._taken = 0  # launches taken so far: a position in the launch order

    def put(self, owner: Owner, item: Item) -> int:
        """Queue `item` behind `owner`'s others; returns how many launches
        had been taken so far (for bench/submit_to_running.py's breakdown
        and the tests, which count positions in the launch order)."""
        with self._changed:
            line = self._lines.get(owner)
            if line is None:
                # An owner with nothing waiting goes last in the turn: it
                # comes after each owner already waiting, once.
                line = self._lines[owner] = deque()
            line.append(item)
            self._changed.notify()
            return self._taken

    def get(self) -> tuple[Item, int]:
        """The next launch, waiting for one; and its position in the launch
        order (0 for the first one taken)."""
        with self._changed:
            while not self._lines:
                self._changed.wait()
            owner, line = next(iter(self._lines.items()))
            item = line.popleft()
            if line:
                self._lines.move_to_end(owner)  # the others' turns first
            else:
                del self._lines[owner]
            position = self._taken
            self._taken += 1
            return item, position
