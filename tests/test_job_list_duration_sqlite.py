"""The job list sorted by duration (run time), page by page.

On SQLite an admin's view of all users' jobs takes listing._ids_by_run_time_sqlite
(a merge of migration 0012's indexes); own jobs and filtered views take
`filtered_jobs`' plain sort; on PostgreSQL listing._ids_by_run_time. Every
way must cut pages out of one order: a plain Python sort of the same jobs by
how long they ran (running ones until now), ties by id, jobs never started
last by id, in either direction. And nobody sees another user's jobs
through it, whatever the URL asks.

The jobs are written inside a transaction that is rolled back at the end:
no other process (agents, the scheduler) ever sees a running job without
tasks. Other tests' jobs may share the database, so the admin's view is
checked on the order of this test's jobs within it, and while it is walked
page by page nothing may change those jobs: on SQLite the fixture's write
transaction already holds the database's write lock; on PostgreSQL the
test takes a SHARE lock on the jobs table (a node agent still ending an
earlier test's job would otherwise move it from one page to another).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Job, JobTag, State, User, VirtualCluster
from jobs.services import listing
from tests.conftest import unique

SORTS = ["-duration", "duration"]
# Run times are far apart (minutes at least) between finished and running
# jobs, so the seconds between this test's "now" and the database's cannot
# reorder them; equal run times within a group test the tie by id.
ALICE = [  # (state, started seconds ago or None, seconds it ran or None)
    (State.SUCCEEDED, 1_000, 10),
    (State.FAILED, 9_000, 500),
    (State.SUCCEEDED, 20_000, 500),  # the same run time as the one above
    (State.STOPPED, 30_000, 3_000),
    (State.SUCCEEDED, 90_000, 7_200),
    (State.SUCCEEDED, 200_000, 86_000),
    (State.RUNNING, 100, None),
    (State.RUNNING, 1_000, None),
    (State.STOPPING, 1_000, None),  # started in the same second as the one above
    (State.RUNNING, 4_000, None),
    (State.RUNNING, 50_000, None),
    (State.WAITING, None, None),
    (State.WAITING, None, None),
    (State.STOPPED, None, 0),  # stopped before it ever started: no run time
]
BOB = [
    (State.SUCCEEDED, 40_000, 20),
    (State.FAILED, 60_000, 5_000),
    (State.RUNNING, 300, None),
    (State.RUNNING, 6_000, None),
    (State.WAITING, None, None),
]


@pytest.fixture
def mixed_jobs(alice, bob) -> Iterator[dict[str, list[Job]]]:
    vc = VirtualCluster.objects.get(name=VirtualCluster.DEFAULT)
    now = timezone.now().replace(microsecond=0)
    prefix = unique("dur_")

    def job(owner: User, n: int, state: str, started_ago: int | None, ran: int | None) -> Job:
        started = now - timedelta(seconds=started_ago) if started_ago is not None else None
        finished = None
        if ran is not None:
            finished = (started or now) + timedelta(seconds=ran)
        return Job.objects.create(owner=owner, name=f"{prefix}{n}", virtual_cluster=vc, state=state, config_raw="{}",
                                  config={}, submitted_at=now - timedelta(days=3), started_at=started,
                                  finished_at=finished)

    with transaction.atomic():
        made = {"alice": [job(alice, n, *spec) for n, spec in enumerate(ALICE)],
                "bob": [job(bob, n, *spec) for n, spec in enumerate(BOB)]}
        for tagged in made["alice"][::2]:
            JobTag.objects.create(job=tagged, value=prefix)
        made["prefix"] = prefix  # type: ignore[assignment]
        yield made
        transaction.set_rollback(True)


def by_run_time(jobs: list[Job], *, descending: bool, now: datetime | None = None) -> list[int]:
    """The expected order, in plain Python (running jobs measured at `now`)."""
    now = now or timezone.now()

    def seconds(job: Job) -> float:
        assert job.started_at is not None
        finished: datetime = job.finished_at or now
        return (finished - job.started_at).total_seconds()

    started = sorted((j for j in jobs if j.started_at is not None), key=lambda j: (seconds(j), j.pk), reverse=descending)
    never = sorted((j.pk for j in jobs if j.started_at is None), reverse=descending)
    return [j.pk for j in started] + never


def walk(filters: listing.JobFilters, viewer: User, per_page: int = 3) -> list[int]:
    """Every page's ids, one after the other."""
    ids: list[int] = []
    for number in range(1, 10_000):
        page = listing.job_list_page(filters, viewer=viewer, number=number, per_page=per_page, with_count=False)
        ids += [job.pk for job in page.jobs]
        assert len(page.jobs) == per_page if page.has_next else len(page.jobs) <= per_page
        if not page.has_next:
            return ids
    raise AssertionError("more pages than jobs")


@pytest.mark.parametrize("sort", SORTS)
def test_an_admins_pages_of_all_jobs_follow_a_python_sort_by_run_time(make_user, mixed_jobs, sort):
    admin = make_user("admin", admin=True)
    # One moment for every page: the suite's other jobs may be running with
    # run times near finished ones', and measured at each query's own clock
    # a running job would overtake a finished one between two pages.
    now = timezone.now()
    filters = listing.JobFilters(user=listing.ALL_USERS, sort=sort, now=now)
    mine = mixed_jobs["alice"] + mixed_jobs["bob"]
    if connection.vendor == "postgresql":  # held until the fixture's transaction ends (see the docstring)
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE jobs_job IN SHARE MODE")
    total = Job.objects.count()
    # Small pages, but at most some 40 of them when the suite's other jobs share the table.
    for per_page in (max(3, -(-total // 40)), max(5, -(-total // 15)), 50):
        ids = walk(filters, admin, per_page)
        assert len(ids) == len(set(ids)) == total  # every job once, across page boundaries
        ours = {job.pk for job in mine}
        assert [pk for pk in ids if pk in ours] == by_run_time(mine, descending=sort.startswith("-"), now=now)
    if connection.vendor == "sqlite":  # it went the indexed way (migration 0012), not the full sort
        with CaptureQueriesContext(connection) as queries:
            listing.job_list_page(filters, viewer=admin, number=2, per_page=3)
        assert any("UNION ALL" in q["sql"] and "julianday" in q["sql"] for q in queries.captured_queries)


@pytest.mark.parametrize("sort", SORTS)
def test_a_users_pages_hold_their_own_jobs_in_run_time_order_even_when_asking_for_all(alice, bob, mixed_jobs, sort):
    descending = sort.startswith("-")
    for user, key in ((alice, "alice"), (bob, "bob")):
        expected = by_run_time(mixed_jobs[key], descending=descending)
        assert walk(listing.JobFilters(sort=sort), user) == expected
        # A hostile URL's user=all (filters_from would drop it; the service must hold too).
        assert walk(listing.JobFilters(user=listing.ALL_USERS, sort=sort), user, per_page=2) == expected


@pytest.mark.parametrize("sort", SORTS)
def test_filtered_views_keep_the_run_time_order(make_user, mixed_jobs, sort):
    admin = make_user("admin", admin=True)
    descending = sort.startswith("-")
    prefix = mixed_jobs["prefix"]
    alice_jobs, mine = mixed_jobs["alice"], mixed_jobs["alice"] + mixed_jobs["bob"]
    cases = [
        (listing.JobFilters(user=listing.ALL_USERS, q=prefix, sort=sort), mine),
        (listing.JobFilters(user=listing.ALL_USERS, tag=prefix, sort=sort), alice_jobs[::2]),
        (listing.JobFilters(user=alice_jobs[0].owner.username, sort=sort), alice_jobs),
        (listing.JobFilters(user=listing.ALL_USERS, q=prefix, status=listing.ACTIVE, sort=sort),
         [j for j in mine if j.state in listing.ACTIVE_STATES]),
        (listing.JobFilters(user=listing.ALL_USERS, q=prefix, vc=VirtualCluster.DEFAULT, status=State.SUCCEEDED, sort=sort),
         [j for j in mine if j.state == State.SUCCEEDED]),
    ]
    for filters, jobs in cases:
        assert walk(filters, admin) == by_run_time(jobs, descending=descending), filters


def test_the_page_sorted_by_duration_over_all_users_shows_a_user_only_their_own_jobs(alice, bob, mixed_jobs):
    bob_client = Client()
    bob_client.force_login(bob)
    response = bob_client.get("/", {"user": "all", "sort": "-duration"})
    assert response.status_code == 200
    html = response.content.decode()
    shown = {job.pk for job in Job.objects.filter(name__startswith=mixed_jobs["prefix"]) if f'/jobs/{job.pk}/"' in html}
    assert shown == {job.pk for job in mixed_jobs["bob"]}
    anonymous = Client().get("/", {"user": "all", "sort": "-duration"})
    assert anonymous.status_code == 302 and "/jobs/" not in anonymous.content.decode()


@pytest.mark.parametrize("who", ["admin, all users", "own jobs"])
def test_the_duration_order_comes_from_its_indexes(make_user, mixed_jobs, who):
    # A later migration that remakes jobs_job on SQLite (Django copies the
    # table) would drop migration 0012's raw indexes without a word; the
    # order would stay right, only slow. This notices.
    admin = make_user("admin", admin=True)
    viewer, user = (admin, listing.ALL_USERS) if who.startswith("admin") else (mixed_jobs["alice"][0].owner, "")
    with CaptureQueriesContext(connection) as queries:
        listing.job_list_page(listing.JobFilters(user=user, sort="-duration"), viewer=viewer, number=2, per_page=3)
    [statement] = [q["sql"] for q in queries.captured_queries if "UNION ALL" in q["sql"]]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + statement)
            plan = " ".join(row[-1] for row in cursor.fetchall())
            owner = "" if who.startswith("admin") else "owner_"
            for name in ("run_time", "running_since", "never_started"):
                assert f"job_{owner}{name}_sqlite_idx" in plan, plan
        else:  # PostgreSQL: migration 0008's, which its planner picks as the table grows
            cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'jobs_job'")
            assert {"job_run_time_idx", "job_running_since_idx"} <= {name for (name,) in cursor.fetchall()}


# Two starts whose run times of exactly 500 s come out of SQLite's julianday
# arithmetic as 500.00002 s and 499.99998 s: unrounded, the job made second
# sorted first ascending, whatever its id.
EQUAL_RUNS_STARTED = [datetime(2025, 12, 31, 18, 56, 53, tzinfo=dt_timezone.utc),
                      datetime(2025, 12, 31, 22, 0, 13, tzinfo=dt_timezone.utc)]


@pytest.mark.parametrize("sort", SORTS)
def test_jobs_that_ran_equally_long_tie_by_id_on_every_way_to_the_list(make_user, alice, sort):
    admin = make_user("admin", admin=True)
    vc = VirtualCluster.objects.get(name=VirtualCluster.DEFAULT)
    prefix = unique("tie_")
    with transaction.atomic():
        made = [Job.objects.create(owner=alice, name=f"{prefix}{n}", virtual_cluster=vc, state=State.SUCCEEDED,
                                   config_raw="{}", config={}, submitted_at=started, started_at=started,
                                   finished_at=started + timedelta(seconds=500))
                for n, started in enumerate(EQUAL_RUNS_STARTED)]
        expected = sorted((job.pk for job in made), reverse=sort.startswith("-"))
        ours = set(expected)
        for filters, viewer in ((listing.JobFilters(user=listing.ALL_USERS, sort=sort), admin),  # indexed, all users
                                (listing.JobFilters(sort=sort), alice),  # indexed, own jobs
                                (listing.JobFilters(q=prefix, sort=sort), alice)):  # filtered: a plain sort
            assert [pk for pk in walk(filters, viewer, per_page=50) if pk in ours] == expected, filters
        transaction.set_rollback(True)
