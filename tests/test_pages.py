"""The job list, a job's page, its logs and the cluster pages, through
Django's test client against the session's real database.

Jobs that must stay WAITING ask for more GPUs than any node has, so a test
cluster running in the same session never starts them; finished jobs and
log lines are written as rows, the way the node agents store them.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import (
    ACTIVE_TASK_STATES, FINAL_STATES, ExitType, ImagePull, Job, JobAttempt, LogLine, Node, State, Stream, Task,
    TaskAttempt, TaskState, VirtualCluster,
)
from jobs.spec import parse_job_value
from tests.helpers import config, role, submit

NEVER_FITS_GPUS = 64  # the most a role may ask for, more than any node has


@pytest.fixture(autouse=True)
def _rows_end_with_their_test():
    """Running rows written here hold CPUs of the default virtual cluster
    with no agent to end them: each test's are stopped after it, so tests
    that run later still find the cluster's share free."""
    first = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    yield
    TaskAttempt.objects.filter(job_id__gt=first, state__in=ACTIVE_TASK_STATES).update(state=TaskState.STOPPED)
    Job.objects.filter(pk__gt=first).exclude(state__in=FINAL_STATES).update(state=State.STOPPED)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def waiting_job(owner, name: str) -> Job:
    return submit(owner, config(name, role(gpus=NEVER_FITS_GPUS, command="sleep 1")))


def ended_job(owner, name: str, state: str = State.SUCCEEDED, **fields) -> Job:
    """A finished job row (what the platform leaves behind), with its attempt and one task."""
    now = timezone.now()
    cfg = fields.pop("config", None) or config(name, role())
    # Stored as submission stores it: normalized, every field filled in.
    stored = parse_job_value(cfg, user_name=owner.username, default_fs_uri=settings.PAI_DEFAULT_FS_URI).normalized
    defaults = dict(config_raw=json.dumps(cfg), config=stored, total_tasks=1, total_roles=1, started_at=now - timedelta(minutes=3),
                    finished_at=now, exit_type=ExitType.SUCCEEDED if state == State.SUCCEEDED else ExitType.USER_STOP)
    defaults.update(fields)
    job = Job.objects.create(owner=owner, name=name, virtual_cluster=VirtualCluster.objects.get(name="default"),
                             state=state, **defaults)
    JobAttempt.objects.create(job=job, number=1, state=state, started_at=job.started_at, finished_at=job.finished_at,
                              exit_type=job.exit_type, exit_code=job.exit_code, exit_reason=job.exit_reason)
    Task.objects.create(job=job, role="main", index=0)
    return job


def task_attempt(job: Job, **fields) -> TaskAttempt:
    values = dict(number=1, node_name="node-x", host_ip="127.0.0.1", ip="10.9.0.2", state=TaskState.SUCCEEDED,
                  container_id="c0ffee" * 10, exit_code=0, exit_type=ExitType.SUCCEEDED, started_at=job.started_at,
                  finished_at=job.finished_at)
    values.update(fields)
    return TaskAttempt.objects.create(task=job.tasks.get(), job_attempt=job.attempts.get(number=1), job=job, **values)


def row_names(response) -> list[str]:
    return row_names_of(response.content.decode())


def row_names_of(html: str) -> list[str]:
    return re.findall(r'<td class="name"><a href="/jobs/\d+/">([^<]+)</a>', html)


# ------------------------------------------------------------------ the list


def test_it_shows_users_only_their_own_jobs_whatever_the_url_asks(alice, bob):
    ended_job(alice, "alice_job")
    ended_job(bob, "bob_job")
    client = client_for(alice)
    assert row_names(client.get("/")) == ["alice_job"]
    assert row_names(client.get("/", {"user": "all"})) == ["alice_job"]
    assert row_names(client.get("/", {"user": bob.username})) == ["alice_job"]
    assert 'id="f-user"' not in client.get("/").content.decode()  # no user filter for them


def test_it_lets_admins_choose_mine_everyone_or_one_user(alice, bob, admin_user):
    ended_job(alice, "a_job")
    ended_job(bob, "b_job")
    client = client_for(admin_user)
    page = client.get("/")
    assert row_names(page) == [] and "You have no jobs yet" in page.content.decode()
    everyone = row_names(client.get("/", {"user": "all"}))
    assert "a_job" in everyone and "b_job" in everyone
    assert row_names(client.get("/", {"user": alice.username})) == ["a_job"]


def test_it_filters_by_status_virtual_cluster_and_search(alice):
    ended_job(alice, "train_resnet", State.SUCCEEDED)
    failed = ended_job(alice, "train_bert", State.FAILED, exit_type=ExitType.USER_EXIT, exit_code=2)
    waiting_job(alice, "eval_bert")
    client = client_for(alice)
    assert row_names(client.get("/", {"status": "FAILED"})) == ["train_bert"]
    assert row_names(client.get("/", {"status": "active"})) == ["eval_bert"]
    assert sorted(row_names(client.get("/", {"q": "BERT"}))) == ["eval_bert", "train_bert"]
    assert row_names(client.get("/", {"q": f"#{failed.pk}"})) == ["train_bert"]
    assert row_names(client.get("/", {"vc": "no_such_vc"})) == []
    assert "No jobs match these filters" in client.get("/", {"vc": "no_such_vc"}).content.decode()
    # Unknown values fall back to the defaults instead of failing.
    assert client.get("/", {"status": "BOGUS", "sort": "password", "page": "x"}).status_code == 200


def test_it_sorts_by_a_column_both_ways_and_marks_it(alice):
    for name, tasks in (("s_b", 3), ("s_a", 1), ("s_c", 2)):
        ended_job(alice, name, total_tasks=tasks)
    client = client_for(alice)
    assert row_names(client.get("/", {"sort": "name"})) == ["s_a", "s_b", "s_c"]
    assert row_names(client.get("/", {"sort": "-name"})) == ["s_c", "s_b", "s_a"]
    page = client.get("/", {"sort": "-tasks", "q": "s_"})
    assert row_names(page) == ["s_b", "s_c", "s_a"]
    html = page.content.decode()
    assert 'aria-sort="descending"' in html
    # The heading links keep the search and flip the direction.
    assert 'href="?sort=tasks&amp;q=s_"' in html or 'href="?q=s_&amp;sort=tasks"' in html


def test_it_pages_fifty_at_a_time_keeping_the_filters(alice):
    now = timezone.now()
    cfg = config("x", role())
    vc = VirtualCluster.objects.get(name="default")
    Job.objects.bulk_create(
        Job(owner=alice, name=f"bulk_{i:03d}", virtual_cluster=vc, state=State.SUCCEEDED, config_raw="{}", config=cfg,
            submitted_at=now - timedelta(minutes=i))
        for i in range(120)
    )
    client = client_for(alice)
    first = client.get("/", {"q": "bulk"})
    assert row_names(first)[:2] == ["bulk_000", "bulk_001"] and len(row_names(first)) == 50
    html = first.content.decode()
    assert "1–50 of 120 jobs" in html
    assert 'href="?q=bulk&amp;page=2"' in html
    third = client.get("/", {"q": "bulk", "page": 3})
    assert row_names(third) == [f"bulk_{i:03d}" for i in range(100, 120)]
    assert "This page is past the last job" in client.get("/", {"q": "bulk", "page": 9}).content.decode()


def test_it_escapes_a_jobs_tags_in_the_list_and_its_live_rows(alice):
    from jobs.services import tags

    job = ended_job(alice, "escaped_tags")
    tags.job_tag_add(job=job, value='<b>x</b> & "y"')
    client = client_for(alice)
    for path in ("/", "/jobs/rows/"):
        html = client.get(path, {"q": "escaped_tags"}).content.decode()
        assert row_names_of(html) == ["escaped_tags"]
        assert "<b>x</b>" not in html
        # The tag's text and title, and its link: the URL's "&" escaped too.
        assert html.count("&lt;b&gt;x&lt;/b&gt; &amp; &quot;y&quot;") >= 2
        assert 'href="?q=escaped_tags&amp;tag=%3Cb%3Ex%3C%2Fb%3E+%26+%22y%22"' in html


def test_it_serves_the_rows_alone_for_live_updates(alice):
    waiting_job(alice, "live_one")
    response = client_for(alice).get("/jobs/rows/", {"status": "WAITING"})
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert 'data-state="WAITING"' in html and "live_one" in html


def test_it_stops_the_selected_jobs_and_reports_each_one(alice, bob):
    first, second = waiting_job(alice, "bulk_stop_1"), waiting_job(alice, "bulk_stop_2")
    done = ended_job(alice, "bulk_done")
    strangers = waiting_job(bob, "not_alices")
    client = client_for(alice)
    response = client.post("/jobs/stop/", {"job": [first.pk, second.pk, done.pk, strangers.pk], "next": "/?status=active"},
                           follow=True)
    assert response.redirect_chain[-1][0] == "/?status=active"
    texts = [str(m) for m in response.context["messages"]]
    assert "bulk_stop_1: stopped." in texts and "bulk_stop_2: stopped." in texts
    assert any(t.startswith("bulk_done: not stopped, the job has already ended") for t in texts)
    assert f"Job #{strangers.pk}: not found." in texts
    for job, state in ((first, State.STOPPED), (second, State.STOPPED), (strangers, State.WAITING)):
        job.refresh_from_db()
        assert job.state == state
    # An outside `next` is not followed.
    assert client.post("/jobs/stop/", {"next": "https://example.com/"})["Location"] == "/"


# ------------------------------------------------------------ a job's page


def test_strangers_get_404_on_every_url_of_a_job_and_admins_do_not(alice, bob, admin_user):
    job = ended_job(alice, "private_job")
    attempt = task_attempt(job)
    urls = [f"/jobs/{job.pk}/", f"/jobs/{job.pk}/live/", f"/jobs/{job.pk}/stop/", f"/jobs/{job.pk}/config/submitted/",
            f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/", f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/search/?q=a",
            f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/download/"]
    stranger, admin = client_for(bob), client_for(admin_user)
    for url in urls:
        assert stranger.get(url).status_code == 404, url
        assert admin.get(url).status_code in (200, 302), url
    running = waiting_job(alice, "private_waiting")
    assert stranger.post(f"/jobs/{running.pk}/stop/").status_code == 404
    running.refresh_from_db()
    assert running.state == State.WAITING


def test_it_explains_a_waiting_job_with_its_place_in_the_queue(alice):
    # A ready node so the "can never fit" check has something to measure against.
    node = Node.objects.create(name=f"pages-node-{alice.pk}", address="127.0.0.9", docker_host="unix:///nonexistent",
                               cpus=2, memory_mb=1024, last_heartbeat=timezone.now(), agent_pid=1)
    try:
        job = waiting_job(alice, "too_big")
        html = client_for(alice).get(f"/jobs/{job.pk}/").content.decode()
    finally:
        node.delete()
    assert 'class="badge big WAITING"' in html
    assert "Waiting for resources" in html
    assert re.search(r"Number <strong>\d+</strong> in the queue of virtual cluster <strong>default</strong>", html)
    assert "This job can never start as configured" in html
    assert "Not placed yet" in html


def test_a_job_stopped_before_it_started_says_it_never_did(alice):
    """Not "not yet" and "starts when the whole job fits": it never will."""
    job = ended_job(alice, "stopped_waiting", State.STOPPED, started_at=None, exit_type=ExitType.USER_STOP,
                    exit_reason="stopped by its user")
    html = client_for(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert '<dt>Started</dt><dd><span class="muted">never</span></dd>' in html
    assert "Never placed: the job ended before this task started." in html
    assert "No task of this job started, so it has no log." in html and ">No task started</option>" in html
    assert "No samples: no task of this job started." in html
    for words in ("not yet", "Not placed yet", "once a task starts", "No task has started yet", "No samples yet"):
        assert words not in html, words


def test_it_says_why_a_job_ended_and_how_each_attempt_went(alice):
    job = ended_job(alice, "retried", State.FAILED, exit_type=ExitType.USER_EXIT, exit_code=3, retry_limit=1,
                    attempt_number=2, exit_reason="task main-0 failed")
    JobAttempt.objects.filter(job=job, number=1).update(exit_type=ExitType.USER_EXIT, exit_code=3, state=State.FAILED)
    JobAttempt.objects.create(job=job, number=2, state=State.FAILED, exit_type=ExitType.OOM, exit_code=137)
    html = client_for(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "The command exited non-zero (exit code 3): task main-0 failed" in html
    assert "Killed for exceeding its memory limit (exit code 137)" in html
    assert "1 <span class=\"muted\">of 1 allowed</span>" in html


def test_the_job_pages_headings_go_down_one_level_at_a_time(alice):
    """A screen reader's outline of the page: no h3 straight under the h1."""
    job = ended_job(alice, "outlined", State.FAILED, exit_type=ExitType.USER_EXIT, exit_code=1, retry_limit=1,
                    attempt_number=2)
    JobAttempt.objects.create(job=job, number=2, state=State.FAILED, exit_type=ExitType.USER_EXIT, exit_code=1)
    html = client_for(alice).get(f"/jobs/{job.pk}/").content.decode()
    html = re.sub(r"<dialog.*?</dialog>", "", html, flags=re.DOTALL)  # a dialog's heading starts its own outline
    levels = [int(level) for level in re.findall(r"<h([1-6])[\s>]", html)]
    assert levels[0] == 1 and all(b <= a + 1 for a, b in zip(levels, levels[1:])), levels
    assert '<h2 class="sub">Attempts</h2>' in html


def test_it_lists_each_tasks_node_ports_and_logs_with_web_ports_as_links(alice):
    job = ended_job(alice, "with_ports", State.RUNNING, finished_at=None, exit_type="")
    attempt = task_attempt(job, state=TaskState.RUNNING, finished_at=None, exit_code=None, exit_type="",
                           ports={"jupyter": [20001], "ssh": [20002], "data": [20003, 20004]}, gpus=[0, 1], gpu_type="V100")
    html = client_for(alice).get(f"/jobs/{job.pk}/").content.decode()
    # A web port links through the portal's proxy, never to the node's address.
    assert f'<a href="/jobs/{job.pk}/tasks/{attempt.pk}/ports/20001/" target="_blank"' in html
    assert "http://127.0.0.1:2000" not in html and ">20002<" in html  # ssh is not a web port
    assert "/ports/20002/" not in html
    assert ">20003, 20004<" in html
    assert "2 × V100" in html and "#0, #1" in html and "node-x" in html and ">c0ffeec0ffee<" in html
    assert f'href="/jobs/{job.pk}/logs/{attempt.pk}/stdout/download/?inline=1"' in html
    assert f'href="/jobs/{job.pk}/logs/{attempt.pk}/stderr/download/?inline=1"' in html
    assert f'<option value="{attempt.pk}">main-0 · running</option>' in html
    assert 'href="/submit/?clone=' in html and f'href="/jobs/{job.pk}/stop/"' in html


def test_the_log_viewer_opens_on_the_failed_task_where_it_says_why(alice):
    """A worker that failed among tasks that did not: its stderr, where the
    traceback is (its stdout if it wrote no stderr), not the first task's
    stdout; a failed pull, the platform's note. The URL's choice (kept as the
    reader moves) comes first."""
    job = ended_job(alice, "failed_worker", State.FAILED, exit_type=ExitType.USER_EXIT, exit_code=1, total_tasks=2,
                    config=config("failed_worker", role(tasks=2)))
    Task.objects.create(job=job, role="main", index=1)
    attempts = [TaskAttempt.objects.create(task=task, job_attempt=job.attempts.get(), job=job, number=1,
                                           state=state, exit_code=code, exit_type=exit_type)
                for task, (state, code, exit_type) in zip(job.tasks.order_by("index"), [
                    (TaskState.SUCCEEDED, 0, ExitType.SUCCEEDED), (TaskState.FAILED, 1, ExitType.USER_EXIT)])]
    client = client_for(alice)

    def viewer(query: str = "") -> tuple[str, str]:
        html = client.get(f"/jobs/{job.pk}/{query}").content.decode()
        return re.search(r'data-stream="(\w+)" data-attempt="(\d*)"', html).groups()

    assert viewer() == ("stdout", str(attempts[1].pk))
    LogLine.objects.create(attempt=attempts[1], stream=Stream.STDERR, seq=0, text="ValueError: bad input")
    assert viewer() == ("stderr", str(attempts[1].pk))
    assert viewer(f"?log={attempts[0].pk}&stream=stdout") == ("stdout", str(attempts[0].pk))
    assert viewer("?stream=platform") == ("platform", "")
    Job.objects.filter(pk=job.pk).update(exit_type=ExitType.IMAGE_PULL, exit_code=None)
    assert viewer() == ("platform", str(attempts[1].pk))
    done = ended_job(alice, "fine_job")
    task_attempt(done)
    html = client.get(f"/jobs/{done.pk}/").content.decode()
    assert 'data-stream="stdout" data-attempt=""' in html  # the first task's stdout


def test_the_live_fragment_carries_each_changing_part(alice):
    job = waiting_job(alice, "live_parts")
    html = client_for(alice).get(f"/jobs/{job.pk}/live/").content.decode()
    for part in ("actions", "summary", "tasks", "logtasks"):
        assert f'data-part="{part}"' in html
    assert "<html" not in html


def test_the_live_fragment_reads_as_much_for_many_running_tasks_as_for_one(alice):
    """The page polls it every few seconds: no query per task row."""
    client = client_for(alice)
    counts = []
    for tasks in (1, 4):
        job = ended_job(alice, f"rows_{tasks}", State.RUNNING, finished_at=None, exit_type="", total_tasks=tasks,
                        config=config(f"rows_{tasks}", role(tasks=tasks)))
        for index in range(1, tasks):
            Task.objects.create(job=job, role="main", index=index)
        for task in job.tasks.all():
            TaskAttempt.objects.create(task=task, job_attempt=job.attempts.get(), job=job, number=1, host_ip="127.0.0.1",
                                       state=TaskState.RUNNING, container_id=f"c{task.index}", started_at=job.started_at,
                                       ports={"ssh": [20100 + task.index]})
        with CaptureQueriesContext(connection) as queries:
            html = client.get(f"/jobs/{job.pk}/live/").content.decode()
        assert html.count('class="task-row"') == tasks
        counts.append(len(queries))
    assert counts[0] == counts[1]


def test_a_job_of_many_retries_reads_only_the_shown_attempts_tasks(alice, bob, monkeypatch):
    """1,000 tasks and 100 retries make 101,000 task attempts: the page (and
    its live part, drawn every few seconds) reads the shown attempt's, and
    its log menu at most LOG_MENU_MAX, newest first."""
    from jobs.views import jobs as job_views

    monkeypatch.setattr(job_views, "LOG_MENU_MAX", 7)
    tasks, retries = 3, 4
    job = ended_job(alice, "many_retries", State.RUNNING, finished_at=None, exit_type="", total_tasks=tasks,
                    retry_limit=retries, attempt_number=retries + 1, config=config("many_retries", role(tasks=tasks)))
    for index in range(1, tasks):
        Task.objects.create(job=job, role="main", index=index)
    for number in range(2, retries + 2):
        JobAttempt.objects.create(job=job, number=number, state=State.FAILED if number <= retries else State.RUNNING)
    made = {}
    for number in range(1, retries + 2):
        for task in job.tasks.order_by("index"):
            made[number, task.index] = TaskAttempt.objects.create(
                task=task, job_attempt=job.attempts.get(number=number), job=job, number=number, host_ip="127.0.0.1",
                state=TaskState.RUNNING if number == retries + 1 else TaskState.FAILED, container_id=f"c{number}{task.index}")

    def menu(html: str) -> list[tuple[str, list[str]]]:
        return [(group, re.findall(r'<option value="(\d+)">', options)) for group, options in
                re.findall(r'<optgroup label="Attempt (\d+)">(.*?)</optgroup>', html, re.S)]

    def ids(*numbers: int) -> list[str]:
        return [str(made[number, index].pk) for number in numbers for index in range(tasks)]

    client = client_for(alice)
    try:
        for path in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/live/"):
            html = client.get(path).content.decode()
            assert html.count('class="task-row"') == tasks
            # The shown (current) attempt's 3, then the newest 4 of the others.
            assert menu(html) == [("5", ids(5)), ("4", ids(4)), ("3", [str(made[3, 0].pk)])]
        older = client.get(f"/jobs/{job.pk}/?attempt=2").content.decode()
        assert all(f">c2{index}<" in older for index in range(tasks)) and ">c50<" not in older  # attempt 2's table
        assert menu(older) == [("5", ids(5)), ("4", [str(made[4, 0].pk)]), ("2", ids(2))]
        # Another user and an anonymous client see none of it.
        assert client_for(bob).get(f"/jobs/{job.pk}/live/").status_code == 404
        assert Client().get(f"/jobs/{job.pk}/live/").status_code == 302
    finally:  # its running tasks would hold the default virtual cluster's CPUs for the tests after
        job.delete()


def test_it_stops_a_job_after_asking_first(alice):
    job = waiting_job(alice, "stop_me")
    client = client_for(alice)
    confirm = client.get(f"/jobs/{job.pk}/stop/")
    assert confirm.status_code == 200 and "Stop stop_me?" in confirm.content.decode()
    job.refresh_from_db()
    assert job.state == State.WAITING  # asking changes nothing
    response = client.post(f"/jobs/{job.pk}/stop/", follow=True)
    job.refresh_from_db()
    assert job.state == State.STOPPED and job.exit_reason == f"stopped by {alice.username}"
    assert "stop_me: stopped." in [str(m) for m in response.context["messages"]]
    again = client.post(f"/jobs/{job.pk}/stop/", follow=True)
    assert any("already ended" in str(m) for m in again.context["messages"])


def test_it_downloads_the_config_as_submitted_and_normalized(alice):
    raw = '// my comment\n' + json.dumps(config("cfg_job", role(command="echo $PAI_JOB_NAME")), indent=1)
    job = submit(alice, raw)
    client = client_for(alice)
    submitted = client.get(f"/jobs/{job.pk}/config/submitted/")
    assert submitted["Content-Disposition"] == 'attachment; filename="cfg_job.jsonc"'
    assert submitted.content.decode() == raw
    normalized = client.get(f"/jobs/{job.pk}/config/normalized/")
    assert normalized["Content-Disposition"] == 'attachment; filename="cfg_job.json"'
    assert json.loads(normalized.content) == job.config
    assert client.get(f"/jobs/{job.pk}/config/other/").status_code == 404
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "// my comment" in page


def test_a_starting_jobs_status_line_says_which_image_its_tasks_wait_for(alice, bob):
    job = ended_job(alice, "starting-pull", State.RUNNING, started_at=None, finished_at=None, exit_type="")
    attempt = task_attempt(job, state=TaskState.LAUNCHING, container_id="", exit_code=None, exit_type="",
                           started_at=None, finished_at=None)
    pull = ImagePull.objects.create(attempt=attempt, image="registry.lab:5000/team/big:1")
    owner = client_for(alice)

    def status_line(url: str) -> str:
        page = owner.get(url)
        assert page.status_code == 200
        return " ".join(re.search(r'<div class="status-words">(.*?)</div>', page.content.decode(), re.S)[1].split())

    for url in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/live/"):
        assert "Pulling image <code>registry.lab:5000/team/big:1</code>: 1 task." in status_line(url)
    pull.state = ImagePull.State.WAITING
    pull.save()
    assert "Waiting for the registry of image <code>registry.lab:5000/team/big:1</code>" in status_line(
        f"/jobs/{job.pk}/live/")
    for shown in (client_for(bob).get(f"/jobs/{job.pk}/live/"), Client().get(f"/jobs/{job.pk}/live/")):
        assert shown.status_code in (302, 404) and b"big:1" not in shown.content

    # Once its task has started, or its pull is done, the line says no more.
    TaskAttempt.objects.filter(pk=attempt.pk).update(state=TaskState.RUNNING)
    assert "image" not in status_line(f"/jobs/{job.pk}/live/")
    TaskAttempt.objects.filter(pk=attempt.pk).update(state=TaskState.LAUNCHING)
    ImagePull.objects.filter(pk=pull.pk).update(state=ImagePull.State.DONE)
    assert "image" not in status_line(f"/jobs/{job.pk}/live/")


# ------------------------------------------------------------------- logs


@pytest.fixture
def logged(alice):
    job = ended_job(alice, "chatty")
    attempt = task_attempt(job)
    LogLine.objects.bulk_create(LogLine(attempt=attempt, stream=Stream.STDOUT, seq=i, text=f"line {i} <b>") for i in range(1500))
    LogLine.objects.bulk_create(LogLine(attempt=attempt, stream=Stream.PLATFORM, seq=i, text=t)
                                for i, t in enumerate(["pulling image busybox", "pulled image busybox"]))
    return job, attempt


def seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'data-seq="(\d+)"', html)]


def test_it_tails_a_log_from_its_end_then_after_a_cursor(alice, logged):
    job, attempt = logged
    client = client_for(alice)
    base = f"/jobs/{job.pk}/logs/{attempt.pk}"
    tail = client.get(f"{base}/stdout/").content.decode()
    assert seqs(tail) == list(range(1000, 1500))  # the last 500 lines
    assert 'data-next="1499"' in tail and 'data-final="1"' in tail and 'data-more="0"' in tail
    assert "line 1499 &lt;b&gt;" in tail  # escaped, never markup
    after = client.get(f"{base}/stdout/", {"after": 1400}).content.decode()
    assert seqs(after) == list(range(1401, 1500))
    start = client.get(f"{base}/stdout/", {"after": -1}).content.decode()
    assert seqs(start) == list(range(0, 1000)) and 'data-more="1"' in start
    assert seqs(client.get(f"{base}/stdout/", {"after": 1499}).content.decode()) == []
    assert "pulled image busybox" in client.get(f"{base}/platform/").content.decode()
    assert client.get(f"{base}/stderr/").status_code == 200
    assert client.get(f"{base}/nonsense/").status_code == 404


def test_it_searches_the_whole_log_on_the_server(alice, logged):
    job, attempt = logged
    client = client_for(alice)
    html = client.get(f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/search/", {"q": "LINE 7"}).content.decode()
    found = seqs(html)
    assert found[:3] == [7, 70, 71] and 1499 not in found
    assert "<mark>line 7</mark>" in html
    html = client.get(f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/search/", {"q": "no such text"}).content.decode()
    assert "No line of stdout contains" in html


def test_it_downloads_the_whole_log(alice, logged):
    job, attempt = logged
    client = client_for(alice)
    response = client.get(f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/download/")
    assert response["Content-Disposition"] == 'attachment; filename="chatty-main-0-attempt1.stdout.log"'
    text = b"".join(response.streaming_content).decode()
    assert text.splitlines() == [f"line {i} <b>" for i in range(1500)]
    inline = client.get(f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/download/", {"inline": 1})
    assert inline["Content-Disposition"].startswith("inline;") and inline["Content-Type"] == "text/plain; charset=utf-8"


# --------------------------------------------------------------- cluster


def test_it_shows_every_virtual_clusters_share_to_everyone(alice):
    html = client_for(alice).get("/virtual-clusters/").content.decode()
    assert 'id="vc-default"' in html and "of the cluster" in html and "you can submit here" in html
    assert "running" in html and "waiting" in html


def test_only_admins_see_the_nodes_page_and_its_link(alice, admin_user):
    node = Node.objects.create(name=f"sim-node-{admin_user.pk}", address="127.0.0.8", docker_host="unix:///nonexistent",
                               cpus=8, memory_mb=4096, gpus=[{"index": 0, "type": "K80"}], gpus_simulated=True,
                               schedulable=False, last_heartbeat=timezone.now() - timedelta(minutes=5))
    try:
        user_client, admin_client = client_for(alice), client_for(admin_user)
        assert user_client.get("/nodes/").status_code == 403
        assert 'href="/nodes/"' not in user_client.get("/").content.decode()
        html = admin_client.get("/nodes/").content.decode()
        assert 'href="/nodes/"' in admin_client.get("/").content.decode()
    finally:
        node.delete()
    assert node.name in html and "simulated" in html and "#0 K80" in html
    assert "no heartbeat" in html and "not schedulable" in html


def test_it_sorts_by_duration_with_jobs_not_started_last(alice):
    now = timezone.now()
    ended_job(alice, "d_short", started_at=now - timedelta(minutes=2), finished_at=now - timedelta(minutes=1))
    ended_job(alice, "d_long", started_at=now - timedelta(hours=3), finished_at=now - timedelta(hours=1))
    ended_job(alice, "d_running", State.RUNNING, started_at=now - timedelta(minutes=30), finished_at=None)
    waiting_job(alice, "d_waiting")
    client = client_for(alice)
    assert row_names(client.get("/", {"sort": "-duration", "q": "d_"})) == ["d_long", "d_running", "d_short", "d_waiting"]
    assert row_names(client.get("/", {"sort": "duration", "q": "d_"})) == ["d_short", "d_running", "d_long", "d_waiting"]


def test_the_profile_shows_a_refused_ssh_key_once_and_rendering_it_again_changes_nothing(alice):
    client = client_for(alice)
    pasted = "ssh-ed25519 not-base64!! me@host"
    refused = client.post("/profile/ssh-keys/add/", {"title": "work", "public_key": pasted})
    assert refused.status_code == 302 and refused["Location"] == "/profile/"
    first = client.get("/profile/").content.decode()
    assert pasted in first and 'value="work"' in first and 'id="ssh-key-error"' in first
    second = client.get("/profile/").content.decode()  # the draft was the first page's, as before
    assert pasted not in second and 'value="work"' not in second and 'id="ssh-key-error"' not in second
    assert 'id="ssh-keys"' in second and 'id="api-tokens"' in second


# ------------------------------------------------------------------- tags


def test_it_shows_a_v2_job_as_yaml_with_its_secrets_masked_and_its_tags(alice):
    from jobs.services import tags
    from tests.test_submit import SECRET, v2_secret_config
    from tests.conftest import unique

    job = submit(alice, v2_secret_config(unique("v2page")))
    tags.job_tag_add(job=job, value="exp-42")
    page = client_for(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "As submitted (v2 YAML)" in page and "protocolVersion: 2" in page
    assert SECRET not in page and "******" in page
    assert 'href="/?tag=exp-42"' in page and 'aria-label="Remove tag exp-42"' in page


def test_it_lets_the_owner_add_and_remove_tags(alice):
    job = waiting_job(alice, "tagged")
    client = client_for(alice)
    response = client.post(f"/jobs/{job.pk}/tags/add/", {"tag": "baseline"})
    assert response.status_code == 302 and response["Location"].endswith(f"/jobs/{job.pk}/#tags")
    assert list(job.tags.values_list("value", flat=True)) == ["baseline"]
    response = client.post(f"/jobs/{job.pk}/tags/add/", {"tag": "a,b"}, follow=True)
    assert "without commas" in response.content.decode()
    client.post(f"/jobs/{job.pk}/tags/remove/", {"tag": "baseline"})
    assert not job.tags.exists()


def test_it_refuses_tag_changes_from_another_user_an_admin_and_anonymous(alice, bob, admin_user):
    job = waiting_job(alice, "guarded")
    job.tags.create(value="keep")
    for client, status in ((client_for(bob), 404), (client_for(admin_user), 404)):
        assert client.post(f"/jobs/{job.pk}/tags/add/", {"tag": "x"}).status_code == status
        assert client.post(f"/jobs/{job.pk}/tags/remove/", {"tag": "keep"}).status_code == status
    anonymous = Client().post(f"/jobs/{job.pk}/tags/add/", {"tag": "x"})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert list(job.tags.values_list("value", flat=True)) == ["keep"]
    # Without a CSRF token the owner is refused too.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(f"/jobs/{job.pk}/tags/add/", {"tag": "x"}).status_code == 403
    # An admin sees the tags but gets no forms to change them.
    page = client_for(admin_user).get(f"/jobs/{job.pk}/").content.decode()
    assert ">keep</a>" in page and "tags/add/" not in page


def test_it_filters_the_list_by_tag_and_shows_each_jobs_tags(alice):
    tagged, other = waiting_job(alice, "with-tag"), waiting_job(alice, "without-tag")
    tagged.tags.create(value="sweep-1")
    other.tags.create(value="sweep-2")
    client = client_for(alice)
    page = client.get("/", {"tag": "sweep-1"}).content.decode()
    assert "with-tag" in page and "without-tag" not in page
    assert 'value="sweep-1"' in page  # the filter stays in the form, as in the URL
    assert 'href="?tag=sweep-1"' in page
    rows = client.get("/jobs/rows/", {"tag": "sweep-2"}).content.decode()
    assert "without-tag" in rows and "with-tag<" not in rows
    everything = client.get("/").content.decode()
    assert ">sweep-1</a>" in everything and ">sweep-2</a>" in everything
