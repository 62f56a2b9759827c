"""Usage of a real task, end to end: a node agent of the test's own samples
every half second (USAGE_SAMPLE_SECONDS=0.5), a busybox task burns CPU and
holds memory, its samples land in the database, and its job page draws them
with uPlot in a real browser (Debian's Chromium through Playwright), from
the REST API, growing while the page stays open.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from playwright.sync_api import expect

from django.utils import timezone

from jobs import services
from jobs.models import State, TaskUsage
from jobs.services import usage
from tests.browser import login, screenshot
from tests.cluster import wait_for
from tests.helpers import config, role, running_attempt, submit, wait_state
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
    cluster.agent(NODE).stop()


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
    TaskUsage.objects.bulk_create(rows)
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
