"""The node's launches waiting for a launch thread, taken in turn by owner.

A plain first-in first-out line let one user who submitted 500 tasks at
once hold every other user's launch on the node behind all of them: the
node has a few launch threads (runner.LAUNCH_THREADS) and each launch takes
a few hundred ms. Here each owner has a line of their own, and the launch
threads take from the owners in turn (round-robin): another user's launch
waits for at most one launch of each other owner with launches waiting,
while a single user's burst is taken in its own order, at the cost of a
deque and a dictionary look-up, with no database query.

Turns alone do not keep a thread free for others: a launch may hold its
thread for a while (staging a codeDir or a dataDir of up to
DATA_DIR_MAX_MB from storage), and one user's launches that took every
thread while nobody else waited held them all when another user's came. So
one owner may hold at most `per_owner` launches at once: with one thread
more than that, another owner's launch always finds one soon.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, deque
from typing import Generic, NamedTuple, TypeVar

Item = TypeVar("Item")
Owner = int | None  # None: a launch whose owner the request did not say (sent by an older portal)


class Taken(NamedTuple, Generic[Item]):
    item: Item
    owner: Owner  # to give back with `done` once the launch is over
    position: int  # in the launch order: 0 for the first one taken


class LaunchQueue(Generic[Item]):
    """Round-robin between owners, first-in first-out within one owner's;
    at most `per_owner` launches of one owner taken and not yet done (0: no
    limit)."""

    def __init__(self, per_owner: int = 0) -> None:
        self._changed = threading.Condition()
        # Owners with launches waiting, the one whose turn is next first.
        self._lines: OrderedDict[Owner, deque[Item]] = OrderedDict()
        self._taken = 0  # launches taken so far: a position in the launch order
        self._per_owner = per_owner
        self._under_way: Counter[Owner] = Counter()  # taken, not yet done

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

    def get(self) -> Taken[Item]:
        """The next launch, waiting for one that an owner under their limit
        has queued. The caller gives it back with `done` when it is over."""
        with self._changed:
            while (owner := self._next_owner()) is _NOBODY:
                self._changed.wait()
            line = self._lines[owner]
            item = line.popleft()
            if line:
                self._lines.move_to_end(owner)  # the others' turns first
            else:
                del self._lines[owner]
            self._under_way[owner] += 1
            position = self._taken
            self._taken += 1
            return Taken(item, owner, position)

    def done(self, owner: Owner) -> None:
        """A launch `get` gave is over (or set aside): its owner may have
        another one under way."""
        with self._changed:
            self._under_way[owner] -= 1
            if self._under_way[owner] <= 0:
                del self._under_way[owner]
            self._changed.notify()

    def _next_owner(self) -> Owner | object:
        """Whose launch is next: the first owner in turn under their limit.
        An owner at it keeps their place, and goes first once under it."""
        for owner in self._lines:
            if not self._per_owner or self._under_way[owner] < self._per_owner:
                return owner
        return _NOBODY


_NOBODY = object()  # no owner may take a launch now
