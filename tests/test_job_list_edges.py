"""The job list, its tags and a job's page, from review: what a tag link,
the list's summary line and its filters say must be the jobs they show.

Jobs are rows made the way tests/test_pages.py makes them (no Docker).
"""

from __future__ import annotations

from jobs.services import tags
from tests.test_pages import client_for, ended_job, row_names


def test_a_tag_with_spaces_around_it_filters_the_list_as_the_api_does(alice):
    # REST v2 takes a tag as given (OpenPAI does); its link in the list and on
    # the job page must then find the job, as tagsContain does.
    spaced, plain = ended_job(alice, "spaced_tag"), ended_job(alice, "plain_tag")
    tags.job_tag_add(job=spaced, value=" gpu ")
    tags.job_tag_add(job=plain, value="gpu")
    client = client_for(alice)
    assert row_names(client.get("/", {"tag": " gpu "})) == ["spaced_tag"]
    assert row_names(client.get("/jobs/rows/", {"tag": " gpu "})) == ["spaced_tag"]
    assert [job["name"] for job in client.get("/api/v2/jobs", {"tagsContain": " gpu "}).json()] == ["spaced_tag"]
    assert row_names(client.get("/", {"tag": "gpu"})) == ["plain_tag"]
    # A blank filter is no filter.
    assert sorted(row_names(client.get("/", {"tag": "   "}))) == ["plain_tag", "spaced_tag"]


def test_a_page_past_the_last_says_how_many_jobs_there_are_without_a_range(alice):
    for i in range(3):
        ended_job(alice, f"few_{i}")
    html = client_for(alice).get("/", {"q": "few_", "page": 4}).content.decode()
    assert "This page is past the last job" in html
    summary = html.split('id="list-summary">', 1)[1].split("</p>", 1)[0]
    assert "–" not in summary  # it said "0–150 of 3 jobs"
    assert "3 jobs" in summary


def test_a_tag_on_another_users_job_page_links_an_admin_to_that_users_jobs_with_it(alice, admin_user):
    job = ended_job(alice, "admins_view")
    tags.job_tag_add(job=job, value="red")
    mine = ended_job(admin_user, "admins_own")
    tags.job_tag_add(job=mine, value="red")
    client = client_for(admin_user)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    link = page.split('<a class="tag" href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    assert row_names(client.get(link)) == ["admins_view"]  # it listed the admin's own "admins_own"
    # The owner's link stays the plain one.
    assert 'href="/?tag=red"' in client_for(alice).get(f"/jobs/{job.pk}/").content.decode()


def test_a_search_longer_than_a_job_name_finds_nothing_rather_than_its_first_part(alice):
    # It was cut to 128 characters, and then found the job named so.
    ended_job(alice, "a" * 128)
    page = client_for(alice).get("/", {"q": "a" * 200})
    assert page.status_code == 200 and row_names(page) == []
    assert "a" * 200 in page.content.decode()  # kept in the search box as typed
    assert row_names(client_for(alice).get("/", {"q": "a" * 128})) == ["a" * 128]
