"""The terminal in the browser, in Debian's Chromium: open it from the job
page on a running busybox task, type, read the screen, press Ctrl-C, see
colours, resize, and see it close when the task ends."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from jobs import keys, services
from jobs.models import TerminalSession
from tests.browser import login, screenshot
from tests.helpers import config, role, running_attempt, submit

pytestmark = [pytest.mark.services, pytest.mark.browser]


def screen_rows(page) -> list[str]:
    """The terminal's rows as the reader sees them (xterm.js's DOM renderer)."""
    return [row.replace("\xa0", " ").rstrip() for row in page.locator("#terminal .xterm-rows > div").all_inner_texts()]


def type_line(page, text: str) -> None:
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def test_it_opens_a_shell_in_the_browser_on_a_running_task(page, alice, cluster):
    job = submit(alice, config("webshell", role(command="sleep 600")))
    attempt = running_attempt(job)
    login(page, alice)
    page.goto(f"/jobs/{job.pk}/")
    screenshot(page, "job-page-access")
    page.get_by_role("link", name="Open terminal").click()
    expect(page).to_have_url(re.compile(rf"/jobs/{job.pk}/terminal/{attempt.pk}/$"))
    expect(page.locator("#terminal-status")).to_have_text("Connected.")
    page.locator("#terminal").click()

    type_line(page, "echo $PAI_JOB_NAME")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("webshell")
    assert "webshell" in screen_rows(page)  # the output line itself, not the typed command

    # Ctrl-C interrupts the foreground command and the shell answers again.
    type_line(page, "sleep 300 && echo not-interrupted")
    page.wait_for_timeout(300)
    page.keyboard.press("Control+C")
    type_line(page, "echo back-$((40+2))")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("back-42")
    assert "not-interrupted" not in screen_rows(page)

    # Colours reach the terminal as colours.
    type_line(page, r"printf '\033[31mred-text\033[0m\n'")
    expect(page.locator("#terminal .xterm-rows span.xterm-fg-1", has_text="red-text")).to_be_visible()

    # The shell's size follows the terminal's.
    before = page.evaluate("() => [window.portalTerminal.rows, window.portalTerminal.cols]")
    page.set_viewport_size({"width": 900, "height": 600})
    page.wait_for_function("([rows, cols]) => window.portalTerminal.cols !== cols || window.portalTerminal.rows !== rows",
                           arg=before)
    size = page.evaluate("() => [window.portalTerminal.rows, window.portalTerminal.cols]")
    type_line(page, "stty size")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text(f"{size[0]} {size[1]}")
    screenshot(page, "terminal-running")

    # Stopping the job ends the session, and the page says so.
    services.job_stop(job=job, by=alice)
    expect(page.locator("#terminal-status")).to_have_text("Closed: the task has ended.", timeout=30_000)
    screenshot(page, "terminal-closed")
    session = TerminalSession.objects.get(attempt=attempt, user=alice)
    assert session.ended_at is not None and session.end_reason == "the task ended"


def test_it_adds_and_deletes_an_ssh_key_on_the_profile_page(page, alice):
    _private, public = keys.new_key_pair("alice@laptop")
    login(page, alice)
    page.goto("/profile/")
    page.get_by_label("Public key", exact=True).fill("ssh-ed25519 nonsense")
    page.get_by_role("button", name="Add key").click()
    expect(page.get_by_text("The SSH key was not added: public key:")).to_be_visible()
    expect(page.get_by_label("Public key", exact=True)).to_have_value("ssh-ed25519 nonsense")  # kept for fixing
    page.get_by_label("Public key", exact=True).fill(public)
    page.get_by_label("Title", exact=True).fill("laptop")
    page.get_by_role("button", name="Add key").click()
    expect(page.get_by_role("cell", name="laptop", exact=True)).to_be_visible()
    screenshot(page, "profile-ssh-keys")
    page.get_by_role("button", name="Delete SSH key laptop").click()
    expect(page.get_by_text("You have not added any SSH public key.")).to_be_visible()
