"""The job list: filters, sorting and pages that stay fast with 100,000 jobs.

Read-only. Two tricks keep deep pages and big tables cheap:
- rows are found by id first (ORDER BY ... LIMIT/OFFSET over the ids only,
  which an index can answer), then only that page's rows are loaded;
- the total is counted up to COUNT_CAP ("more than 10,000" beyond), so no
  request counts every row of a large table.
bench/job_list.py measures both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from django.db import connections
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, FloatField, Func, IntegerField, Q, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Now
from django.http import QueryDict

from jobs.ids import parse_id
from jobs.models import Job, JobFacts, JobTag, State, User, VirtualCluster

PER_PAGE = 50
COUNT_CAP = 10_000
ALL_USERS = "all"
ACTIVE = "active"  # a status filter: waiting, running or stopping

# sort key in the URL -> model fields (the last one breaks ties).
SORTS: dict[str, tuple[str, ...]] = {
    "name": ("name", "id"),
    "user": ("owner__username", "id"),
    "vc": ("virtual_cluster__name", "id"),
    "status": ("state", "id"),
    # Ties go the other way: this order is job_recent_idx's own
    # (-submitted_at, id), so a deep page is a plain index walk instead of a
    # sort of every row, on SQLite and PostgreSQL alike.
    "submitted": ("submitted_at", "-id"),
    "duration": ("run_time", "id"),
    "retries": ("attempt_number", "id"),
    "tasks": ("total_tasks", "id"),
    "gpus": ("total_gpus", "id"),
}
DEFAULT_SORT = "-submitted"
ACTIVE_STATES = (State.WAITING, State.RUNNING, State.STOPPING)


class RunSeconds(Func):
    """Seconds a job ran, or has run so far; NULL until it starts.

    Written per database because Django's generic datetime subtraction calls
    back into Python for every row on SQLite, ten times slower over 100,000 jobs.
    Running jobs are measured at `now`, or the database's own clock when None.
    """

    output_field = FloatField()

    def __init__(self, now: datetime | None = None) -> None:
        super().__init__(F("finished_at"), F("started_at"))
        self.now = now

    def _parts(self, compiler, connection, clock: str) -> tuple[str, str, list]:
        """finished_at or else now (`clock`, the database's, when no `now`
        was given), started_at, and their parameters in SQL order."""
        (finished, finished_params), (started, started_params) = (
            compiler.compile(e) for e in self.get_source_expressions()
        )
        if self.now is None:
            return f"COALESCE({finished}, {clock})", started, [*finished_params, *started_params]
        now = connection.ops.adapt_datetimefield_value(self.now)
        return f"COALESCE({finished}, %s)", started, [*finished_params, now, *started_params]

    def as_sqlite(self, compiler, connection, **extra):
        end, started, params = self._parts(compiler, connection, "'now'")
        # julianday counts whole milliseconds, but as a float day number: the
        # difference of two is off by some 20 microseconds, so two jobs that
        # ran equally long would compare unequal and miss their tie by id.
        # Rounded to the millisecond they are equal again.
        return f"ROUND((julianday({end}) - julianday({started})) * 86400.0, 3)", params

    def as_postgresql(self, compiler, connection, **extra):
        end, started, params = self._parts(compiler, connection, "NOW()")
        return f"EXTRACT(EPOCH FROM ({end} - {started}))", params

    def as_sql(self, compiler, connection, **extra):
        # Any other database: Django's portable (slower) interval.
        interval = ExpressionWrapper(
            Coalesce("finished_at", Value(self.now) if self.now else Now(), output_field=DateTimeField()) - F("started_at"),
            output_field=DurationField(),
        )
        return compiler.compile(interval.resolve_expression(compiler.query))


class FinishedRunSeconds(Func):
    """Seconds a finished job ran. Never changes, so an index holds it
    (PostgreSQL: job_run_time_idx, migration 0008; SQLite:
    job_run_time_sqlite_idx, migration 0013); written exactly as that
    index's expression, or the database would not use it."""

    template = "EXTRACT(EPOCH FROM (%(expressions)s))"
    arg_joiner = " - "
    output_field = FloatField()

    def __init__(self) -> None:
        super().__init__(F("finished_at"), F("started_at"))

    def as_sqlite(self, compiler, connection, **extra):
        # RunSeconds' value for a finished job (COALESCE keeps finished_at),
        # rounded as it is; migration 0013's index holds this expression.
        return super().as_sql(compiler, connection, template="ROUND((julianday(%(expressions)s)) * 86400.0, 3)",
                              arg_joiner=") - julianday(", **extra)


class JulianDay(Func):
    """SQLite: a timestamp as a day number, the key of job_running_since_sqlite_idx."""

    function = "julianday"
    output_field = FloatField()


@dataclass(frozen=True)
class JobFilters:
    status: str = ""  # "", "active" or a State value
    user: str = ""  # "" = the viewer's own jobs, "all" (admins), or a username (admins)
    vc: str = ""
    q: str = ""
    tag: str = ""  # jobs with this tag
    sort: str = DEFAULT_SORT
    # The moment running jobs' run times are measured at (sort by duration):
    # None is the database's clock at each query. A fixed one gives every
    # page of a walk the same order (tests).
    now: datetime | None = None

    @property
    def is_default(self) -> bool:
        return replace(self, sort=DEFAULT_SORT, now=None) == JobFilters()


# What of a search the page keeps (in its box and links). A longer one than
# a job's name cannot match a name, and is kept long enough that it is not
# cut down to one that could: it finds nothing, as REST v2's keyword.
SEARCH_MAX_LENGTH = 256


def filters_from(params: QueryDict, *, viewer: User) -> JobFilters:
    """Filters from a query string; anything unknown falls back to its default
    (a bookmarked URL with a stale value still shows a page)."""
    status = params.get("status", "")
    if status not in {ACTIVE, *State.values}:
        status = ""
    user = params.get("user", "").strip()
    if not viewer.is_admin or user == viewer.username:
        user = ""
    sort = params.get("sort", DEFAULT_SORT)
    if sort.lstrip("-") not in SORTS:
        sort = DEFAULT_SORT
    # A tag is matched as stored, spaces and all: REST v2 keeps " gpu " as
    # given, and its link here must find the job, as tagsContain does.
    tag = params.get("tag", "")
    return JobFilters(status=status, user=user, vc=params.get("vc", "").strip()[:64],
                      q=params.get("q", "").strip()[:SEARCH_MAX_LENGTH], tag=tag[:JobTag.MAX_LENGTH] if tag.strip() else "",
                      sort=sort)


def filtered_jobs(filters: JobFilters, *, viewer: User):
    """Jobs the viewer may see that match the filters, in the chosen order."""
    jobs = Job.objects.visible_to(viewer)
    owner = Q()  # whose jobs, when one user's
    if filters.user == "":
        owner = Q(owner=viewer)
    elif filters.user != ALL_USERS:
        owner = Q(owner__username=filters.user)
    jobs = jobs.filter(owner)
    if filters.status == ACTIVE:
        jobs = jobs.filter(state__in=ACTIVE_STATES)
    elif filters.status:
        jobs = jobs.filter(state=filters.status)
    if filters.vc:
        jobs = jobs.filter(virtual_cluster__name=filters.vc)
    if filters.tag:  # through the (value, job) index, as REST v2's tagsContain
        jobs = jobs.filter(pk__in=JobTag.objects.filter(value=filters.tag).values("job_id"))
    if filters.q:
        jobs = _searched(jobs, owner, filters.q)
    fields = SORTS[filters.sort.lstrip("-")]
    if "run_time" in fields:
        jobs = jobs.annotate(run_time=RunSeconds(filters.now))
    descending = filters.sort.startswith("-")
    return jobs.order_by(*(_order(f, descending) for f in fields))


# SQLite: the ids of the jobs whose name holds a phrase (migration 0015).
SQLITE_NAME_SEARCH = "SELECT rowid FROM jobs_job_name_fts WHERE jobs_job_name_fts MATCH %s"


def _fts_phrase(text: str) -> str:
    """The text as one FTS5 phrase, taken literally: quoted, its own quotes
    doubled (FTS5's syntax would read AND, *, ^ or a column name in it)."""
    return '"' + text.replace('"', '""') + '"'


def _searched(jobs, owner: Q, q: str):
    """`jobs` whose name holds `q`, case-blind and literally ("_" and "%" are
    characters), or whose id it is ("#123" or "123")."""
    if len(q) > Job._meta.get_field("name").max_length:
        return jobs.none()  # no name holds it, and no id is that long
    vendor = connections[jobs.db].vendor
    # On SQLite, everyone's jobs are searched through the names' trigram index
    # (migration 0015) from three characters on: it finds the matches without
    # reading any name. One user's are not: the index gives every user's
    # matches (a common word: thousands, to look up one by one), where their
    # own entries of the (owner, name) index are as many as their jobs.
    indexed = vendor == "sqlite" and len(q) >= 3 and not owner
    match = Q(pk__in=RawSQL(SQLITE_NAME_SEARCH, [_fts_phrase(q)])) if indexed else Q(name__icontains=q)
    job_id = parse_id(q.lstrip("#"))
    if job_id is not None:
        match |= Q(pk=job_id)
    if vendor == "sqlite" and not indexed:
        # Matched as a subquery: SQLite reads names from an index alone (the
        # (owner, name) one when one user's jobs are listed: only theirs),
        # where a plain filter would fetch every row in date order.
        return jobs.filter(pk__in=Job.objects.filter(owner, match).values("pk"))
    # PostgreSQL picks the name's trigram index (migration 0008) for a rare
    # word, the date order for a common one.
    return jobs.filter(match)


def _order(field: str, descending: bool):
    if field.startswith("-"):  # a tie-breaker that runs against the main order
        field, descending = field[1:], not descending
    if field == "run_time":  # jobs not started yet go last either way
        return F(field).desc(nulls_last=True) if descending else F(field).asc(nulls_last=True)
    # Plain names for the rest, so an index can give the order (SQLite will
    # not use one for an explicit NULLS LAST on an ascending sort).
    return f"-{field}" if descending else field


_STATE_LABELS = dict(State.choices)


@dataclass(frozen=True, slots=True)
class JobRow(JobFacts):
    """What a row of the job list shows of a job."""

    pk: int
    name: str
    state: str
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempt_number: int
    total_tasks: int
    total_gpus: int
    owner_username: str
    vc_name: str

    def get_state_display(self) -> str:
        return _STATE_LABELS.get(self.state, self.state)


_ROW_FIELDS = ("pk", "name", "state", "submitted_at", "started_at", "finished_at", "attempt_number", "total_tasks",
               "total_gpus", "owner__username", "virtual_cluster__name")


def rows_by_ids(ids: list[int]) -> list[JobRow]:
    """The list's rows for a page of ids, in the ids' order: read as values
    (a Job with its owner and virtual cluster as model objects, as
    jobs_by_ids gives the API, took three times as long for a page)."""
    found = {values[0]: JobRow(*values) for values in Job.objects.filter(pk__in=ids).values_list(*_ROW_FIELDS)}
    return [found[i] for i in ids if i in found]


@dataclass(frozen=True)
class JobListPage:
    jobs: list[JobRow]
    number: int
    per_page: int
    count: int  # exact up to COUNT_CAP
    count_capped: bool  # there are more than COUNT_CAP
    has_next: bool
    tags: dict[int, list[str]]  # by job id: the page's jobs' tags

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def num_pages(self) -> int | None:
        """None when the count is capped (the last page is not known)."""
        if self.count_capped:
            return None
        return max(1, -(-self.count // self.per_page))

    @property
    def start_index(self) -> int:
        return (self.number - 1) * self.per_page + 1 if self.jobs else 0

    @property
    def end_index(self) -> int:
        return (self.number - 1) * self.per_page + len(self.jobs)

    def nearby_pages(self, width: int = 2) -> list[int]:
        last = self.num_pages or (self.number + (1 if self.has_next else 0))
        return list(range(max(1, self.number - width), min(last, self.number + width) + 1))


def page_number(raw: str | None) -> int:
    try:
        return max(1, min(int(raw or 1), 1_000_000))
    except ValueError:
        return 1


def jobs_by_ids(ids: list[int]) -> list[Job]:
    """The rows for a page of ids, in the ids' order, with what the table shows."""
    found = Job.objects.filter(pk__in=ids).select_related("owner", "virtual_cluster").defer(
        "config_raw", "config", "ssh_private_key", "ssh_public_key", "warnings",
    )
    by_id = {job.pk: job for job in found}
    return [by_id[i] for i in ids if i in by_id]


def tags_of(ids: list[int]) -> dict[int, list[str]]:
    """The tags of these jobs by job id, each job's in the order they were
    added: values from one query (prefetch_related made a tag object and a
    related manager per job, a seventh of a list page)."""
    found: dict[int, list[str]] = {}
    for job_id, value in JobTag.objects.filter(job_id__in=ids).order_by("id").values_list("job_id", "value"):
        found.setdefault(job_id, []).append(value)
    return found


def job_list_page(filters: JobFilters, *, viewer: User, number: int = 1, per_page: int = PER_PAGE,
                  with_count: bool = True) -> JobListPage:
    """One page of the list; `with_count=False` skips the count (live updates
    of rows already on screen need none)."""
    jobs = filtered_jobs(filters, viewer=viewer)
    offset = (number - 1) * per_page
    vendor = connections[jobs.db].vendor if filters.sort.lstrip("-") == "duration" else ""
    if vendor == "postgresql":
        ids = _ids_by_run_time(jobs, descending=filters.sort.startswith("-"), offset=offset, count=per_page + 1,
                               now=filters.now)
    elif vendor == "sqlite" and _sqlite_run_time_indexed(filters):
        ids = _ids_by_run_time_sqlite(jobs, descending=filters.sort.startswith("-"), offset=offset,
                                      count=per_page + 1, now=filters.now)
    else:
        ids = list(jobs.values_list("pk", flat=True)[offset:offset + per_page + 1])
    count, capped = 0, False
    if with_count:
        count = jobs.order_by().values("pk")[:COUNT_CAP + 1].count()
        capped = count > COUNT_CAP
        count = min(count, COUNT_CAP)
    shown = ids[:per_page]
    return JobListPage(jobs=rows_by_ids(shown), number=number, per_page=per_page, count=count,
                       count_capped=capped, has_next=len(ids) > per_page, tags=tags_of(shown))


def _ids_by_run_time(jobs, *, descending: bool, offset: int, count: int, now: datetime | None = None) -> list[int]:
    """PostgreSQL: a page of `jobs` by run time without computing it for
    every row (a million jobs took a second). Finished jobs come in the
    order of their run time's index, running ones in order of start (their
    run time grows with NOW(); job_running_since_idx), jobs never started by
    id, last either way: each group gives at most offset + count rows in its
    own indexed order, and only those are sorted. The same order as
    `filtered_jobs` gives."""
    enough = offset + count
    sign = "-" if descending else ""
    base = jobs.order_by()
    columns = ("pk", "run_time", "never_started")
    finished = (base.filter(finished_at__isnull=False, started_at__isnull=False)
                .annotate(run_time=FinishedRunSeconds(), never_started=Value(0, output_field=IntegerField()))
                .order_by(f"{sign}run_time", f"{sign}id").values_list(*columns)[:enough])
    running = (base.filter(finished_at__isnull=True, started_at__isnull=False)
               .annotate(run_time=RunSeconds(now), never_started=Value(0, output_field=IntegerField()))
               .order_by("started_at" if descending else "-started_at", f"{sign}id").values_list(*columns)[:enough])
    never = (base.filter(started_at__isnull=True)
             .annotate(run_time=Value(None, output_field=FloatField()), never_started=Value(1, output_field=IntegerField()))
             .order_by(f"{sign}id").values_list(*columns)[:enough])
    page = finished.union(running, never, all=True).order_by("never_started", f"{sign}run_time", f"{sign}id")
    return [pk for pk, _run_time, _never in page[offset:offset + count]]


def _sqlite_run_time_indexed(filters: JobFilters) -> bool:
    """Whether _ids_by_run_time_sqlite is the faster way for these filters:
    only when migration 0012's indexes give the order, that is all users'
    jobs or one user's (own, or an admin's pick). With a status, virtual
    cluster, search or tag filter SQLite would walk the indexes past every
    job the filter drops (a few times slower than today's sort of the jobs
    it keeps, bench/job_list.py), so those keep `filtered_jobs`' order."""
    return not (filters.status or filters.vc or filters.q or filters.tag)


def _ids_by_run_time_sqlite(jobs, *, descending: bool, offset: int, count: int,
                            now: datetime | None = None) -> list[int]:
    """SQLite: a page of `jobs` by run time from the indexes of migrations
    0012 and 0013 instead of computing and sorting every job's run time (a third of
    a second for 100,000 jobs). One compound query that SQLite answers as a
    merge of sorted streams, stopping after offset + count rows:

    - finished jobs straight from job_run_time_sqlite_idx (one user's:
      job_owner_run_time_sqlite_idx; both migration 0013's), no sort;
    - running jobs, the first offset + count by start (job_[owner_]
      running_since_sqlite_idx; their run time grows with 'now', so an
      earlier start is a longer run), sorted again by run time, which is
      the same order: distinct starts (julianday counts whole milliseconds)
      give distinct run times;
    - jobs never started, by id (job_[owner_]never_started_sqlite_idx),
      last either way (a NULL run time sorts last descending; ascending
      they get +infinity instead).

    SQLite refuses ORDER BY/LIMIT in an arm of a compound query, hence the
    running and never-started arms as `SELECT * FROM (...)`. The same order
    as `filtered_jobs` gives (tests/test_job_list_duration_sqlite.py)."""
    enough = offset + count
    sign = "-" if descending else ""
    base = jobs.order_by()
    finished = (base.filter(finished_at__isnull=False, started_at__isnull=False)
                .annotate(run_time=FinishedRunSeconds()).values_list("pk", "run_time"))
    running = (base.filter(finished_at__isnull=True, started_at__isnull=False)
               .annotate(run_time=RunSeconds(now), started_day=JulianDay("started_at"))
               .order_by("started_day" if descending else "-started_day", f"{sign}id")
               .values_list("pk", "run_time")[:enough])
    never = (base.filter(started_at__isnull=True)
             .annotate(run_time=Value(None if descending else float("inf"), output_field=FloatField()))
             .order_by(f"{sign}id").values_list("pk", "run_time")[:enough])
    (finished_sql, finished_params), (running_sql, running_params), (never_sql, never_params) = (
        part.query.get_compiler(using=jobs.db).as_sql() for part in (finished, running, never))
    direction = "DESC" if descending else "ASC"
    sql = (f"{finished_sql} UNION ALL SELECT * FROM ({running_sql}) UNION ALL SELECT * FROM ({never_sql}) "
           f"ORDER BY 2 {direction}, 1 {direction} LIMIT %s OFFSET %s")
    with connections[jobs.db].cursor() as cursor:
        cursor.execute(sql, [*finished_params, *running_params, *never_params, count, offset])
        return [pk for pk, _run_time in cursor.fetchall()]


def filter_choices(*, viewer: User) -> dict[str, list[str]]:
    """Values for the filter menus: virtual clusters, and users for admins."""
    users: list[str] = []
    if viewer.is_admin:
        users = list(User.objects.order_by("username").values_list("username", flat=True)[:1000])
    return {"vcs": list(VirtualCluster.objects.values_list("name", flat=True)), "users": users}
