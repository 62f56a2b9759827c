"""The pages as a reader meets them in a real browser (Debian's Chromium),
with the portal served from the test process: jobs are rows made the way
tests/test_pages.py makes them, so no Docker or node agent is needed.

What a page must survive: names and file names with nothing to wrap at, a
phone's 390 px, times a reader in another zone cannot misread, panels that
run into each other, and buttons a screen reader cannot tell apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from jobs.models import Node, State, TaskAttempt, TaskState
from jobs.services import access, tokens
from tests.browser import login, page_alone, screenshot
from tests.test_big_job_queries import big_job, idle_node
from tests.test_pages import ended_job, task_attempt, waiting_job

pytestmark = pytest.mark.browser
PHONE = 390
LONG_NAME = "sweep_" + "lr0001" * 16  # 102 characters and not one space

# How far the whole page scrolls sideways (0: not at all).
PAGE_OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


@pytest.fixture
def phone(browser, portal_in_process, alice):
    page = page_alone(browser, portal_in_process, width=PHONE)
    login(page, alice)
    yield page
    page.context.close()


@pytest.fixture
def desktop(browser, portal_in_process, alice):
    page = page_alone(browser, portal_in_process)
    login(page, alice)
    yield page
    page.context.close()


def test_a_long_job_name_wraps_instead_of_widening_its_pages(phone, desktop, alice):
    job = waiting_job(alice, LONG_NAME)
    for page in (phone, desktop):
        for path in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/stop/"):
            page.goto(path)
            assert page.evaluate(PAGE_OVERFLOW) == 0, (path, page.viewport_size)
        page.goto(f"/jobs/{job.pk}/")
        page.locator("#stop-button").click()
        dialog = page.get_by_role("dialog")
        assert dialog.evaluate("d => d.scrollWidth - d.clientWidth") == 0  # its title, all of it, inside
    screenshot(phone, "layout-long-name-phone")


def test_a_long_job_name_leaves_the_other_columns_of_the_list_in_view(desktop, alice):
    ended_job(alice, LONG_NAME)
    desktop.goto("/")
    row = desktop.locator("tr", has=desktop.get_by_role("link", name=LONG_NAME))
    table = desktop.locator(".table-wrap").first.bounding_box()
    gpus = row.locator("td").last.bounding_box()
    assert gpus["x"] + gpus["width"] <= table["x"] + table["width"]
    screenshot(desktop, "layout-long-name-list")


def test_every_time_names_its_zone(desktop, alice):
    """The browser is in New York: a bare "05:47 AM" would read as the
    reader's own zone, or the server's, or UTC."""
    job = ended_job(alice, "zoned_times")
    task_attempt(job)
    desktop.goto(f"/jobs/{job.pk}/")
    local = job.submitted_at.astimezone(ZoneInfo("America/New_York"))
    zone = local.strftime("%Z")  # EST or EDT
    submitted = desktop.get_by_role("definition").filter(has=desktop.locator("time")).first.locator("time")
    expect(submitted).to_have_text(local.strftime(f"%b %-d, %Y, %I:%M:%S %p {zone}"))
    started = job.started_at.astimezone(local.tzinfo)
    expect(desktop.locator("table.tasks time").first).to_have_text(started.strftime(f"%b %-d, %I:%M:%S %p {zone}"))
    desktop.goto("/")
    expect(desktop.locator(f"tr[data-job-id='{job.pk}'] time")).to_have_text(local.strftime(f"%b %-d, %I:%M %p {zone}"))


def test_the_usage_panel_stands_apart_from_the_tasks_table(desktop, alice):
    job = ended_job(alice, "usage_gap")
    task_attempt(job)
    desktop.goto(f"/jobs/{job.pk}/")
    tasks = desktop.locator("#tasks").bounding_box()
    usage = desktop.locator("#usage").bounding_box()
    assert usage["y"] - (tasks["y"] + tasks["height"]) >= 16
    # The virtual clusters' usage lists keep their own layout.
    desktop.goto("/virtual-clusters/")
    assert desktop.locator("dl.usage").first.evaluate("el => getComputedStyle(el).display") == "grid"


def test_a_panels_heading_sits_as_high_in_every_panel(desktop, alice):
    job = ended_job(alice, "panel_headings")
    desktop.goto(f"/jobs/{job.pk}/")

    def heading_gap(panel: str) -> float:
        return desktop.locator(panel).evaluate(
            "p => p.querySelector('h2').getBoundingClientRect().top - p.getBoundingClientRect().top")

    assert heading_gap("#tags") == heading_gap(".job-folders") == heading_gap("#usage")


def test_the_add_tag_button_is_one_line_as_tall_as_its_field(phone, desktop, alice):
    job = ended_job(alice, "tag_button")
    for page in (phone, desktop):
        page.goto(f"/jobs/{job.pk}/")
        button = page.get_by_role("button", name="Add tag").bounding_box()
        field = page.get_by_label("New tag").bounding_box()
        assert button["height"] <= field["height"], page.viewport_size


def test_a_running_tasks_ssh_terminal_and_jupyter_fit_a_phones_screen(phone, alice):
    """The tasks table scrolls sideways on a phone; the line under a task
    with its SSH command and buttons must not run off with it."""
    job = ended_job(alice, "notebook_with_a_name_long_enough_to_make_the_key_file_long", State.RUNNING,
                    finished_at=None, exit_type="")
    access.ensure_job_key_pair(job)
    task_attempt(job, state=TaskState.RUNNING, finished_at=None, exit_code=None, exit_type="",
                 ports={"ssh": [20002], "jupyter": [20001]}, ssh_available=True)
    phone.goto(f"/jobs/{job.pk}/")
    screen = phone.locator("#tasks .table-wrap").bounding_box()
    for control in (phone.get_by_role("button", name="Copy the SSH command for main-0"),
                    phone.get_by_role("link", name="Open terminal"), phone.get_by_role("link", name="Open Jupyter"),
                    phone.get_by_role("button", name="Copy the Jupyter link of main-0"), phone.locator(".access-cmd")):
        box = control.bounding_box()
        assert box["x"] + box["width"] <= screen["x"] + screen["width"], control
    screenshot(phone, "layout-task-access-phone")


def test_the_api_help_endpoints_read_on_a_phone(phone):
    phone.goto("/api-help/")
    table = phone.locator("table.endpoints")
    screen = table.locator("xpath=..").bounding_box()  # its scrolling .table-wrap
    for what in table.locator("tbody td:nth-child(2)").all():
        box = what.bounding_box()
        assert box["x"] + box["width"] <= screen["x"] + screen["width"], what.inner_text()


def test_a_tables_hidden_column_label_does_not_widen_a_phones_page(phone, alice):
    """The tables scroll inside their frame; a visually hidden "Actions"
    heading in their last column used to stretch the whole page."""
    tokens.token_create(user=alice, lifetime=timedelta(hours=1))
    home = Path(settings.STORAGE_LOCAL_ROOT) / alice.username
    home.mkdir(parents=True, exist_ok=True)
    (home / f"results_of_{LONG_NAME}.csv").write_text("a,b\n1,2\n")
    for path in ("/profile/", "/storage/"):
        phone.goto(path)
        expect(phone.locator("table").first).to_be_visible()
        assert phone.evaluate(PAGE_OVERFLOW) == 0, path

def test_a_long_file_name_leaves_its_size_date_and_actions_in_view(desktop, alice):
    home = Path(settings.STORAGE_LOCAL_ROOT) / alice.username
    home.mkdir(parents=True, exist_ok=True)
    (home / f"checkpoint_of_{LONG_NAME}.pt").write_bytes(b"weights")
    desktop.goto("/storage/")
    frame = desktop.locator(".table-wrap").bounding_box()
    delete = desktop.locator("tr", has_text="checkpoint_of_").get_by_role("link", name="Delete").bounding_box()
    assert delete["x"] + delete["width"] <= frame["x"] + frame["width"]

def test_the_join_tokens_panel_stands_apart_from_the_nodes_table(browser, portal_in_process, admin_user):
    # Never schedulable and long silent: no test's job is ever placed on it.
    node = Node.objects.create(name=f"layout-node-{admin_user.pk}", address="127.0.0.8", docker_host="unix:///nonexistent",
                               schedulable=False, last_heartbeat=timezone.now() - timedelta(minutes=5))
    page = page_alone(browser, portal_in_process)
    try:
        login(page, admin_user)
        page.goto("/nodes/")
        table = page.locator(".nodes-wrap").bounding_box()
        tokens_panel = page.locator("#join-tokens").bounding_box()
        assert tokens_panel["y"] - (table["y"] + table["height"]) >= 12
    finally:
        page.context.close()
        node.delete()

def test_the_dashboard_names_no_busiest_zero_users(browser, portal_in_process, admin_user):
    page = page_alone(browser, portal_in_process)
    try:
        login(page, admin_user)
        page.goto("/dashboard/")
        title = page.locator("[data-chart='gpus-user'] .u-title")
        expect(title).to_have_text(re.compile(r"^GPUs in use by user( \(the busiest [1-9]\d*\))?$"))
    finally:
        page.context.close()


def test_each_task_roles_buttons_name_their_role(desktop):
    desktop.goto("/submit/")
    desktop.get_by_role("button", name="Duplicate task role 1").click()
    expect(desktop.get_by_role("button", name="Remove task role 2")).to_be_enabled()
    desktop.get_by_role("button", name="Remove task role 1").click()
    expect(desktop.get_by_role("button", name=re.compile(r"^Remove task role"))).to_have_count(1)


def test_what_ended_an_attempt_wraps_inside_the_attempts_table(phone, desktop, alice):
    """A rule's message names a task role (64 characters, none a space) and
    a stop names a user: the attempts table keeps them in their cell."""
    long_role = "r" * 64
    job = ended_job(alice, "long_trigger", State.FAILED, retry_limit=1, exit_type="USER_EXIT", exit_code=1,
                    exit_reason=f"task {long_role}-0 failed: the command exited with code 1")
    job.attempts.update(exit_trigger_message=f"minFailedTaskCount 1 of role {long_role} reached: 1 task failed",
                        exit_trigger_role=long_role, exit_trigger_index=0)
    type(job).objects.filter(pk=job.pk).update(exit_trigger_message=job.attempts.get().exit_trigger_message,
                                               exit_trigger_role=long_role, exit_trigger_index=0)
    for page in (phone, desktop):
        page.goto(f"/jobs/{job.pk}/")
        trigger = page.locator(".attempt-trigger")
        expect(trigger).to_contain_text(f"Ended by {long_role}-0")
        assert trigger.evaluate("el => el.scrollWidth - el.clientWidth") == 0, page.viewport_size
        cell = page.locator("td.attempt-outcome").bounding_box()
        box = trigger.bounding_box()
        assert box["x"] + box["width"] <= cell["x"] + cell["width"], page.viewport_size
        assert page.locator(".exit-trigger").evaluate("el => el.scrollWidth - el.clientWidth") == 0
        assert page.evaluate(PAGE_OVERFLOW) == 0, page.viewport_size
    frame = desktop.locator("table.attempts").locator("xpath=..")
    assert frame.evaluate("el => el.scrollWidth - el.clientWidth") == 0  # no sideways scroll on a desktop
    screenshot(phone, "layout-attempt-trigger-phone")


@pytest.fixture
def big_node() -> Iterator[Node]:
    yield from idle_node()


def test_a_big_jobs_task_pages_and_state_filter_fit_a_phone_and_stay_as_chosen_while_polled(phone, alice, big_node):
    """A job of 300 tasks: the tables show a page at a time, and a state
    filter chosen by a click stays chosen when the page polls its tables:
    a task that fails meanwhile joins the failed ones shown."""
    job = big_job(alice, big_node, tasks=300)
    current = TaskAttempt.objects.filter(job=job, number=job.attempt_number)
    current.filter(task__index=250).update(state=TaskState.FAILED, exit_code=1)
    phone.goto(f"/jobs/{job.pk}/")
    expect(phone.locator(".task-pages")).to_contain_text("Tasks 1–100 of 300")
    assert phone.evaluate(PAGE_OVERFLOW) == 0
    phone.locator('.task-states a[data-task-state="FAILED"]').click()
    rows = phone.locator("#tasks .task-row .task-index")
    expect(rows).to_have_text(["250"])
    current.filter(task__index=5).update(state=TaskState.FAILED, exit_code=1)
    expect(rows).to_have_text(["5", "250"])  # the next poll's, still filtered
    expect(phone.locator(".task-states .current")).to_contain_text("failed 2")
    screenshot(phone, "big-job-failed-tasks-phone")
    assert phone.evaluate(PAGE_OVERFLOW) == 0


def test_the_log_menu_keeps_the_task_open_in_the_viewer_while_the_tables_show_others(desktop, alice, big_node):
    """The log menu lists the tasks the tables show; a task opened from the
    URL on another page stays chosen and named when the page polls."""
    job = big_job(alice, big_node, tasks=300)
    current = TaskAttempt.objects.filter(job=job, number=job.attempt_number)
    far = current.get(task__index=280)
    desktop.goto(f"/jobs/{job.pk}/?log={far.pk}&stream=stdout")
    expect(desktop.locator("#log-task")).to_have_value(str(far.pk))
    current.filter(task__index=3).update(state=TaskState.FAILED, exit_code=1)
    # A poll's menu, where the task open in the viewer is not.
    expect(desktop.locator('#log-task optgroup[label="Attempt 2"] option', has_text="main-3 · failed")).to_have_count(1)
    expect(desktop.locator("#log-task")).to_have_value(str(far.pk))
    expect(desktop.locator("[data-log-status]")).to_contain_text("main-280")
    assert desktop.locator("#log-task option").count() < 250
