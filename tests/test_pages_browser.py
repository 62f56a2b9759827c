"""The job pages in a real browser (Debian's Chromium through Playwright)
against the test portal, its Redis, the Docker engine and two node agents.

One job holds all four V100s so a second one waits; stopping the first from
its page lets the second run, which is watched from WAITING to SUCCEEDED on
a page that is never reloaded. Screenshots land in var/test/run-*/screenshots.
"""

from __future__ import annotations

import re
from datetime import timezone
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from jobs.models import State
from tests.browser import login, screenshot
from tests.helpers import config, role, submit, wait_state

pytestmark = [pytest.mark.services, pytest.mark.browser]
ALL_V100S = {"gpus": 4}


@pytest.fixture(autouse=True)
def _patient_expectations():
    """The machine is small and shared: give each page change 15 s, not 5."""
    expect.set_options(timeout=15_000)
    yield
    expect.set_options(timeout=5_000)


def gpu_job(owner, name: str, command: str):
    return submit(owner, config(name, role(command=command, **ALL_V100S), gpuType="V100"))


def new_page(browser, cluster, **options):
    context = browser.new_context(base_url=cluster.base_url, timezone_id="America/New_York", locale="en-US", **options)
    context.set_default_timeout(15_000)
    return context.new_page()


def test_it_follows_a_job_live_stops_another_and_reads_its_logs(page, alice, cluster):
    login(page, alice)
    expect(page).to_have_url(re.compile(r"/$"))  # users land on their job list
    blocker = gpu_job(alice, "blocker", "echo holding the GPUs; sleep 600")
    wait_state(blocker, State.RUNNING)
    waiter = gpu_job(alice, "waiter", "echo hello from the waiter; for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done; echo bye >&2")

    # The list, left open in a second tab, must follow the waiter too.
    jobs_tab = page.context.new_page()
    jobs_tab.goto("/")
    waiter_row = jobs_tab.locator(f"tr[data-job-id='{waiter.pk}']")
    expect(waiter_row.locator(".badge")).to_have_text("waiting")
    jobs_tab.evaluate("window.notReloaded = true")
    screenshot(jobs_tab, "job-list")

    page.goto(f"/jobs/{waiter.pk}/")
    page.evaluate("window.notReloaded = true")
    expect(page.locator("#job-state")).to_have_text("waiting")
    expect(page.get_by_text(re.compile(r"in the queue of virtual cluster"))).to_be_visible()
    expect(page.locator("[data-log-lines]")).to_contain_text("once a task starts")
    screenshot(page, "job-waiting")

    # Stop the blocker from its own page, through the confirmation dialog.
    other = page.context.new_page()
    other.goto(f"/jobs/{blocker.pk}/")
    expect(other.locator("#job-state")).to_have_text("running")
    expect(other.locator("[data-log-lines]")).to_contain_text("holding the GPUs")
    other.locator("#stop-button").click()
    dialog = other.get_by_role("dialog", name=f"Stop {blocker.name}?")
    expect(dialog).to_be_visible()
    screenshot(other, "job-stop-dialog")
    dialog.get_by_role("button", name="Stop job").click()
    expect(other.locator(".message")).to_contain_text(f"{blocker.name}: stop")
    expect(other.locator("#job-state")).to_have_text("stopped", timeout=30_000)
    expect(other.locator("#stop-button")).to_have_count(0)
    other.close()

    # The waiter starts, prints, and ends, all on the page opened while it waited.
    expect(page.locator("#job-state")).to_have_text("running", timeout=60_000)
    expect(page.locator("[data-log-lines]")).to_contain_text("hello from the waiter", timeout=30_000)
    screenshot(page, "job-running")
    expect(page.locator("#job-state")).to_have_text("succeeded", timeout=60_000)
    expect(page.locator("[data-log-lines]")).to_contain_text("tick 6")
    assert page.evaluate("window.notReloaded") is True

    # After the end: switch to stderr, search the whole log, jump to the start.
    page.get_by_role("tab", name="stderr").click()
    expect(page.locator("[data-log-lines]")).to_contain_text("bye")
    page.get_by_role("tab", name="stderr").press("ArrowLeft")  # arrow keys move between tabs too
    expect(page.get_by_role("tab", name="stdout")).to_be_focused()
    expect(page.locator("[data-log-lines]")).to_contain_text("tick 6")
    page.get_by_role("tab", name="stdout").click()
    page.get_by_label("Search the whole log").fill("tick 3")
    page.get_by_role("button", name="Search", exact=True).click()
    hit = page.locator(".log-hit")
    expect(hit).to_have_count(1)
    hit.click()
    expect(page.locator(".log-line.hit")).to_contain_text("tick 3")
    screenshot(page, "job-log-search")
    page.get_by_role("button", name="Jump to start").click()
    expect(page.locator(".log-line").first).to_contain_text("hello from the waiter")
    download = page.locator("[data-log-download]")
    body = page.request.get(download.get_attribute("href")).text()
    assert body.splitlines() == ["hello from the waiter"] + [f"tick {i}" for i in range(1, 7)]
    screenshot(page, "job-succeeded")
    page.get_by_role("tab", name="As submitted").press("ArrowRight")
    expect(page.get_by_role("tab", name="Normalized")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#cfg-normalized")).to_be_visible()

    # The list tab caught up without a reload.
    expect(waiter_row.locator(".badge")).to_have_text("succeeded", timeout=30_000)
    assert jobs_tab.evaluate("window.notReloaded") is True


def test_it_shows_each_task_role_with_web_ports_as_links_and_every_attempt(page, alice, cluster):
    web = role("web", "mkdir -p /www && echo served-by-the-task > /www/index.html && "
                      "httpd -f -h /www -p $PAI_CONTAINER_HOST_http_PORT_LIST",
               portList=[{"label": "http", "beginAt": 0, "portNumber": 1}])
    workers = role("worker", "echo worker $PAI_TASK_ROLE_INDEX; sleep 120", tasks=2)
    served = submit(alice, config("two_roles", web, workers))
    flaky = submit(alice, config("flaky", role(command="echo trying; exit 3"), retryCount=1))
    login(page, alice)
    wait_state(served, State.RUNNING)
    page.goto(f"/jobs/{served.pk}/")
    expect(page.get_by_role("heading", name=re.compile(r"^web"))).to_be_visible()
    expect(page.get_by_role("heading", name=re.compile(r"^worker"))).to_be_visible()
    expect(page.locator("table.tasks").nth(1).locator("tr.task-row")).to_have_count(2)
    # Web ports open through the portal's proxy (signed in), never at the node's address.
    link = page.locator("table.tasks").first.locator("a.web-port-link")
    expect(link).to_have_attribute("href", re.compile(rf"^/jobs/{served.pk}/tasks/\d+/ports/\d+/"))
    expect(page.locator("table.tasks").first.locator(".badge")).to_have_text("running", timeout=30_000)
    with page.context.expect_page() as opened:
        link.click()
    expect(opened.value.locator("body")).to_contain_text("served-by-the-task", timeout=30_000)
    opened.value.close()
    page.locator("#log-task").select_option(label="worker-1 · running")
    expect(page.locator("[data-log-lines]")).to_contain_text("worker 1")
    screenshot(page, "job-two-roles")

    wait_state(flaky, State.FAILED)
    page.goto(f"/jobs/{flaky.pk}/")
    expect(page.locator(".exit-words")).to_contain_text("The command exited non-zero (exit code 3)")
    attempts = page.locator("table.attempts tbody tr")
    expect(attempts).to_have_count(2)
    for row in range(2):
        expect(attempts.nth(row)).to_contain_text("exit code 3")
    page.get_by_role("navigation", name="Job attempts").get_by_role("link", name="1").click()
    expect(page.locator("[data-log-lines]")).to_contain_text("trying")
    screenshot(page, "job-retried")


def test_it_clones_a_job_into_the_submit_page_with_a_new_name(page, alice, cluster):
    job = submit(alice, config("clone_me", role(gpus=64)))  # waits for ever: no node has 64 GPUs
    login(page, alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#job-state")).to_have_text("waiting")
    page.get_by_role("link", name="Clone", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/submit/\?clone={job.pk}$"))
    expect(page.get_by_role("heading", name="Submit Job")).to_be_visible()
    expect(page.get_by_label("Job name")).to_have_value("clone_me_2")


def test_it_stops_selected_jobs_from_the_list(page, alice, cluster):
    jobs = [submit(alice, config(f"queued_{i}", role(gpus=64))) for i in range(2)]  # no node has 64 GPUs
    login(page, alice)
    page.goto("/?status=active")
    stop_selected = page.get_by_role("button", name="Stop selected")
    expect(stop_selected).to_be_disabled()
    for job in jobs:
        page.get_by_label(f"Select {job.name}").check()
    expect(stop_selected).to_contain_text("(2)")
    stop_selected.click()
    page.get_by_role("dialog").get_by_role("button", name="Stop jobs").click()
    for job in jobs:
        expect(page.locator(".messages")).to_contain_text(f"{job.name}: stopped.")
    expect(page).to_have_url(re.compile(r"/\?status=active$"))
    expect(page.get_by_text("No jobs match these filters")).to_be_visible()
    for job in jobs:
        job.refresh_from_db()
        assert job.state == State.STOPPED


def test_another_user_gets_a_404_for_the_job_and_does_not_see_it(browser, cluster, alice, bob):
    job = submit(alice, config("alices_secret", role(gpus=64)))
    stranger = new_page(browser, cluster)
    try:
        login(stranger, bob)
        response = stranger.goto(f"/jobs/{job.pk}/")
        assert response.status == 404
        stranger.goto("/?q=alices_secret")
        expect(stranger.get_by_text("No jobs match these filters")).to_be_visible()
    finally:
        stranger.context.close()


def test_the_cluster_pages_and_a_narrow_screen(browser, cluster, admin_user, alice):
    job = submit(alice, config("narrow_view", role(command="echo small screens; sleep 30", cpus=2)))
    admin = new_page(browser, cluster, viewport={"width": 1280, "height": 900})
    phone = new_page(browser, cluster, viewport={"width": 390, "height": 844})
    try:
        login(admin, admin_user)
        admin.goto("/virtual-clusters/")
        expect(admin.locator("#vc-default")).to_contain_text("of the cluster")
        screenshot(admin, "virtual-clusters")
        admin.get_by_role("navigation", name="Main").get_by_role("link", name="Nodes").click()
        expect(admin.get_by_role("heading", name="Nodes")).to_be_visible()
        for name in ("t-node-a", "t-node-b"):
            # The row's name begins with the node's and a space: other tests'
            # nodes stay listed (lost), "t-node-bomb" among them.
            expect(admin.get_by_role("row", name=re.compile(rf"^{re.escape(name)} "))).to_contain_text("simulated")
        screenshot(admin, "nodes")
        admin.goto("/?user=all&status=active")
        expect(admin.locator(f"tr[data-job-id='{job.pk}']")).to_contain_text(alice.username)

        wait_state(job, State.RUNNING)
        login(phone, alice)
        expect(phone.get_by_role("link", name="Virtual Clusters")).to_be_hidden()  # folded into the menu
        phone.get_by_role("button", name="Menu").click()
        expect(phone.get_by_role("link", name="Virtual Clusters")).to_be_visible()
        screenshot(phone, "narrow-list")
        phone.goto(f"/jobs/{job.pk}/")
        expect(phone.locator("[data-log-lines]")).to_contain_text("small screens")
        # Times are shown in the reader's zone, named (this browser is in New York), UTC in the tooltip.
        submitted = phone.get_by_role("definition").filter(has=phone.locator("time")).first.locator("time")
        local = job.submitted_at.astimezone(ZoneInfo("America/New_York"))
        expect(submitted).to_have_text(local.strftime("%b %-d, %Y, %I:%M:%S %p %Z"))
        expect(submitted).to_have_attribute("title", job.submitted_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
        screenshot(phone, "narrow-job")
    finally:
        admin.context.close()
        phone.context.close()
