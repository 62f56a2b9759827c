"""Real-browser fixtures: Debian's Chromium driven by Playwright for Python.

`playwright install` cannot download anything here, so the browser is the
system's /usr/bin/chromium, started with the flags this machine needs (no
background networking: outside connections are refused). Screenshots go to
var/test/run-*/screenshots so a developer can look at every page.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import services as test_services
from tests.settings import TEST_VAR

CHROMIUM = os.environ.get("PORTAL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
SCREENSHOTS = TEST_VAR / "screenshots"


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        test_services.unavailable(f"Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        playwright.stop()


@pytest.fixture
def page(browser, cluster) -> Iterator[object]:
    """A fresh browser context (no cookies) at 1280 px, pointed at the test
    portal: `page.goto("/submit/")` works with relative paths."""
    context = browser.new_context(base_url=cluster.base_url, viewport={"width": 1280, "height": 900},
                                  timezone_id="Europe/Berlin")
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture(scope="session")
def portal_in_process() -> Iterator[str]:
    """The portal served from this process on 127.0.0.1 (Django's threaded
    WSGI server, static files from the source tree), for pages that need no
    node agent or Docker: jobs made as rows (tests/test_pages.py) are enough
    to look at their layout. Its base URL."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler)
    server.set_app(StaticFilesHandler(get_wsgi_application()))
    thread = threading.Thread(target=server.serve_forever, name="portal-in-process", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def page_alone(browser, base_url: str, *, width: int = 1280) -> object:
    """A fresh browser page (no cookies) at `width` px in New York's time
    zone; close it with page.context.close()."""
    context = browser.new_context(base_url=base_url, viewport={"width": width, "height": 900},
                                  timezone_id="America/New_York", locale="en-US")
    context.set_default_timeout(15_000)
    return context.new_page()


def login(page, user) -> None:
    """Log `user` in through the real login form (users made by `make_user`
    carry their password as `test_password`)."""
    page.goto("/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(user.test_password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"^(?!.*/login/).*$"))


def screenshot(page, name: str) -> Path:
    """Save a full-page PNG under var/test/run-*/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
