"""A job of many tasks and retries on the pages and API answers its owner
keeps open (the job page and its live part, the status calls, the usage
graphs): the queries one answer makes do not grow with the job's tasks or
attempts. A job may have 1,000 tasks, and the page polls every few seconds.

Jobs are database rows only (no scheduler, no container), on a node of the
test's own that nothing is placed on. Users: alice (owner); each test makes
its own.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import (
    ExitType, IdleGpus, Job, JobAttempt, LogLine, Node, State, Stream, Task, TaskAttempt, TaskState, TaskUsage,
    TerminalSession, VirtualCluster,
)
from jobs.services import tokens, usage_rollup
from jobs.spec import parse_job_value
from tests.helpers import config, role


def idle_node() -> Iterator[Node]:
    """A node nothing is placed on (the `node` fixture; other modules' own
    fixtures yield from it). Its heartbeat an hour ahead: the test
    cluster's agents, which look for lost nodes, would otherwise give its
    tasks up mid-test."""
    made = Node.objects.create(name=f"big-{uuid.uuid4().hex[:8]}", address="127.0.0.3", docker_host="unix:///nonexistent",
                               cpus=64, memory_mb=512000, gpus=[{"index": i, "type": "BIG"} for i in range(8)],
                               gpus_simulated=True, schedulable=False, last_heartbeat=timezone.now() + timedelta(hours=1))
    yield made
    TaskAttempt.objects.filter(node=made).update(state=TaskState.STOPPED)
    Job.objects.filter(task_attempts__node=made).update(state=State.STOPPED)


node = pytest.fixture(idle_node, name="node")


def big_job(owner, node: Node, *, tasks: int, attempts: int = 2, samples: int = 3, jupyter: bool = False,
            roles: tuple[str, ...] = ("main",)) -> Job:
    """A running job of `tasks` one-GPU tasks in each of `roles` on its
    attempt `attempts`, every attempt placed on `node` with ssh and http
    ports (and jupyter's); the current attempt's tasks have `samples` usage
    samples each."""
    name = f"big_{uuid.uuid4().hex[:8]}"
    cfg = config(name, *(role(name, tasks=tasks, gpus=1, command="sleep 600") for name in roles),
                 retryCount=attempts - 1)
    stored = parse_job_value(cfg, user_name=owner.username, default_fs_uri=settings.PAI_DEFAULT_FS_URI).normalized
    now = timezone.now()
    job = Job.objects.create(owner=owner, name=name, config_raw=json.dumps(cfg), config=stored,
                             virtual_cluster=VirtualCluster.objects.get(name="default"), state=State.RUNNING,
                             total_tasks=tasks * len(roles), total_roles=len(roles), total_gpus=tasks * len(roles),
                             retry_limit=attempts - 1, attempt_number=attempts, started_at=now - timedelta(hours=1))
    JobAttempt.objects.bulk_create([
        JobAttempt(job=job, number=n, state=State.RUNNING if n == attempts else State.FAILED,
                   exit_type="" if n == attempts else ExitType.USER_EXIT, started_at=now - timedelta(hours=1))
        for n in range(1, attempts + 1)])
    Task.objects.bulk_create([Task(job=job, role=name, index=i) for name in roles for i in range(tasks)])
    rows = []
    for job_attempt in job.attempts.order_by("number"):
        current = job_attempt.number == attempts
        for task in job.tasks.order_by("index"):
            rows.append(TaskAttempt(
                task=task, job_attempt=job_attempt, job=job, number=job_attempt.number, node=node, node_name=node.name,
                host_ip=node.address, ip=f"10.9.{task.index // 250}.{task.index % 250}",
                state=TaskState.RUNNING if current else TaskState.FAILED, exit_code=None if current else 1,
                exit_type="" if current else ExitType.USER_EXIT, container_id=f"c{job_attempt.number}-{task.index}",
                gpus=[task.index % 8], gpu_type="BIG", ports={"ssh": [40000 + task.index], "http": [41000 + task.index],
                                                              **({"jupyter": [42000 + task.index]} if jupyter else {})},
                started_at=now - timedelta(minutes=30), finished_at=None if current else now - timedelta(minutes=40),
                ssh_available=True))
    TaskAttempt.objects.bulk_create(rows)
    current = TaskAttempt.objects.filter(job=job, number=attempts).values_list("pk", flat=True)
    rows = TaskUsage.objects.bulk_create([
        TaskUsage(attempt_id=pk, at=now - timedelta(seconds=5 * k), cpu_percent=50.0, memory_bytes=2**30)
        for pk in current for k in range(samples)])
    if rows:  # marked for the roll-up, as usage.samples_record does
        usage_rollup.minutes_mark(((row.attempt_id, row.at) for row in rows), stamp=max(row.pk for row in rows))
    return job


def api_client(user) -> Client:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=user, lifetime=timedelta(hours=1)).key}")
    client.get("/api/v1/jobs?limit=1")  # the token's first use is written once: not counted below
    return client


def queries_of(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
        if response.streaming:
            b"".join(response.streaming_content)
    assert response.status_code == 200, (path, response.status_code)
    return len(queries)


# ----------------------------------------------------------- usage graphs


def test_it_reads_a_jobs_usage_in_queries_that_do_not_grow_with_its_tasks(alice, node):
    client = api_client(alice)
    small, big = big_job(alice, node, tasks=10), big_job(alice, node, tasks=200)
    since = (timezone.now() - timedelta(seconds=7)).isoformat().replace("+00:00", "Z")
    for query in ("", f"?since={since}"):
        counts = [queries_of(client, f"/api/v2/jobs/{alice.username}~{job.name}/metrics{query}") for job in (small, big)]
        assert counts[0] == counts[1], counts
    body = client.get(f"/api/v2/jobs/{alice.username}~{big.name}/metrics").json()
    assert len(body["tasks"]) == 200 and {len(task["samples"]) for task in body["tasks"]} == {3}


# ------------------------------------------------------------ the job page


def test_the_job_page_reads_its_tasks_in_queries_that_do_not_grow_with_them(alice, node):
    client = Client()
    client.force_login(alice)
    small, big = big_job(alice, node, tasks=10), big_job(alice, node, tasks=200)
    for path in ("/jobs/{}/", "/jobs/{}/live/", "/jobs/{}/live/?attempt=1"):
        counts = [queries_of(client, path.format(job.pk)) for job in (small, big)]
        assert counts[0] == counts[1], (path, counts)


def test_jupyter_tasks_tokens_and_terminals_are_read_once_for_all_tasks(alice, node):
    """Each running Jupyter task's link carries the token its server logged,
    and its idleness counts a terminal open in it: read for all the tasks
    of the live part at once, not per task."""
    client = Client()
    client.force_login(alice)
    jobs = [big_job(alice, node, tasks=tasks, jupyter=True) for tasks in (10, 200)]
    for job in jobs:
        current = list(TaskAttempt.objects.filter(job=job, number=job.attempt_number).order_by("pk"))
        LogLine.objects.bulk_create([
            LogLine(attempt=attempt, stream=Stream.STDERR, seq=seq, text=text) for attempt in current
            for seq, text in enumerate([f"http://127.0.0.1:8888/?token={'ab' * 8}{attempt.pk:08x} old",
                                        f"http://127.0.0.1:8888/lab?token={'cd' * 8}{attempt.pk:08x}", "ready"])])
        TerminalSession.objects.create(user=alice, attempt=current[0])
    counts = [queries_of(client, f"/jobs/{job.pk}/live/") for job in jobs]
    assert counts[0] == counts[1], counts
    # The tables show 100 tasks a page.
    html = "".join(client.get(f"/jobs/{jobs[1].pk}/live/?tasks={page}").content.decode() for page in (1, 2))
    current = TaskAttempt.objects.filter(job=jobs[1], number=jobs[1].attempt_number)
    assert html.count('class="button jupyter-link"') == 200
    for attempt in current:
        assert f"%3Ftoken%3D{'cd' * 8}{attempt.pk:08x}&amp;landing=" in html


# ------------------------------------------------- the task tables' pages


def task_rows(html: str) -> list[str]:
    """The tasks the tables show, as <role>-<index>, in order."""
    import re
    rows = re.findall(r'<section class="role" aria-labelledby="role-\d+">.*?<span class="role-name">([^<]+)</span>'
                      r'(.*?)</section>', html, re.S)
    return [f"{name}-{index}" for name, body in rows
            for index in re.findall(r'<th scope="row" class="task-index">(\d+)</th>', body)]


def test_the_task_tables_show_a_page_of_tasks_in_the_configs_role_order(alice, node):
    """Roles in the config's order (not the alphabet's), then index; 100
    tasks a page, with links to the others."""
    client = Client()
    client.force_login(alice)
    job = big_job(alice, node, tasks=120, roles=("worker", "chief"))
    pages = [client.get(f"/jobs/{job.pk}/live/?tasks={page}").content.decode() for page in (1, 2, 3)]
    assert task_rows(pages[0]) == [f"worker-{i}" for i in range(100)]
    assert task_rows(pages[1]) == [f"worker-{i}" for i in range(100, 120)] + [f"chief-{i}" for i in range(80)]
    assert task_rows(pages[2]) == [f"chief-{i}" for i in range(80, 120)]
    assert "Tasks 201–240 of 240" in pages[2] and 'href="?tasks=2#tasks" rel="prev"' in pages[2]
    assert 'rel="next"' not in pages[2] and 'href="?tasks=2#tasks" rel="next"' in pages[0]
    # The log viewer's menu offers the tasks the tables show.
    assert menu_tasks(pages[1]) == {(number, task) for number in "21" for task in task_rows(pages[1])}


def menu_tasks(html: str) -> set[tuple[str, str]]:
    """The log viewer's menu as (job attempt, <role>-<index>)."""
    import re
    return {(number, task) for number, options in re.findall(r'<optgroup label="Attempt (\d+)">(.*?)</optgroup>', html, re.S)
            for task in re.findall(r'<option value="\d+">([^ ]+) · ', options)}


@pytest.mark.parametrize("page", ["0", "-1", "99", "abc", "1e3", "2" * 40])
def test_a_page_number_out_of_range_or_not_a_number_shows_the_nearest_page(alice, node, page):
    client = Client()
    client.force_login(alice)
    job = big_job(alice, node, tasks=150)
    response = client.get(f"/jobs/{job.pk}/live/?tasks={page}")
    assert response.status_code == 200
    assert task_rows(response.content.decode()) in ([f"main-{i}" for i in range(100)],
                                                    [f"main-{i}" for i in range(100, 150)])


def test_a_state_filter_shows_only_its_tasks_and_counts_each_state(alice, node):
    client = Client()
    client.force_login(alice)
    job = big_job(alice, node, tasks=300)
    TaskAttempt.objects.filter(job=job, number=job.attempt_number, task__index__in=[7, 250, 299]).update(
        state=TaskState.FAILED, exit_code=3, exit_type=ExitType.USER_EXIT)
    html = client.get(f"/jobs/{job.pk}/live/?task_state=FAILED").content.decode()
    assert task_rows(html) == ["main-7", "main-250", "main-299"]
    assert '<span class="current" aria-current="true">failed <span class="count">3</span></span>' in html
    assert 'href="?task_state=RUNNING#tasks" data-task-state="RUNNING">running <span class="count">297</span>' in html
    assert 'data-task-state="">all <span class="count">300</span>' in html
    # A state no task is in, or none at all, shows every task.
    for state in ("SUCCEEDED", "NOPE", "'\"><b>"):
        assert task_rows(client.get(f"/jobs/{job.pk}/live/", {"task_state": state}).content.decode())[:2] == [
            "main-0", "main-1"]


def test_the_page_polls_the_same_view_of_the_tables_it_shows(alice, node):
    """The live part's URL keeps the page, the filter and a chosen attempt,
    so the next poll does not put the first page back."""
    client = Client()
    client.force_login(alice)
    job = big_job(alice, node, tasks=250, attempts=2)
    TaskAttempt.objects.filter(job=job, number=1, task__index__gte=120).update(state=TaskState.STOPPED)
    html = client.get(f"/jobs/{job.pk}/?attempt=1&task_state=FAILED&tasks=2").content.decode()
    assert f'data-live-url="/jobs/{job.pk}/live/?attempt=1&amp;task_state=FAILED&amp;tasks=2"' in html
    assert task_rows(html) == [f"main-{i}" for i in range(100, 120)]
    # The newest attempt, unless one is chosen: the live part follows a retry.
    html = client.get(f"/jobs/{job.pk}/?tasks=2").content.decode()
    assert f'data-live-url="/jobs/{job.pk}/live/?tasks=2"' in html


def test_the_log_viewer_opens_on_the_failed_task_that_ended_the_job_wherever_its_page(alice, node):
    client = Client()
    client.force_login(alice)
    job = big_job(alice, node, tasks=300, attempts=1)
    failed = TaskAttempt.objects.get(job=job, task__index=270)
    TaskAttempt.objects.filter(job=job).exclude(pk=failed.pk).update(state=TaskState.STOPPED)
    TaskAttempt.objects.filter(pk=failed.pk).update(state=TaskState.FAILED, exit_code=2, exit_type=ExitType.USER_EXIT)
    LogLine.objects.create(attempt=failed, stream=Stream.STDERR, seq=0, text="Traceback")
    Job.objects.filter(pk=job.pk).update(state=State.FAILED, exit_type=ExitType.USER_EXIT, exit_trigger_role="main",
                                         exit_trigger_index=270)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'data-stream="stderr" data-attempt="{failed.pk}"' in html
    # The menu offers the first page's tasks and the one the viewer opens on.
    assert menu_tasks(html) == {("1", f"main-{i}") for i in [*range(100), 270]}
    assert f'<option value="{failed.pk}">main-270 · failed</option>' in html


def test_the_log_menu_follows_the_tables_and_keeps_only_this_jobs_opened_task(alice, bob, node, monkeypatch):
    """A 1,000-task job's menu was every task attempt (2,000, ~100 KB a
    poll): now the tasks on the tables' page and filter, in the shown
    attempt and then, newest first, in the others, at most LOG_MENU_MAX;
    a task opened by the URL (`?log=`) is offered too, but only this job's."""
    from jobs.views import jobs as job_views

    client = Client()
    client.force_login(alice)
    job = big_job(alice, node, tasks=300, attempts=3)
    TaskAttempt.objects.filter(job=job, number=3, task__index__in=[5, 150]).update(state=TaskState.FAILED)
    html = client.get(f"/jobs/{job.pk}/live/?tasks=2").content.decode()
    assert menu_tasks(html) == {(n, f"main-{i}") for n in "321" for i in range(100, 200)}
    failed = client.get(f"/jobs/{job.pk}/live/?task_state=FAILED").content.decode()
    assert menu_tasks(failed) == {(n, f"main-{i}") for n in "321" for i in (5, 150)}
    monkeypatch.setattr(job_views, "LOG_MENU_MAX", 150)
    capped = client.get(f"/jobs/{job.pk}/live/").content.decode()
    assert menu_tasks(capped) == {("3", f"main-{i}") for i in range(100)} | {("2", f"main-{i}") for i in range(50)}
    # Opened by the URL on another page: offered on the whole page (the
    # live part keeps it in the browser), and in its own job attempt.
    far = TaskAttempt.objects.get(job=job, number=1, task__index=280)
    whole = client.get(f"/jobs/{job.pk}/?log={far.pk}&stream=stdout").content.decode()
    assert ("1", "main-280") in menu_tasks(whole) and f'data-attempt="{far.pk}"' in whole
    # Another job's task attempt is never named, even by its own owner's link.
    theirs = big_job(bob, node, tasks=1, attempts=1)
    other = TaskAttempt.objects.get(job=theirs)
    page = client.get(f"/jobs/{job.pk}/?log={other.pk}").content.decode()
    assert f'<option value="{other.pk}">' not in page
    assert client.get(f"/jobs/{job.pk}/?log=99999999999999999999999").status_code == 200
    # Another user and an anonymous client get nothing of it.
    bobs = Client()
    bobs.force_login(bob)
    assert bobs.get(f"/jobs/{job.pk}/?log={far.pk}").status_code == 404
    assert Client().get(f"/jobs/{job.pk}/live/?tasks=2").status_code == 302


def usage_menu(html: str) -> dict[str, str]:
    """The usage panel's task menu of a big job (a live part): option value -> text."""
    menu = html.split('data-part="usagetasks">', 1)[1].split("</select>", 1)[0]
    return {value: text for value, text in re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', menu)}


def test_a_big_jobs_usage_menu_lists_the_tasks_the_tables_show_with_their_flags(alice, bob, node):
    """The usage panel's picker of a big job follows the task tables, as
    the log menu does (their page and filter, 100 tasks at most), named
    with idle GPUs and with running tasks whose samples stopped: it was
    built from every task's samples (GET .../metrics, 4.7 MB for 1,000
    tasks). A small job's page draws every task and has no menu."""
    client = Client()
    client.force_login(alice)
    job = big_job(alice, node, tasks=300, attempts=2)
    current = {a.task.index: a for a in TaskAttempt.objects.filter(job=job, number=2).select_related("task")}
    IdleGpus.objects.create(attempt=current[101], since=timezone.now())
    TaskUsage.objects.filter(attempt=current[102]).delete()  # none yet
    TaskUsage.objects.filter(attempt=current[103]).update(at=F("at") - timedelta(minutes=10))  # its node's sampler is away
    TaskAttempt.objects.filter(pk__in=[current[104].pk, current[250].pk]).update(state=TaskState.FAILED)
    TaskUsage.objects.filter(attempt=current[104]).delete()  # ended: never flagged for samples
    live = client.get(f"/jobs/{job.pk}/live/?tasks=2").content.decode()
    menu = usage_menu(live)
    assert list(menu) == ["", *(f"main-{i}" for i in range(100, 200))]
    assert {value: text for value, text in menu.items() if text != value} == {
        "": "None", "main-101": "main-101 (GPUs idle)", "main-102": "main-102 (no recent samples)",
        "main-103": "main-103 (no recent samples)"}
    assert (f'<option value="main-101" data-role="main" data-index="101" data-attempt="2" data-state="RUNNING" '
            f'data-node="{node.name}" data-idle-gpus="true">') in live
    assert 'value="main-104" data-role="main" data-index="104" data-attempt="2" data-state="FAILED"' in live
    # The filter and the attempt the tables show.
    assert list(usage_menu(client.get(f"/jobs/{job.pk}/live/?task_state=FAILED").content.decode())) == [
        "", "main-104", "main-250"]
    assert 'data-index="5" data-attempt="1"' in client.get(f"/jobs/{job.pk}/live/?attempt=1").content.decode()
    # The whole page holds the menu the live part refreshes.
    page = client.get(f"/jobs/{job.pk}/?tasks=2").content.decode()
    assert list(usage_menu(page)) == list(menu) and 'id="usage-task" data-part="usagetasks"' in page
    small = big_job(alice, node, tasks=8, attempts=1)
    for path in (f"/jobs/{small.pk}/", f"/jobs/{small.pk}/live/"):
        assert "usagetasks" not in client.get(path).content.decode()
    # Another user and an anonymous client get none of it.
    bobs = Client()
    bobs.force_login(bob)
    assert bobs.get(f"/jobs/{job.pk}/live/?tasks=2").status_code == 404
    assert Client().get(f"/jobs/{job.pk}/live/?tasks=2").status_code == 302


def test_another_user_and_an_anonymous_client_see_no_page_of_anothers_tasks(alice, bob, node):
    job = big_job(alice, node, tasks=150)
    other = Client()
    other.force_login(bob)
    for path in (f"/jobs/{job.pk}/live/?tasks=2&task_state=RUNNING", f"/jobs/{job.pk}/?tasks=2"):
        assert other.get(path).status_code == 404
        response = Client().get(path)
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_big_job_whose_gpus_idle_gets_one_notice_not_one_per_task(alice, node, settings):
    """A few flagged tasks get a notice each; past IDLE_NOTICES_MAX, one
    notice counts them and names the first 20."""
    client = Client()
    client.force_login(alice)
    job = big_job(alice, node, tasks=30)
    current = list(TaskAttempt.objects.filter(job=job, number=job.attempt_number).select_related("task"))
    since = timezone.now() - timedelta(hours=1)
    IdleGpus.objects.bulk_create([IdleGpus(attempt=a, since=since) for a in current if a.task.index < 3])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert page.count("data-idle-task=") == 3 and "data-idle-tasks=" not in page
    IdleGpus.objects.bulk_create([IdleGpus(attempt=a, since=since) for a in current if a.task.index >= 3])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "data-idle-task=" not in page and 'data-idle-tasks="30"' in page
    names = ", ".join(f"main-{i}" for i in range(20))  # in task order
    assert "30 tasks hold GPUs that have been almost unused" in page and f"{names} and 10 more." in page
    assert "data-idle-stop-at" not in page
    # Under IDLE_GPU_POLICY=stop the job stops at the first task's deadline.
    settings.IDLE_GPU_POLICY = "stop"
    first = min(flag.flagged_at for flag in IdleGpus.objects.filter(attempt__job=job))
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    deadline = first + timedelta(minutes=settings.IDLE_GPU_STOP_GRACE_MINUTES)
    assert f'data-idle-stop-at="{deadline.isoformat()}"' in page


# ------------------------------------------------------------ job status


def test_the_status_calls_read_and_link_tasks_at_a_cost_that_does_not_grow_with_them(alice, node, monkeypatch):
    """Queries, and the URLs built from the routes (each task container's
    log link: a reverse() per container was a third of a v2 status)."""
    from jobs.api import http

    reversed_urls: list[str] = []

    def counted(*args, **kwargs) -> str:
        reversed_urls.append(args[0])
        return reverse(*args, **kwargs)

    reverse = http.reverse
    monkeypatch.setattr(http, "reverse", counted)
    client = api_client(alice)
    jobs = [big_job(alice, node, tasks=tasks, attempts=3) for tasks in (10, 200)]
    for path in ("/api/v1/user/{}/jobs/{}", "/api/v2/jobs/{}~{}", "/api/v2/jobs/{}~{}/job-attempts"):
        counts = []
        for job in jobs:
            reversed_urls.clear()
            counts.append((queries_of(client, path.format(alice.username, job.name)), len(reversed_urls)))
        assert counts[0] == counts[1], (path, counts)
    status = client.get(f"/api/v2/jobs/{alice.username}~{jobs[1].name}").json()
    first = status["jobAttempts"][0]["taskRoles"]["main"]["taskStatuses"][7]
    assert first["containerLog"] == f"http://testserver/api/v2/jobs/{alice.username}~{jobs[1].name}/tasks/main/7/log?attempt=1"
    assert status["taskRoles"]["main"]["taskStatuses"][199]["containerLog"] == (
        f"http://testserver/api/v2/jobs/{alice.username}~{jobs[1].name}/tasks/main/199/log")
