"""The admin dashboard in a real browser (Debian's Chromium through
Playwright): every graph is drawn from the figures the page carries."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.browser import login, screenshot

pytestmark = [pytest.mark.services, pytest.mark.browser]
CHARTS = ["gpus-vc", "gpus-free", "gpus-user", "running", "waiting", "tasks", "cpu", "memory"]


def test_it_draws_every_graph_for_an_admin(page, admin_user):
    login(page, admin_user)
    page.goto("/dashboard/?hours=6")
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    for name in CHARTS:
        expect(page.locator(f"#dashboard-charts [data-chart='{name}'] canvas")).to_have_count(1)
    figures = json.loads(page.locator("#dashboard-series").text_content())
    drawn = page.evaluate("""() => {
        const plot = document.querySelector("#dashboard-charts [data-chart='tasks']").dashboardPlot;
        return [plot.data[0], plot.data[1]];
    }""")
    assert drawn == [figures["times"], figures["tasksRunning"]]
    screenshot(page, "dashboard")


def test_a_user_who_is_not_an_admin_gets_no_dashboard(page, alice):
    login(page, alice)
    response = page.goto("/dashboard/")
    assert response.status == 403
    expect(page.get_by_role("link", name="Dashboard")).to_have_count(0)
