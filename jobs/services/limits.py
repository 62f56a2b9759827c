"""Per-user limits in a virtual cluster (models.UserLimit): which apply to
whom, and what they say about a user now. Read-only.

The most specific row wins: a user's own row in a virtual cluster, else the
virtual cluster's default row (no user), else no limit. A user's row
replaces the default whole, so an admin can lift a limit for one user by
leaving its field blank there.

Where each limit is enforced:
- waiting jobs: at submission (jobs/services/submission.py), and again
  inside the store's write transaction (jobs/services/job_store.py), so two
  submissions at once cannot both take the last place;
- running jobs and GPUs in use: by the scheduler, from the limits and usage
  jobs/services/scheduling.py reads for each pass (jobs/scheduler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet

from jobs.formatting import plural
from jobs.models import Job, State, User, UserLimit, VirtualCluster
from jobs.services import permissions_memo


@dataclass(frozen=True)
class Limits:
    """One user's limits in one virtual cluster; None is no limit."""

    max_waiting_jobs: int | None = None
    max_running_jobs: int | None = None
    max_gpus: int | None = None

    @property
    def any_set(self) -> bool:
        return any(value is not None for value in (self.max_waiting_jobs, self.max_running_jobs, self.max_gpus))


NO_LIMITS = Limits()

# (virtual cluster name, user id, or None for the virtual cluster's default) -> its row's limits
LimitTable = dict[tuple[str, int | None], Limits]


def limit_table() -> LimitTable:
    """Every limit row, in one query (admins keep a handful per virtual cluster)."""
    return _table(UserLimit.objects.all())


def _table(rows: QuerySet[UserLimit]) -> LimitTable:
    values = rows.values_list("virtual_cluster__name", "user_id", "max_waiting_jobs", "max_running_jobs", "max_gpus")
    return {(vc, user): Limits(waiting, running, gpus) for vc, user, waiting, running, gpus in values}


def resolve(table: LimitTable, *, vc_name: str, user_id: int) -> Limits:
    """The limits that apply to a user in a virtual cluster: the most specific row."""
    return table.get((vc_name, user_id)) or table.get((vc_name, None)) or NO_LIMITS


def limits_for(*, user: User, vc: VirtualCluster) -> Limits:
    """`user`'s limits in `vc`. Remembered like the permission to submit
    there (a sweep asks for every job), and forgotten in every process when
    a limit row changes (jobs/signals.py)."""
    return permissions_memo.remembered(("limits", user.pk, vc.pk), lambda: _limits_for(user, vc))


def _limits_for(user: User, vc: VirtualCluster) -> Limits:
    table = _table(UserLimit.objects.filter(Q(user=user) | Q(user__isnull=True), virtual_cluster=vc))
    return resolve(table, vc_name=vc.name, user_id=user.pk)


def waiting_limit_words(*, waiting: int, limit: int, vc_name: str) -> str:
    """The refusal of a submission over the waiting limit, in one place for
    the API, the Submit page and its live check."""
    return (f'you have {plural(waiting, "waiting job")} in virtual cluster "{vc_name}"; its limit for you is '
            f'{limit} (wait for some to start, or stop some)')


def waiting_limit_problem(*, user: User, vc: VirtualCluster) -> str | None:
    """Why one more job of `user`'s in `vc` would be refused now, or None."""
    limit = limits_for(user=user, vc=vc).max_waiting_jobs
    if limit is None:
        return None
    waiting = Job.objects.filter(owner=user, virtual_cluster=vc, state=State.WAITING).count()
    return waiting_limit_words(waiting=waiting, limit=limit, vc_name=vc.name) if waiting >= limit else None


def limits_of(*, user: User) -> dict[str, Limits]:
    """`user`'s limits by virtual cluster name, where some limit applies (the
    Virtual Clusters page shows them to the user, and to nobody else)."""
    table = _table(UserLimit.objects.filter(Q(user=user) | Q(user__isnull=True)))
    found = {vc: resolve(table, vc_name=vc, user_id=user.pk) for vc, _user in table}
    return {vc: limits for vc, limits in found.items() if limits.any_set}
