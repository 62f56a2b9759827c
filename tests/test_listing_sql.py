"""The SQL the portal writes per database (jobs/services/listing.py's
RunSeconds, the only raw fragment: `julianday` on SQLite, `EXTRACT(EPOCH ...)`
on PostgreSQL), run on whichever database the test run uses. scripts/test
runs this file in both passes, so each fragment runs on both engines.

The jobs are written inside a transaction that is rolled back at the end:
no other process (agents, the scheduler) ever sees a running job without
tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs.models import Job, State, VirtualCluster
from jobs.services import listing


@pytest.fixture
def jobs_by_duration(alice) -> Iterator[dict[str, Job]]:
    """Five jobs of alice's: two finished (10 s and 3000 s), two running
    (for about 100 s and 4000 s so far) and one that never started."""
    vc = VirtualCluster.objects.get(name=VirtualCluster.DEFAULT)
    now = timezone.now()

    def job(name: str, state: str, started_ago: float | None, ran: float | None) -> Job:
        started = now - timedelta(seconds=started_ago) if started_ago is not None else None
        finished = started + timedelta(seconds=ran) if ran is not None else None
        return Job.objects.create(owner=alice, name=name, virtual_cluster=vc, state=state, config_raw="{}",
                                  config={}, submitted_at=now - timedelta(hours=3), started_at=started,
                                  finished_at=finished)

    with transaction.atomic():
        yield {
            "short": job("short", State.SUCCEEDED, 1000, 10),
            "long": job("long", State.FAILED, 5000, 3000),
            "running": job("running", State.RUNNING, 100, None),
            "old_running": job("old_running", State.RUNNING, 4000, None),
            "waiting": job("waiting", State.WAITING, None, None),
        }
        transaction.set_rollback(True)


def _names(sort: str, viewer) -> list[str]:
    jobs = listing.filtered_jobs(listing.JobFilters(sort=sort), viewer=viewer)
    return list(jobs.values_list("name", flat=True))


def test_it_sorts_by_how_long_jobs_ran_with_running_ones_counted_until_now(alice, jobs_by_duration):
    assert _names("-duration", alice) == ["old_running", "long", "running", "short", "waiting"]
    # Jobs that never started go last both ways.
    assert _names("duration", alice) == ["short", "running", "long", "old_running", "waiting"]


def test_it_measures_run_time_in_seconds(alice, jobs_by_duration):
    jobs = listing.filtered_jobs(listing.JobFilters(sort="-duration"), viewer=alice)
    seconds = dict(jobs.values_list("name", "run_time"))
    assert seconds["short"] == pytest.approx(10, abs=0.01)
    assert seconds["long"] == pytest.approx(3000, abs=0.01)
    # Counted to the database's now: at least what had passed when the rows
    # were made; less than an hour more, however slow the machine.
    assert 100 <= seconds["running"] < 100 + 3600
    assert 4000 <= seconds["old_running"] < 4000 + 3600
    assert seconds["waiting"] is None


def test_a_page_sorted_by_duration_shows_only_the_viewers_jobs(alice, bob, jobs_by_duration):
    page = listing.job_list_page(listing.JobFilters(sort="-duration"), viewer=alice)
    assert [job.name for job in page.jobs] == ["old_running", "long", "running", "short", "waiting"]
    assert listing.job_list_page(listing.JobFilters(sort="-duration"), viewer=bob).jobs == []


def test_it_runs_on_the_database_of_this_test_run():
    # scripts/test's second pass sets PORTAL_TEST_DATABASE=postgres; the
    # fragments above must then have run as PostgreSQL's SQL, not SQLite's.
    import os

    expected = {"sqlite": "sqlite", "postgres": "postgresql"}[os.environ.get("PORTAL_TEST_DATABASE", "sqlite")]
    assert connection.vendor == expected


@pytest.mark.parametrize("sort", ["-duration", "duration"])
def test_pages_sorted_by_duration_follow_the_sorted_list(alice, jobs_by_duration, sort):
    # On PostgreSQL a page is found another way (listing._ids_by_run_time,
    # each group of jobs by its own index): pages must still cut the one order.
    pages = [listing.job_list_page(listing.JobFilters(sort=sort), viewer=alice, number=n, per_page=2) for n in (1, 2, 3)]
    assert [[job.name for job in page.jobs] for page in pages] == [
        _names(sort, alice)[0:2], _names(sort, alice)[2:4], _names(sort, alice)[4:6]]
    assert [page.has_next for page in pages] == [True, True, False]


@pytest.mark.parametrize("whose", ["own", "everyone's"])
def test_the_search_box_matches_names_case_blind_and_literally_and_ids(make_user, alice, bob, jobs_by_duration,
                                                                       whose):
    # PostgreSQL filters names directly (its trigram index); SQLite reads a
    # user's own list from the (owner, name) index and everyone's from the
    # names' trigram index (from three characters on): the same jobs each way.
    vc = VirtualCluster.objects.get(name=VirtualCluster.DEFAULT)
    for owner, name in ((alice, "Sweep_A"), (alice, "sweepXa"), (bob, "sweep_a")):
        Job.objects.create(owner=owner, name=name, virtual_cluster=vc, state=State.SUCCEEDED, config_raw="{}", config={})
    admin = make_user("admin", admin=True)

    def found(q: str) -> list[str]:
        if whose == "own":
            return sorted(_names_matching(q, alice))
        return sorted(_names_matching(q, admin, user=listing.ALL_USERS, of=alice))

    assert found("SWEEP") == ["Sweep_A", "sweepXa"]
    assert found("p_a") == ["Sweep_A"]  # "_" is a character here, not LIKE's wildcard
    assert found("%") == []
    assert found("xA") == ["sweepXa"]  # shorter than SQLite's trigrams: its names are read
    # Words of FTS5's query syntax are plain text here too.
    assert found('p"_a') == found("NEAR(sweep") == found("sweep*") == found("name:x") == []
    running = jobs_by_duration["running"]
    assert found(f"#{running.pk}") == found(str(running.pk)) == ["running"]


def test_the_search_follows_jobs_stored_renamed_and_deleted(make_user, alice):
    # On SQLite the search reads a trigram index that triggers keep
    # (migration 0015); a migration that rebuilds jobs_job drops them, and
    # then new names are not found.
    vc = VirtualCluster.objects.get(name=VirtualCluster.DEFAULT)

    def job(name: str) -> Job:
        return Job.objects.create(owner=alice, name=name, virtual_cluster=vc, state=State.SUCCEEDED,
                                  config_raw="{}", config={})

    job("needle_kept")
    renamed, gone = job("haystack_old"), job("needle_gone")
    Job.objects.filter(pk=renamed.pk).update(name="needle_renamed")
    gone.delete()
    admin = make_user("admin", admin=True)
    everyones = {"user": listing.ALL_USERS, "of": alice}  # the list that reads the trigram index
    assert sorted(_names_matching("NEEDLE", admin, **everyones)) == ["needle_kept", "needle_renamed"]
    assert _names_matching("haystack", admin, **everyones) == []
    if connection.vendor == "sqlite":
        # FTS5's own check of the index against the jobs table, row by row.
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO jobs_job_name_fts (jobs_job_name_fts, rank) VALUES ('integrity-check', 1)")


def test_an_admins_search_looks_in_the_user_chosen_or_in_everyones_jobs(make_user, alice, bob):
    admin = make_user("admin", admin=True)
    vc = VirtualCluster.objects.get(name=VirtualCluster.DEFAULT)
    for owner, name in ((alice, "probe_one"), (bob, "Probe_two"), (admin, "probe_three")):
        Job.objects.create(owner=owner, name=name, virtual_cluster=vc, state=State.SUCCEEDED, config_raw="{}", config={})

    assert sorted(_names_matching("PROBE", admin, user=bob.username)) == ["Probe_two"]
    assert sorted(_names_matching("PROBE", admin, user="")) == ["probe_three"]
    everyone = _names_matching("PROBE", admin, user=listing.ALL_USERS)
    assert {"probe_one", "Probe_two", "probe_three"} <= set(everyone)


def _names_matching(q: str, viewer, of=None, **filters) -> list[str]:
    """The names the list shows for a search; `of`: only that user's among
    them (everyone's list holds other tests' jobs too)."""
    jobs = listing.filtered_jobs(listing.JobFilters(q=q, **filters), viewer=viewer)
    if of is not None:
        jobs = jobs.filter(owner=of)
    return list(jobs.values_list("name", flat=True))
