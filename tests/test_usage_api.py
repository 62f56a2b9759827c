"""The usage API (jobs/api/views/usage.py), the job page's usage panel and
the per-task gauges of /metrics, over samples written into the database
(the sampler itself is tested in tests/test_usage.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import IdleGpus, TaskUsage
from jobs.services import usage
from tests.test_metrics import samples as metric_samples
from tests.test_usage import node, running_tasks  # noqa: F401  (fixture)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def job_with_samples(alice, node):  # noqa: F811
    attempts = running_tasks(alice, node, 2)
    now = timezone.now()
    usage.samples_record([
        usage.Sample(a.pk, now - timedelta(seconds=s), cpu_percent=50.0 + i, memory_bytes=1000 * (i + 1),
                     network_rx_bytes=7, network_tx_bytes=3)
        for i, a in enumerate(attempts) for s in (10, 5)
    ])
    return attempts[0].job, attempts, now


def v1_url(job, role="main", index=0) -> str:
    return f"/api/v1/user/{job.owner.username}/jobs/{job.name}/tasks/{role}/{index}/metrics"


def v2_url(job) -> str:
    return f"/api/v2/jobs/{job.owner.username}~{job.name}/metrics"


def test_it_gives_the_owner_a_tasks_samples_in_the_documented_shape(alice, job_with_samples):
    job, _attempts, now = job_with_samples
    for prefix in ("", "/rest-server"):
        answer = logged_in(alice).get(prefix + v1_url(job, index=1))
        assert answer.status_code == 200, answer.content
        body = answer.json()
        assert body["taskState"] == "RUNNING" and len(body["samples"]) == 2
        sample = body["samples"][0]
        assert sample["time"].endswith("Z")
        assert (sample["cpuPercent"], sample["memoryBytes"], sample["networkRxBytes"], sample["networkTxBytes"]) == (
            51.0, 2000, 7, 3)
        assert sample["gpus"] == []  # simulated GPUs report nothing


def test_it_gives_the_samples_after_since(alice, job_with_samples):
    job, _attempts, now = job_with_samples
    since = (now - timedelta(seconds=7)).isoformat()
    assert len(logged_in(alice).get(v1_url(job), {"since": since}).json()["samples"]) == 1
    body = logged_in(alice).get(v2_url(job), {"since": since}).json()
    assert [len(t["samples"]) for t in body["tasks"]] == [1, 1]
    assert body["tasks"][0]["gpusSimulated"] is True and body["tasks"][0]["idleGpus"] is False


def test_it_names_since_when_it_is_no_time(alice, job_with_samples):
    job, _attempts, _now = job_with_samples
    answer = logged_in(alice).get(v2_url(job), {"since": "yesterday"})
    assert answer.status_code == 400
    assert answer.json()["code"] == "InvalidParametersError" and "since" in answer.json()["message"]


def test_it_answers_admins_and_refuses_other_users_and_anonymous_callers(alice, bob, admin_user, job_with_samples):
    job, _attempts, _now = job_with_samples
    for url in (v1_url(job), v2_url(job)):
        assert logged_in(admin_user).get(url).status_code == 200
        stranger = logged_in(bob).get(url)
        assert stranger.status_code == 404 and stranger.json()["code"] == "NoJobError"
        assert Client().get(url).status_code == 401


def test_the_job_page_has_a_usage_panel_pointing_at_the_api(alice, bob, job_with_samples):
    job, _attempts, _now = job_with_samples
    page = logged_in(alice).get(f"/jobs/{job.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-metrics-url="{v2_url(job)}"' in html and "uPlot.iife.min.js" in html
    assert "simulated GPUs report no utilisation" in html
    assert logged_in(bob).get(f"/jobs/{job.pk}/").status_code == 404


def test_metrics_gives_the_latest_sample_of_each_running_task(admin_user, job_with_samples):
    job, attempts, _now = job_with_samples
    IdleGpus.objects.create(attempt=attempts[0], since=timezone.now() - timedelta(hours=1))
    found = metric_samples(logged_in(admin_user).get("/metrics"))
    labels = (("job", f"{job.owner.username}~{job.name}"), ("node", attempts[0].node_name), ("task", "main-1"),
              ("user", job.owner.username))
    assert found["portal_task_cpu_percent", labels] == 51.0
    assert found["portal_task_memory_bytes", labels] == 2000
    assert found["portal_task_network_receive_bytes_total", labels] == 7
    assert found["portal_task_gpus_idle", labels] == 0
    idle_labels = tuple((k, "main-0" if k == "task" else v) for k, v in labels)
    assert found["portal_task_gpus_idle", idle_labels] == 1


def test_the_job_page_and_the_job_list_flag_a_task_with_idle_gpus(alice, job_with_samples):
    job, attempts, _now = job_with_samples
    client = logged_in(alice)
    assert "GPUs idle" not in client.get(f"/jobs/{job.pk}/").content.decode()
    IdleGpus.objects.create(attempt=attempts[1], since=timezone.now() - timedelta(hours=1))
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-idle-task="main-1"' in page and "GPUs idle" in page
    rows = client.get("/jobs/rows/").content.decode()
    row = rows[rows.index(f'data-job-id="{job.pk}"'):]
    assert "GPUs idle" in row[:row.index("</tr>")]
    assert client.get(v2_url(job)).json()["tasks"][1]["idleGpus"] is True


def test_since_set_to_the_last_samples_own_time_gives_nothing_new(alice, bob, node):  # noqa: F811
    """Samples are stored to the microsecond and given to the millisecond:
    the last one came back at every poll that passed its time."""
    attempt = running_tasks(alice, node, 1)[0]
    usage.samples_record([usage.Sample(attempt.pk, timezone.now().replace(microsecond=123456), cpu_percent=10.0,
                                       memory_bytes=1)])
    url = f"/api/v1/user/{alice.username}/jobs/{attempt.job.name}/tasks/main/0/metrics"
    last = logged_in(alice).get(url).json()["samples"][-1]["time"]
    assert last.endswith(".123Z")
    assert logged_in(alice).get(url, {"since": last}).json()["samples"] == []
    assert logged_in(bob).get(url, {"since": last}).status_code == 404
    assert Client().get(url, {"since": last}).status_code == 401


def test_paging_on_with_since_reaches_every_sample(alice, node):  # noqa: F811
    """Without `since` the newest MAX_SAMPLES; with it the oldest after it,
    so paging on from the last one reads every sample (it gave the newest
    5,000 after `since`, and the older ones could never be read)."""
    attempt = running_tasks(alice, node, 1)[0]
    start = timezone.now() - timedelta(hours=8)
    TaskUsage.objects.bulk_create([
        TaskUsage(attempt_id=attempt.pk, at=start + timedelta(seconds=5 * i), cpu_percent=1.0, memory_bytes=1)
        for i in range(usage.MAX_SAMPLES + 10)])
    try:
        url = f"/api/v1/user/{alice.username}/jobs/{attempt.job.name}/tasks/main/0/metrics"
        client = logged_in(alice)
        newest = client.get(url).json()["samples"]
        assert len(newest) == usage.MAX_SAMPLES and newest[-1]["time"] > newest[0]["time"]
        since, seen = (start - timedelta(seconds=1)).isoformat(), []
        while page := client.get(url, {"since": since}).json()["samples"]:
            seen += [sample["time"] for sample in page]
            since = page[-1]["time"]
        assert len(seen) == len(set(seen)) == usage.MAX_SAMPLES + 10 and seen == sorted(seen)
    finally:  # old samples that usage_compact in other tests would fold (the database outlives a test)
        TaskUsage.objects.filter(attempt_id=attempt.pk).delete()


def test_a_whole_jobs_answer_holds_at_most_max_job_samples_and_pages_on_through_all(alice, bob, node,  # noqa: F811
                                                                                    monkeypatch):
    """Each task gave up to MAX_SAMPLES: a job of 1,000 tasks, five million
    samples in one answer for one worker to hold. The job's answer is now
    bounded over all its tasks, and `since` still reaches every sample."""
    monkeypatch.setattr(usage, "MAX_JOB_SAMPLES", 30)
    attempts = running_tasks(alice, node, 3)
    start = timezone.now() - timedelta(minutes=10)
    TaskUsage.objects.bulk_create([
        TaskUsage(attempt_id=attempt.pk, at=start + timedelta(seconds=5 * i), cpu_percent=float(i), memory_bytes=1)
        for attempt in attempts for i in range(25)])
    try:
        url = v2_url(attempts[0].job)
        client = logged_in(alice)
        body = client.get(url).json()
        assert body["samplesPerTask"] == 10
        assert [len(task["samples"]) for task in body["tasks"]] == [10, 10, 10]
        assert [s["cpuPercent"] for s in body["tasks"][0]["samples"]] == [float(i) for i in range(15, 25)]  # newest
        since, seen = (start - timedelta(seconds=1)).isoformat(), {attempt.pk: [] for attempt in attempts}
        while (body := client.get(url, {"since": since}).json()) and any(t["samples"] for t in body["tasks"]):
            assert sum(len(t["samples"]) for t in body["tasks"]) <= 30
            for attempt, task in zip(attempts, body["tasks"]):
                seen[attempt.pk] += [s["time"] for s in task["samples"]]
            since = min(task["samples"][-1]["time"] for task in body["tasks"] if task["samples"])
        assert all(sorted(set(times)) == sorted(set(seen[attempts[0].pk])) and len(set(times)) == 25
                   for times in seen.values())
        assert logged_in(bob).get(url).status_code == 404
        assert Client().get(url).status_code == 401
    finally:  # old samples that usage_compact in other tests would fold (the database outlives a test)
        TaskUsage.objects.filter(attempt_id__in=[attempt.pk for attempt in attempts]).delete()
