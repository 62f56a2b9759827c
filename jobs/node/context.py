"""What the runner and the task watchers get from the node agent: the node,
its engine, the log writer, the log follower and the registry of watchers; never the agent
itself, so they cannot reach into it and nothing here imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from jobs.models import Node
from jobs.node.follower import LogFollower
from jobs.node.launcher import Engine
from jobs.node.logwriter import LogWriter


class Watch(Protocol):
    """A running watcher of one task's container (a TaskWatcher)."""

    def start(self) -> None: ...

    def request_stop(self) -> None: ...


class Watchers:
    """The containers this node follows, one watcher per task attempt.

    `make_watcher(attempt_id, container_id)` makes a watcher (the agent passes
    it in, so this module need not know TaskWatcher); a watcher calls `pop`
    when it is done. Watching starts from the worker (a launch, a stop) and
    from reconciliation at once, hence the lock.
    """

    def __init__(self, make_watcher: Callable[[int, str], Watch]) -> None:
        self._make_watcher = make_watcher
        self._watching: dict[int, Watch] = {}
        self._lock = threading.Lock()

    def watch(self, attempt_id: int, container_id: str) -> None:
        """Follow the container unless a watcher follows it already."""
        with self._lock:
            if attempt_id in self._watching:
                return
            watcher = self._watching[attempt_id] = self._make_watcher(attempt_id, container_id)
        watcher.start()

    def is_watching(self, attempt_id: int) -> bool:
        with self._lock:
            return attempt_id in self._watching

    def get(self, attempt_id: int) -> Watch | None:
        with self._lock:
            return self._watching.get(attempt_id)

    def pop(self, attempt_id: int) -> None:
        """A watcher is done with its container."""
        with self._lock:
            self._watching.pop(attempt_id, None)


@dataclass(eq=False)
class NodeContext:
    """Set once when the agent starts. Only `node` ever changes: the agent
    puts the new row here when it registers the node again (an admin deleted
    it, and the new row has a new id)."""

    node: Node
    engine: Engine
    engine_cpus: int
    writer: LogWriter
    watchers: Watchers
    follower: LogFollower  # the one thread that reads every container's logs, and its helpers
