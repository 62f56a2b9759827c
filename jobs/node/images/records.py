"""What a node keeps of images: which repositories needed credentials or
did not (shared by the agents of one engine's host), and each pull's
progress as the job page shows it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from jobs import services
from jobs.images import reference_key
from jobs.node.launcher import PullProgress

class RepositoryRecord:
    """Repositories of one kind, one per line: those pulled with credentials
    that their registry refuses without ("private-images"), or those it
    lets anyone pull ("public-images"). Agents append whole short lines
    (atomic with O_APPEND), so two agents of one host can share the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_engine(cls, engine_id: str, kind: str = "private-images") -> RepositoryRecord:
        engine = re.sub(r"[^A-Za-z0-9]+", "-", engine_id) or "engine"
        return cls(settings.VAR_DIR / kind / f"{settings.PAI_INSTANCE}.{engine}")

    def __contains__(self, image: str) -> bool:
        try:
            known = self.path.read_text().splitlines()
        except FileNotFoundError:
            return False
        return reference_key(image)[0] in known

    def add(self, image: str) -> None:
        if image in self:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as record:
            record.write(reference_key(image)[0] + "\n")


PROGRESS_INTERVAL = 0.5  # seconds between two progress writes of one pull


class PullRecord:
    """One attempt's pull as the job page sees it (jobs/services/pulls.py)."""

    def __init__(self, attempt_id: int, image: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.attempt_id = attempt_id
        self.image = image
        self.clock = clock
        self.latest = PullProgress()
        self._written_at: float | None = None

    def start(self) -> None:
        services.pull_start(attempt_id=self.attempt_id, image=self.image)
        self._written_at = self.clock()

    def progress(self, progress: PullProgress) -> None:
        self.latest = progress
        if not progress.bytes_total:
            # The engine is still naming the layers: those the node has come
            # first ("Already exists"), one by one, then those it fetches,
            # before any download. A count written now ("layers 1/1") would
            # drop back on the page ("layers 2/10") a moment later.
            return
        now = self.clock()
        if self._written_at is None or now - self._written_at >= PROGRESS_INTERVAL:
            services.pull_progress(attempt_id=self.attempt_id, counts=_counts(progress))
            self._written_at = now

    def finish(self, error: str = "") -> None:
        services.pull_finish(attempt_id=self.attempt_id, counts=_counts(self.latest), error=error)


def _counts(progress: PullProgress) -> services.PullCounts:
    return services.PullCounts(layers_done=progress.layers_done, layers_total=progress.layers_total,
                               bytes_done=progress.bytes_done, bytes_total=progress.bytes_total,
                               sizes_pending=progress.sizes_pending)
