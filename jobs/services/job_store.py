"""Storing accepted jobs: submissions that arrive together share one write
transaction (group commit).

On SQLite every write transaction takes the whole database's write lock,
and each one pays for BEGIN, three INSERTs and COMMIT. Under a burst of
submissions (a script sweeping hyperparameters, eight clients at once) a
process therefore stores the jobs that queued up while its previous write
ran in one transaction: one lock, one INSERT of jobs, one commit, one
wake-up for the scheduler. A lone submission is written at once, as before.

Leader and followers: the first submission to find no write under way
writes everything queued so far, its own included; the ones that arrive
meanwhile wait, and when the write ends the oldest of them leads the next
one. Like PostgreSQL's commit_delay, a leader that knows of other
submissions still being checked in this process waits for them, at most
COMMIT_DELAY, so that they join its transaction. Nobody returns before
their job is committed, so a 202 still means the job is stored.

A job whose owner has a waiting-job limit in its virtual cluster is counted
against it inside the write transaction (see `_within_waiting_limits`), so
two submissions at once cannot both take the last place.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from redis.exceptions import RedisError

from jobs import queues
from jobs.models import Job, JobAttempt, State, Task, User, VirtualCluster
from jobs.services import rows

log = logging.getLogger(__name__)

# Seconds a leader waits for the submissions this process is still checking.
COMMIT_DELAY = 0.002


class NameTaken(Exception):
    """The owner already has a job of that name."""


class VirtualClusterGone(Exception):
    """The job's virtual cluster was removed while the job was being stored."""


class OwnerGone(Exception):
    """The job's owner was deleted while the job was being stored."""


class WaitingLimitReached(Exception):
    """The owner already has `waiting` waiting jobs in the job's virtual
    cluster, and may have at most `limit`."""

    def __init__(self, waiting: int, limit: int) -> None:
        super().__init__(f"{waiting} waiting jobs; the limit is {limit}")
        self.waiting = waiting
        self.limit = limit


@dataclass(eq=False)
class _Pending:
    job: Job  # not saved yet
    roles: list[tuple[str, int]]  # (task role, task number)
    max_waiting: int | None = None  # the owner's waiting-job limit in the job's virtual cluster
    done: bool = False
    leads: bool = False
    error: BaseException | None = None


@dataclass(eq=False)
class _Queue:
    waiting: list[_Pending] = field(default_factory=list)
    writing: bool = False
    submitting: int = 0  # submissions under way in this process, queued or not
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # Two conditions on one lock, so that each wake-up reaches only those
        # it concerns: one condition woke every queued submission each time
        # another arrived or finished its checks. Apart, the web workers took
        # 2.0-2.2 ms of CPU a job against 2.2-2.5 in five of six alternated
        # rounds of bench/api_submit_rate.py (the sixth equal).
        self.ready = threading.Condition(self.lock)  # queued ones: written, or their turn to lead
        self.joined = threading.Condition(self.lock)  # the leader: one more queued, or one less coming


_queue = _Queue()


@contextmanager
def submitting() -> Iterator[None]:
    """Around a whole submission: lets a leader know who else is coming."""
    with _queue.lock:
        _queue.submitting += 1
    try:
        yield
    finally:
        with _queue.lock:
            _queue.submitting -= 1
            _queue.joined.notify()


def store(job: Job, *, roles: list[tuple[str, int]], max_waiting: int | None = None) -> Job:
    """Save `job`, its first attempt and its tasks, and ask for a scheduling
    pass after the commit. Raises NameTaken, or WaitingLimitReached when its
    owner has `max_waiting` waiting jobs in its virtual cluster already."""
    pending = _Pending(job, roles, max_waiting)
    if connection.in_atomic_block:
        _write([pending])  # the caller's transaction decides when this commits
        if pending.error is None:
            transaction.on_commit(_wake_scheduler)
    else:
        with _queue.lock:
            _queue.waiting.append(pending)
            _queue.joined.notify()
            if _queue.writing:
                _queue.ready.wait_for(lambda: pending.done or pending.leads)
            else:
                _queue.writing = True
        if not pending.done:
            _lead()
    if pending.error is not None:
        raise pending.error
    return job


def _lead() -> None:
    """Write everything queued, then wake its owners and hand the lead on."""
    with _queue.lock:
        _queue.joined.wait_for(lambda: len(_queue.waiting) >= _queue.submitting, timeout=COMMIT_DELAY)
        batch, _queue.waiting = _queue.waiting, []
    try:
        _write(batch)
    except BaseException as exc:  # every owner hears of it, not only the leader
        for pending in batch:
            pending.error = pending.error or exc
    finally:
        with _queue.lock:
            for pending in batch:
                pending.done = True
            if _queue.waiting:
                _queue.waiting[0].leads = True
            else:
                _queue.writing = False
            _queue.ready.notify_all()
    # After the batch's owners have their answers and the next write has
    # begun, rather than from the commit, where its round trip to Redis held
    # both up (no faster measurably, bench/api_submit_rate.py: the wake-up
    # is one per batch).
    if any(pending.error is None for pending in batch):
        _wake_scheduler()


def _wake_scheduler() -> None:
    """A scheduling pass for the jobs just stored. Without Redis they are
    stored all the same: a node agent asks for the pass once it finds jobs
    waiting with no pass for SCHEDULE_REPAIR_SECONDS. Never an
    error of the submissions: raised from the commit, it told owners of
    stored jobs that their names were taken (the batch written again one
    by one)."""
    try:
        queues.request_schedule()
    except RedisError as exc:
        log.warning("stored jobs, but could not ask for a scheduling pass: %s", exc)


def _write(batch: list[_Pending], *, again: bool = True) -> None:
    try:
        with transaction.atomic():
            _insert(batch)
        return
    except Exception as exc:  # noqa: BLE001 -- decided per job below, never for the whole batch
        if len(batch) == 1:
            refusal = _refusal(batch[0], exc)
            if refusal is exc and isinstance(exc, IntegrityError) and again:
                # Whatever the database refused it for is gone now: a job of
                # that name deleted meanwhile (a v1 PUT submitting a finished
                # job's name again). Once more, as if it had come a moment later.
                batch[0].job.pk = None
                _write(batch, again=False)
                return
            batch[0].error = refusal
            return
    # Some job in the batch cannot be stored (a taken name, a name given
    # twice, a virtual cluster removed meanwhile, data the database refuses):
    # store them one by one so that only those fail.
    for pending in batch:
        pending.job.pk = None  # in case the rolled-back INSERT had set it
        pending.error = None  # counted again, alone, against its limit
        _write([pending])


def _refusal(pending: _Pending, exc: Exception) -> Exception:
    """What to tell the owner of a job that could not be stored alone."""
    if isinstance(exc, IntegrityError):
        job = pending.job
        if Job.objects.filter(owner_id=job.owner_id, name=job.name).exists():
            return NameTaken()
        if not VirtualCluster.objects.filter(pk=job.virtual_cluster_id).exists():
            return VirtualClusterGone()
        if not User.objects.filter(pk=job.owner_id).exists():
            return OwnerGone()
    return exc


def _insert(batch: list[_Pending]) -> None:
    batch = _within_waiting_limits(batch)
    if not batch:
        return
    # Written without bulk_create: its own work per call, about 0.75 ms of a
    # 3.4 ms submission, cost more than the SQL it sent (bench/api_submit_rate.py).
    jobs = [pending.job for pending in batch]
    rows.save_new(jobs, unique=("owner_id", "name"))
    rows.insert(JobAttempt, [{"job_id": job.pk, "number": 1} for job in jobs])
    rows.insert(Task, [{"job_id": pending.job.pk, "role": role, "index": index}
                       for pending in batch for role, count in pending.roles for index in range(count)])


def _within_waiting_limits(batch: list[_Pending]) -> list[_Pending]:
    """The batch less the jobs that would take their owner past a waiting
    limit (those get WaitingLimitReached), in submission order.

    Counted inside the write transaction: on SQLite it holds the database's
    write lock from BEGIN; on PostgreSQL the owners' rows are locked first.
    Either way a concurrent batch of the same owner counts after this one
    commits, so the limit holds exactly."""
    owners = {pending.job.owner_id for pending in batch if pending.max_waiting is not None}
    if not owners:
        return batch
    list(User.objects.select_for_update().filter(pk__in=owners).values_list("pk", flat=True))
    rows = (Job.objects.filter(state=State.WAITING, owner_id__in=owners)
            .values_list("owner_id", "virtual_cluster_id").annotate(n=Count("id")))
    waiting = Counter({(owner, vc): count for owner, vc, count in rows})
    accepted = []
    for pending in batch:
        key = (pending.job.owner_id, pending.job.virtual_cluster_id)
        if pending.max_waiting is not None and waiting[key] >= pending.max_waiting:
            pending.error = WaitingLimitReached(waiting[key], pending.max_waiting)
            continue
        waiting[key] += 1
        accepted.append(pending)
    return accepted
