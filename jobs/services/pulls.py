"""Image pulls: how far a task's image has come onto its node.

The node agent writes (jobs/node/images/, from the engine's pull events,
at most about twice a second); the job page reads. A pull row belongs to one
task attempt, so it is seen by whoever may see that attempt's job, and no one
else: two jobs waiting on one image on one node each get their own row.

Each write is a conditional UPDATE on a PULLING row: news that arrives after
the pull ended (or after a relaunch started it over) changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count
from django.utils import timezone

from jobs.models import ImagePull, Job, TaskAttempt, TaskState


@dataclass(frozen=True)
class PullCounts:
    layers_done: int = 0
    layers_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    sizes_pending: int = 0  # layers to download whose size is not known yet

    def fields(self) -> dict[str, int]:
        return {"layers_done": self.layers_done, "layers_total": self.layers_total,
                "bytes_done": self.bytes_done, "bytes_total": self.bytes_total, "sizes_pending": self.sizes_pending}


def pull_start(*, attempt_id: int, image: str) -> None:
    """A pull for this attempt begins (again, if its launch was tried before)."""
    node_id = TaskAttempt.objects.filter(pk=attempt_id).values_list("node_id", flat=True).first()
    now = timezone.now()
    ImagePull.objects.update_or_create(attempt_id=attempt_id, defaults={
        "node_id": node_id, "image": image, "state": ImagePull.State.PULLING, **PullCounts().fields(),
        "started_at": now, "updated_at": now, "finished_at": None, "error": "",
    })


def pull_progress(*, attempt_id: int, counts: PullCounts) -> bool:
    """Record how far the pull is; False if it is no longer under way."""
    return ImagePull.objects.filter(attempt_id=attempt_id, state=ImagePull.State.PULLING).update(
        **counts.fields(), updated_at=timezone.now()) == 1


def pull_wait(*, attempt_id: int, image: str, error: str) -> None:
    """The attempt's registry could not be reached (`error`): its launch
    waits to ask again. Shown as a pull would be, whether or not the node
    has the image (finding 35)."""
    node_id = TaskAttempt.objects.filter(pk=attempt_id).values_list("node_id", flat=True).first()
    now = timezone.now()
    pull, made = ImagePull.objects.get_or_create(attempt_id=attempt_id, defaults={
        "node_id": node_id, "image": image, "state": ImagePull.State.WAITING, "started_at": now, "updated_at": now,
        "error": error})
    if not made:  # keeps the time it began waiting
        ImagePull.objects.filter(pk=pull.pk).exclude(state=ImagePull.State.DONE).update(
            state=ImagePull.State.WAITING, **PullCounts().fields(), error=error, updated_at=now, finished_at=None)


def pull_finish(*, attempt_id: int, counts: PullCounts, error: str = "") -> bool:
    """The pull ended: pulled, or failed with `error` (the user's message)."""
    state = ImagePull.State.FAILED if error else ImagePull.State.DONE
    now = timezone.now()
    return ImagePull.objects.filter(attempt_id=attempt_id,
                                    state__in=[ImagePull.State.PULLING, ImagePull.State.WAITING]).update(
        **counts.fields(), state=state, error=error, updated_at=now, finished_at=now) == 1


def pulls_shown(attempts: Iterable[TaskAttempt]) -> dict[int, ImagePull]:
    """The pulls a job page shows, by attempt id: one under way while its
    task launches, and a failed one for good (it says why the task ended). A
    pull left PULLING by an agent that died is not shown once its task has
    moved on."""
    launching = {a.pk for a in attempts if a.state == TaskState.LAUNCHING}
    ids = [a.pk for a in attempts]
    shown = {}
    for pull in ImagePull.objects.filter(attempt_id__in=ids).exclude(state=ImagePull.State.DONE):
        if pull.state == ImagePull.State.FAILED or pull.attempt_id in launching:
            shown[pull.attempt_id] = pull
    return shown


@dataclass(frozen=True)
class StartingPull:
    image: str
    waiting: bool  # for its registry, which could not be reached
    tasks: int


def starting_pulls(job: Job) -> list[StartingPull]:
    """What a starting job's launching tasks wait for, image by image: the
    page's status line says it, for every task of the job, not only those
    on the page's table of tasks."""
    rows = (ImagePull.objects.filter(attempt__job=job, attempt__number=job.attempt_number,
                                     attempt__state=TaskState.LAUNCHING,
                                     state__in=[ImagePull.State.PULLING, ImagePull.State.WAITING])
            .values_list("image", "state").annotate(tasks=Count("pk")).order_by("image", "state"))
    return [StartingPull(image, state == ImagePull.State.WAITING, tasks) for image, state, tasks in rows]
