"""Finding 39: a link opened a shell in another user's task at once. Admins
may open a terminal in any task, and the terminal page connected as it
loaded: a user sent an admin the link to their own task's terminal, and
the admin was typing in a container whose programs are the user's (root
there reads the terminal) under the portal's own page, where a prompt the
container printed ("your session expired, password:") looked like the
portal's.

Now the page of another user's task names its owner, says that what is
typed there is theirs to read, and connects only when the admin says so."""

from __future__ import annotations

import pytest
import requests
from playwright.sync_api import expect

from jobs.models import TerminalSession
from tests.browser import login as browser_login
from tests.cluster import wait_for
from tests.helpers import config, login, new_user, role, running_job_of


@pytest.fixture
def users_task(cluster):
    owner = new_user("lurer")
    with running_job_of(owner, config("lure", role(command="sleep 600"))) as (job, attempt):
        yield owner, job, attempt


@pytest.mark.services
@pytest.mark.browser
def test_it_opens_a_shell_in_another_users_task_only_when_the_admin_says_so(page, users_task, admin_user, bob,
                                                                             cluster):
    owner, job, attempt = users_task
    terminal = f"/jobs/{job.pk}/terminal/{attempt.pk}/"
    browser_login(page, admin_user)
    page.goto(terminal)
    notice = page.locator("#terminal-notice")
    expect(notice).to_contain_text(owner.username)
    expect(notice).to_contain_text("can read what you type")
    page.wait_for_timeout(3000)  # what a page that connects on load would take, and more
    assert not TerminalSession.objects.filter(attempt=attempt, user=admin_user).exists()

    page.get_by_role("button", name=f"Open a shell in {owner.username}'s task").click()
    expect(page.locator("#terminal-status")).to_have_text("Connected.")
    wait_for(lambda: TerminalSession.objects.filter(attempt=attempt, user=admin_user).exists(),
             what="the admin's session to be recorded")

    # The owner's own task: no notice, the shell opens as the page loads.
    page.context.clear_cookies()
    browser_login(page, owner)
    page.goto(terminal)
    expect(page.locator("#terminal-status")).to_have_text("Connected.")
    assert page.locator("#terminal-notice").count() == 0

    # The page stays the owner's and admins' only.
    assert login(cluster.base_url, bob).get(cluster.base_url + terminal).status_code == 404
    anonymous = requests.Session()
    anonymous.trust_env = False
    assert "/login/" in anonymous.get(cluster.base_url + terminal, allow_redirects=False).headers["Location"]
