"""Usage of a real task, end to end: a node agent of the test's own samples
every half second (USAGE_SAMPLE_SECONDS=0.5), a busybox task burns CPU and
holds memory, its samples land in the database, and its job page draws them
with uPlot in a real browser (Debian's Chromium through Playwright), from
the REST API, growing while the page stays open.
"""

from __future__ import annotations

import re
import uuid
from urllib.parse import parse_qs, urlsplit
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect

from django.utils import timezone

from jobs import services
from jobs.models import Job, Node, State, TaskAttempt, TaskState, TaskUsage
from jobs.services import usage, usage_series
from tests.browser import SCREENSHOTS, login, page_alone, screenshot
from tests.cluster import wait_for
from tests.helpers import config, role, running_attempt, stop_node_agent, submit, wait_state
from tests.test_big_job_queries import big_job, idle_node
from tests.test_usage_series import store  # samples marked for the roll-up, as the agents write them
from tests.test_usage import node, running_tasks  # noqa: F401  (fixture)

pytestmark = [pytest.mark.services, pytest.mark.browser]
GPU_TYPE = "USAGETEST"
NODE = "t-node-usage"
# Holds about 20 MB (a shell variable) and burns a core until stopped.
BURN = "x=$(head -c 20000000 /dev/zero | tr '\\0' a); echo holding; while :; do :; done"


@pytest.fixture(scope="module")
def usage_node(cluster) -> Iterator[str]:
    """A node agent that samples every half second, with the only GPU of its type."""
    cluster.start_agent(NODE, ports=cluster.port_range(4), gpus=1, gpu_type=GPU_TYPE,
                        env={"USAGE_SAMPLE_SECONDS": "0.5"})
    yield NODE
    stop_node_agent(cluster, NODE)


@pytest.fixture
def burning_job(alice, usage_node):
    job = submit(alice, config(f"burn-{uuid.uuid4().hex[:6]}", role(command=BURN, gpus=1, memory=128),
                               gpuType=GPU_TYPE))
    yield job
    job.refresh_from_db()
    if not job.is_final:
        services.job_stop(job=job, by=alice)
        wait_state(job, State.STOPPED)


def test_a_task_burning_cpu_shows_cpu_and_memory_in_its_samples(burning_job):
    attempt = running_attempt(burning_job)

    def busy_samples() -> int:
        rows = TaskUsage.objects.filter(attempt=attempt, cpu_percent__gt=0, memory_bytes__gt=15_000_000)
        return rows.count() >= 3

    try:
        wait_for(busy_samples, timeout=60, what="samples of a busy task")
    except AssertionError as exc:
        seen = list(TaskUsage.objects.filter(attempt=attempt).values_list("cpu_percent", "memory_bytes")[:20])
        raise AssertionError(f"{exc}; samples (cpu %, memory): {seen}") from None
    assert not TaskUsage.objects.filter(attempt=attempt).exclude(gpus=[]).exists()  # simulated GPU: no figures


def test_the_job_page_draws_live_graphs_from_the_api(page, alice, burning_job):
    attempt = running_attempt(burning_job)
    wait_for(lambda: TaskUsage.objects.filter(attempt=attempt).count() >= 2, timeout=60, what="the first samples")
    login(page, alice)
    api_path = f"/api/v2/jobs/{alice.username}~{burning_job.name}/metrics"
    with page.expect_response(lambda r: r.url.split("?")[0].endswith(api_path)) as first:
        page.goto(f"/jobs/{burning_job.pk}/")
    answer = first.value.json()
    sent = len(answer["tasks"][0]["samples"])
    assert first.value.status == 200 and sent >= 2
    page.evaluate("window.notReloaded = true")

    task = page.locator("#usage-charts [data-task='main-0']")
    cpu, memory = task.locator("[data-chart='cpu']"), task.locator("[data-chart='memory']")
    expect(cpu.locator("canvas")).to_have_count(1)
    expect(memory.locator("canvas")).to_have_count(1)
    wait_for(lambda: int(cpu.get_attribute("data-points")) >= sent, what="the first samples drawn")
    drawn = page.evaluate("""() => {
        const plot = document.querySelector("#usage-charts [data-task='main-0'] [data-chart='cpu']").usagePlot;
        return plot.data[1];
    }""")
    assert drawn[:sent] == [s["cpuPercent"] for s in answer["tasks"][0]["samples"]]  # what the API sent
    expect(task.locator("[data-chart='gpu']")).to_have_count(0)  # a simulated GPU: nothing to draw
    expect(page.get_by_text(re.compile("simulated GPUs report no utilisation"))).to_be_visible()

    # Live: later polls ask only for what came after and the graphs grow.
    with page.expect_request(lambda r: api_path in r.url and "since=" in r.url):
        pass
    wait_for(lambda: int(cpu.get_attribute("data-points")) >= sent + 3, timeout=30, what="the graph to grow")
    assert page.evaluate("window.notReloaded") is True
    assert page.evaluate("""() => {
        const el = document.querySelector("#usage-charts [data-task='main-0'] [data-chart='cpu'] canvas");
        return el.width > 0 && el.height > 0;
    }""")
    screenshot(page, "job-usage")


def test_a_running_task_whose_samples_stopped_does_not_freeze_the_others_graphs(page, alice, node):  # noqa: F811
    """Each task gives at most `samplesPerTask` samples an answer. The page
    asked from the oldest last sample of the running tasks: one whose node
    stopped sampling ten minutes ago kept the others' answers to samples
    they had already drawn, and their graphs stopped growing."""
    stalled, busy = running_tasks(alice, node, 2)
    now = timezone.now()
    per_task = usage.samples_per_task(2)
    rows = [TaskUsage(attempt_id=stalled.pk, at=now - timedelta(minutes=10, seconds=s), cpu_percent=1.0,
                      memory_bytes=1) for s in (5, 0)]
    # More samples of the busy task since then than one answer gives it.
    rows += [TaskUsage(attempt_id=busy.pk, at=now - timedelta(milliseconds=100 * i), cpu_percent=50.0,
                       memory_bytes=1) for i in range(per_task + 100)]
    store(rows)
    try:
        login(page, alice)
        page.goto(f"/jobs/{busy.job_id}/")
        cpu = page.locator(f"#usage-charts [data-task='main-{busy.task.index}'] [data-chart='cpu']")
        wait_for(lambda: int(cpu.get_attribute("data-points") or 0) == per_task, timeout=30,
                 what="the busy task's newest samples drawn")
        TaskUsage.objects.create(attempt_id=busy.pk, at=timezone.now(), cpu_percent=75.0, memory_bytes=1)
        wait_for(lambda: int(cpu.get_attribute("data-points")) == per_task + 1, timeout=30,
                 what="the busy task's new sample drawn")
    finally:  # old samples that usage_compact in other tests would fold (the database outlives a test)
        TaskUsage.objects.filter(attempt_id__in=[stalled.pk, busy.pk]).delete()


# ------------------------------------------- big jobs: the job as a whole
#
# Jobs made as rows (tests/test_big_job_queries.py big_job) on a node of
# the test's own, their samples written here, the portal served from this
# process: no Docker, no node agent.

rows_node = pytest.fixture(idle_node, name="rows_node")
PAGE_OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


def page_period() -> float:
    """The buckets the page adds tasks up in (usage_charts.js `period`)."""
    return max(2.0, usage.sample_seconds())


def rounds_at(count: int) -> list[float]:
    """Times (epoch seconds) of `count` sample rounds, one period apart, each
    at the start of a bucket of the page's, the newest a period ago."""
    step = page_period()
    newest = (timezone.now().timestamp() // step - 1) * step
    return [newest - step * (count - 1 - k) for k in range(count)]


def sample(attempt_id: int, at: float, *, cpu: float, memory_gib: float, gpu: list[float] | None = None,
           indexes: list[int] | None = None) -> TaskUsage:
    """GPU figures `gpu` of the node's GPUs `indexes` (0, 1, ... unless given)."""
    gpu = gpu or []
    return TaskUsage(attempt_id=attempt_id, at=datetime.fromtimestamp(at, UTC), cpu_percent=cpu,
                     memory_bytes=int(memory_gib * 2**30),
                     gpus=[{"index": i, "utilPercent": u, "memoryUsedBytes": 2**30}
                           for i, u in zip(indexes if indexes is not None else range(len(gpu)), gpu)])


def plot_data(page, selector: str) -> list[list[float | None]]:
    return page.evaluate("s => document.querySelector(s).usagePlot.data.slice(1)", selector)


def usage_screenshot(page, name: str) -> None:
    """The Usage panel alone: a big job's whole page is mostly its task table."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#usage").screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def job_page(browser, portal, user, job, *, width: int = 1280):
    """The job's page, its first answer drawn; `page.errors` collects what
    its scripts report to the console (none expected), `page.requests` the
    URLs it asked for."""
    page = page_alone(browser, portal, width=width)
    page.errors = []
    page.requests = []
    page.on("request", lambda request: page.requests.append(request.url))
    page.on("console", lambda message: message.type == "error" and page.errors.append(message.text))
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    login(page, user)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#usage-charts[data-loaded='true']")).to_have_count(1)
    return page


def bucket_edges(count: int, width: int = 10) -> list[float]:
    """Starts (epoch seconds) of the newest `count` buckets the summary
    gives whole now (jobs/services/usage_series.py), oldest first."""
    settled = timezone.now().timestamp() - usage_series.settle_seconds()
    newest = (settled // width - 1) * width
    return [newest - width * (count - 1 - k) for k in range(count)]


def summary_of(page, job) -> dict:
    return page.evaluate("u => fetch(u).then(r => r.json())",
                         f"/api/v2/jobs/{job.owner.username}~{job.name}/metrics/summary")


def test_a_big_job_shows_its_tasks_added_up_not_a_graph_per_task(browser, portal_in_process, alice, rows_node):
    """12 tasks on real GPUs (two each), three 10 s buckets: task i uses
    10(i+1)+k % CPU in bucket k, i+1 GiB, GPUs at i and 2i %. Their samples
    come a little apart, as nodes' clocks are; main-5 has none in the
    second bucket, which counts 11 tasks. The server adds them up; the page
    draws what it sent."""
    Node.objects.filter(pk=rows_node.pk).update(gpus_simulated=False)
    job = big_job(alice, rows_node, tasks=12, attempts=1, samples=0)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=10))  # an hour's window
    attempts = list(TaskAttempt.objects.filter(job=job).order_by("task__index"))
    TaskAttempt.objects.filter(job=job).update(gpus=[0, 1])
    edges = bucket_edges(3)
    known: dict[int, dict[int, tuple[float, float, list[float]]]] = {k: {} for k in range(3)}
    rows = []
    for i, attempt in enumerate(attempts):
        for k, at in enumerate(edges):
            if (i, k) == (5, 1):
                continue
            figures = (10.0 * (i + 1) + k, float(i + 1), [float(i), 2.0 * i])
            known[k][i] = figures
            rows.append(sample(attempt.pk, at + 1 + 0.1 * i, cpu=figures[0], memory_gib=figures[1], gpu=figures[2]))
    store(rows)
    page = job_page(browser, portal_in_process, alice, job)
    expect(page.locator("#usage-charts[data-summary-loaded='true']")).to_have_count(1)

    figure = "#usage-charts [data-usage='job']"
    expect(page.locator("#usage-charts .usage-chart")).to_have_count(4)  # cores, CPU per task, memory, GPU
    expect(page.locator("#usage-charts [data-task]")).to_have_count(0)
    expect(page.locator(f"{figure} figcaption")).to_contain_text("All 12 tasks")
    times = page.evaluate("s => document.querySelector(s).usagePlot.data[0]", f"{figure} [data-chart='cores']")
    assert times == edges
    cores, = plot_data(page, f"{figure} [data-chart='cores']")
    mean, least, most = plot_data(page, f"{figure} [data-chart='cpu']")
    memory, = plot_data(page, f"{figure} [data-chart='memory']")
    gpu_mean, gpu_least, gpu_most = plot_data(page, f"{figure} [data-chart='gpu']")
    for k in range(3):
        cpus = [f[0] for f in known[k].values()]
        gpus = [u for f in known[k].values() for u in f[2]]
        assert cores[k] == pytest.approx(sum(cpus) / 100, abs=0.001)
        assert memory[k] == pytest.approx(sum(f[1] for f in known[k].values()))
        assert (mean[k], least[k], most[k]) == (pytest.approx(sum(cpus) / len(cpus), abs=0.01), min(cpus), max(cpus))
        assert (gpu_mean[k], gpu_least[k], gpu_most[k]) == (pytest.approx(sum(gpus) / len(gpus), abs=0.01), 0.0, 22.0)
    assert cores[1] == pytest.approx((sum(10.0 * (i + 1) + 1 for i in range(12)) - 61) / 100, abs=0.001)
    # Drawn as the API sent it.
    sent = summary_of(page, job)["buckets"]
    assert cores == [b["cpuCores"] for b in sent] and least == [b["cpuPercent"]["min"] for b in sent]

    # Live: the next bucket, with one task's sample not in, is drawn once
    # whole, without a reload.
    later = edges[-1] + 10
    store([sample(a.pk, later + 1 + 0.1 * i, cpu=100.0, memory_gib=1.0)
                                   for i, a in enumerate(attempts) if i != 11])
    chart = page.locator(f"{figure} [data-chart='cores']")
    wait_for(lambda: chart.get_attribute("data-points") == "4", timeout=40, what="the new bucket drawn")
    cores, = plot_data(page, f"{figure} [data-chart='cores']")
    assert cores[3] == pytest.approx(11.0)
    expect(page.locator(f"{figure} figcaption")).to_have_text("All 12 tasks (newest samples from 11 of them)")
    usage_screenshot(page, "job-usage-big-desktop")

    # Another window: the server's wider buckets.
    with page.expect_response(lambda r: "metrics/summary?window=86400" in r.url) as answer:
        page.get_by_label("Job-wide graphs over").select_option("86400")
    assert answer.value.json()["bucketSeconds"] == 300
    wait_for(lambda: plot_data(page, f"{figure} [data-chart='cores']")[0] == [
        b["cpuCores"] for b in answer.value.json()["buckets"]], timeout=10, what="the day drawn")
    assert page.errors == []
    page.context.close()


def test_a_big_jobs_window_menu_offers_the_windows_the_server_allows(browser, portal_in_process, alice, rows_node,
                                                                     settings):
    """The menu offers the windows up to the page's data-max-window (any up
    to USAGE_MINUTES_DAYS, whatever the task count: whole minutes come from
    the roll-up), and a job started two hours ago opens on 6 hours, in
    minute buckets."""
    settings.USAGE_MINUTES_DAYS = 0.5  # 12 hours kept: no day to offer
    job = big_job(alice, rows_node, tasks=12, attempts=1, samples=0)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(hours=2))
    attempt = TaskAttempt.objects.filter(job=job).first()
    store([sample(attempt.pk, bucket_edges(1)[0] + 1, cpu=50.0, memory_gib=1.0)])
    page = page_alone(browser, portal_in_process)
    login(page, alice)
    with page.expect_response(lambda r: "metrics/summary?window=" in r.url) as answer:
        page.goto(f"/jobs/{job.pk}/")
    assert answer.value.status == 200 and (answer.value.json()["window"], answer.value.json()["bucketSeconds"]) == (
        21600, 60)
    menu = page.get_by_label("Job-wide graphs over")
    expect(menu).to_have_value("21600")
    assert menu.locator("option").evaluate_all("os => os.map(o => o.value)") == ["600", "3600", "21600"]
    page.context.close()


def asked(page, path: str) -> list[str]:
    """The URLs the page asked for whose path is `path`."""
    return [url for url in page.requests if urlsplit(url).path == path]


def test_a_big_jobs_task_picker_shows_one_task_with_all_its_samples(browser, portal_in_process, alice, rows_node,
                                                                    settings):
    """400 tasks. The page never asks the job's .../metrics (every task's
    samples, 4.7 MB for 1,000 tasks): its task menu lists the 100 tasks the
    tables show, from the live part, and the picked task's graphs show all
    60 of its samples, read from its own address and extended by polls of
    it; the job-wide graphs reach back past what one metrics answer holds."""
    # The hour's 288,000 samples read raw, in 10 s buckets (past the budget
    # they would be minutes from the roll-up, tests/test_usage_rollup.py).
    settings.USAGE_SUMMARY_MAX_SAMPLES = 300_000
    job = big_job(alice, rows_node, tasks=400, attempts=1, samples=0)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=10))
    attempts = list(TaskAttempt.objects.filter(job=job).order_by("task__index"))
    assert usage.samples_per_task(400) == 50
    times = rounds_at(60)
    rows = [sample(attempts[7].pk, at, cpu=float(k), memory_gib=2.0) for k, at in enumerate(times)]
    rows += [sample(a.pk, at, cpu=30.0, memory_gib=1.0) for i, a in enumerate(attempts) if i not in (3, 7)
             for at in times[-2:]]
    store(rows)
    page = job_page(browser, portal_in_process, alice, job)
    api = f"/api/v2/jobs/{alice.username}~{job.name}"
    expect(page.locator("#usage-charts .usage-chart")).to_have_count(3)  # simulated GPUs: no GPU graph
    picker = page.get_by_label("Show one task")
    # None, and the first page of the tables (100 tasks), in their order.
    expect(picker.locator("option")).to_have_count(101)
    assert picker.locator("option").evaluate_all("os => os.map(o => o.value)") == [""] + [
        f"main-{i}" for i in range(100)]
    expect(picker.locator("option[value='main-3']")).to_have_text("main-3 (no recent samples)")
    # Once the newest rounds' buckets are whole (a sample period and the
    # settling time after them).
    expect(page.locator("#usage-charts [data-usage='job'] figcaption")).to_have_text(
        "All 400 tasks (newest samples from 399 of them)", timeout=40_000)
    # The job-wide graphs start at main-7's oldest sample, the 60th before
    # the newest: the server adds up all of them.
    cores = "#usage-charts [data-usage='job'] [data-chart='cores']"
    assert page.evaluate("s => document.querySelector(s).usagePlot.data[0][0]", cores) == times[0] // 10 * 10

    own = f"{api}/tasks/main/7/metrics"
    with page.expect_response(lambda r: urlsplit(r.url).path == own) as first:
        picker.select_option("main-7")
    assert first.value.status == 200 and parse_qs(urlsplit(first.value.url).query) == {"attempt": ["1"]}
    task = page.locator("#usage-charts [data-task='main-7']")
    expect(task.locator(".usage-chart")).to_have_count(2)
    expect(task.locator("[data-chart='cpu']")).to_have_attribute("data-points", "60")
    cpu, = plot_data(page, "#usage-charts [data-task='main-7'] [data-chart='cpu']")
    assert cpu == [float(k) for k in range(60)]
    expect(page.locator("#usage-charts .usage-chart")).to_have_count(5)
    # It grows with polls of its own address, after the last sample it has.
    store([sample(attempts[7].pk, times[-1] + page_period(), cpu=99.0, memory_gib=2.0)])
    expect(task.locator("[data-chart='cpu']")).to_have_attribute("data-points", "61", timeout=30_000)
    cpu, = plot_data(page, "#usage-charts [data-task='main-7'] [data-chart='cpu']")
    assert cpu[-1] == 99.0
    polls = [parse_qs(urlsplit(url).query) for url in asked(page, own)[1:]]
    assert polls and all(set(poll) == {"attempt", "since"} and poll["attempt"] == ["1"] for poll in polls)
    usage_screenshot(page, "job-usage-big-picked")

    # The live part refreshes the menu (main-8 failed): main-7 stays picked.
    TaskAttempt.objects.filter(pk=attempts[8].pk).update(state=TaskState.FAILED, exit_code=1)
    expect(picker.locator("option[value='main-8']")).to_have_attribute("data-state", "FAILED", timeout=15_000)
    expect(picker).to_have_value("main-7")
    expect(page.locator("#usage-charts [data-task]")).to_have_count(1)
    expect(task.locator("[data-chart='cpu']")).to_have_attribute("data-points", "61")

    picker.select_option("main-8")
    expect(page.locator("#usage-charts [data-task]")).to_have_count(1)
    expect(page.locator("#usage-charts [data-task='main-8'] [data-chart='cpu']")).to_have_attribute("data-points", "2")
    picker.select_option("")
    expect(page.locator("#usage-charts [data-task]")).to_have_count(0)
    assert asked(page, f"{api}/metrics") == []  # never every task's samples
    assert asked(page, f"{api}/metrics/summary")
    assert page.errors == []

    # The tables' second page: the menu lists its tasks.
    page.goto(f"/jobs/{job.pk}/?tasks=2")
    expect(picker.locator("option")).to_have_count(101)
    expect(picker.locator("option[value='main-100']")).to_have_count(1)
    expect(picker.locator("option[value='main-7']")).to_have_count(0)
    page.context.close()


def test_a_small_job_keeps_a_graph_per_task(browser, portal_in_process, alice, rows_node):
    job = big_job(alice, rows_node, tasks=3, attempts=1, samples=3)
    page = job_page(browser, portal_in_process, alice, job)
    expect(page.locator("#usage-charts [data-task]")).to_have_count(3)
    expect(page.locator("#usage-charts .usage-chart")).to_have_count(6)
    expect(page.locator("#usage-charts [data-usage='job'], #usage-task")).to_have_count(0)
    assert asked(page, f"/api/v2/jobs/{alice.username}~{job.name}/metrics")  # every task's samples, as before
    assert page.errors == []
    page.context.close()


def test_a_big_jobs_graphs_fit_a_phone(browser, portal_in_process, alice, rows_node):
    Node.objects.filter(pk=rows_node.pk).update(gpus_simulated=False)
    job = big_job(alice, rows_node, tasks=300, attempts=1, samples=0)
    store([
        sample(a.pk, at + 0.01 * i, cpu=20.0 + i % 50 + k, memory_gib=1.5, gpu=[float(i % 90)], indexes=a.gpus)
        for i, a in enumerate(TaskAttempt.objects.filter(job=job)) for k, at in enumerate(rounds_at(20))])
    page = job_page(browser, portal_in_process, alice, job, width=390)
    expect(page.locator("#usage-charts .usage-chart")).to_have_count(4)
    page.get_by_label("Show one task").select_option("main-42")
    expect(page.locator("#usage-charts [data-task='main-42'] .usage-chart")).to_have_count(3)
    assert page.evaluate(PAGE_OVERFLOW) == 0
    assert page.locator("#usage").bounding_box()["height"] < 3000  # a per-task page was 126,000 px
    usage_screenshot(page, "job-usage-big-phone")
    page.context.close()
