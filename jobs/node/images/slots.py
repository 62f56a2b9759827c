"""Each user's share of a node's image pulls (finding 31)."""

from __future__ import annotations

import threading

class PullSlots:
    """At most `per_owner` pulls of one user under way on a node at once
    (finding 31). A launch waits for its pull on one of the node's few
    launch threads (runner.LAUNCH_THREADS): without a share, one user's job
    of that many tasks on a slow or trickling registry held every launch of
    the node, every other user's included. A launch over the share is set
    aside, not blocked, and handed back when a pull of its owner ends."""

    def __init__(self, per_owner: int) -> None:
        self.per_owner = per_owner
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}
        self._waiting: dict[int, list[int]] = {}  # owner -> attempts set aside, oldest first

    def take_or_wait(self, owner: int, attempt_id: int) -> bool:
        """A slot for this pull (True), or the attempt set aside (False);
        in one step, so that a pull ending meanwhile cannot miss it."""
        with self._lock:
            if self.per_owner <= 0 or self._held.get(owner, 0) < self.per_owner:
                self._held[owner] = self._held.get(owner, 0) + 1
                return True
            self._waiting.setdefault(owner, []).append(attempt_id)
            return False

    def release(self, owner: int) -> int | None:
        """A pull of `owner` ended: the attempt of theirs to launch again, if any."""
        with self._lock:
            self._held[owner] = max(0, self._held.get(owner, 0) - 1)
            waiting = self._waiting.get(owner)
            if not waiting:
                return None
            attempt_id = waiting.pop(0)
            if not waiting:
                del self._waiting[owner]
            return attempt_id

    def withdraw(self, attempt_id: int) -> bool:
        """Take a set-aside attempt back (its task was stopped); False if it is not waiting."""
        with self._lock:
            for owner, waiting in self._waiting.items():
                if attempt_id in waiting:
                    waiting.remove(attempt_id)
                    if not waiting:
                        del self._waiting[owner]
                    return True
        return False
