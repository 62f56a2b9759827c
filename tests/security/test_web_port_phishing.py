"""Finding 36: a user could send anyone into their own task's web port.

The portal's link into a web port redirected to the task host with a
ticket in the URL, and the task host let in whichever browser came with it.
An attacker opened the link of their own job, kept the ticket URL, and sent
it on (or redirected a victim's browser to it from a site of theirs): the
victim, signed in to the portal or not, landed on the attacker's page at a
task host of the portal's, signed in as the attacker, where a fake
"session expired" form could ask for their password. An admin, who may open
any task's port, went straight into another user's page from a link.

Now the ticket goes from a page of the portal's own origin to the task host
in a POST, which the task host takes only with that page's Origin, so only
the browser the portal gave it to can use it; an admin opening another
user's port is first told whose it is, and goes on by a form of the portal's.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from jobs.models import TaskAttempt
from jobs.services import access, webports
from tests.helpers import login
from tests.task_hosts import TaskHostClient, enter_form, follow_to_task_host, running_app

LABEL = "http"


def link_of(attempt: TaskAttempt) -> str:
    """The portal's own link, its path signed (finding 43), as its owner has it."""
    return access.web_port_url(attempt, attempt.ports[LABEL][0], "/echo")


@pytest.fixture(scope="module")
def attackers_task(cluster):
    with running_app("phish", LABEL) as (owner, attempt):
        yield owner, attempt


def _handed_over(answer: requests.Response) -> tuple[str, str, str]:
    """(task host, enter path, ticket) out of what the portal gave its
    owner: a redirect with the ticket in its URL, or a page with a form."""
    if answer.is_redirect:
        location = urlsplit(answer.headers["Location"])
        ticket = parse_qs(location.query)["ticket"][0] if "ticket=" in location.query else ""
        return location.netloc, location.path, ticket
    form = enter_form(answer.text)
    location = urlsplit(form.action)
    return location.netloc, location.path, form.ticket


def _ways_to_send_it_on(base: str) -> list[Callable[[TaskHostClient, str, str], requests.Response]]:
    """Each way the attacker can put the ticket into a victim's browser:
    a link, or a form on a page of theirs (another site, or a task host of
    theirs), whose browser sends its Origin, or none, or "null"."""
    port = base.rsplit(":", 1)[1]

    def link(client: TaskHostClient, path: str, ticket: str) -> requests.Response:
        return client.get(f"{path}?ticket={ticket}")

    def posted_from(origin: str | None) -> Callable[[TaskHostClient, str, str], requests.Response]:
        def post(client: TaskHostClient, path: str, ticket: str) -> requests.Response:
            headers = {"Content-Type": "application/x-www-form-urlencoded"}
            if origin is not None:
                headers["Origin"] = origin.replace("HOST", client.host)
            return client.request("POST", path, data=f"ticket={ticket}", headers=headers)
        return post

    return [link, posted_from(None), posted_from("null"), posted_from("http://evil.example"),
            posted_from("http://HOST"), posted_from(f"http://t1-1.localhost:{port}")]


@pytest.mark.services
def test_it_lets_no_other_browser_in_with_what_the_owner_was_handed(attackers_task, bob, cluster):
    owner, attempt = attackers_task
    base = cluster.base_url
    attacker = login(base, owner)
    for victim_cookie in ("", "; ".join(f"{c.name}={c.value}" for c in login(base, bob).cookies)):
        for send_on in _ways_to_send_it_on(base):
            host, path, ticket = _handed_over(attacker.get(base + link_of(attempt), allow_redirects=False))
            victim = TaskHostClient(base, host)
            entered = send_on(victim, path, ticket)
            assert entered.status_code in (403, 405), (send_on, entered.status_code, entered.headers)
            assert "pai_webport" not in entered.headers.get("Set-Cookie", "")
            assert victim.get("/echo", headers={"Cookie": victim_cookie} if victim_cookie else None).status_code == 403
    # A body that is no ticket is a clear 413, not a worker holding it.
    host, path, _ticket = _handed_over(attacker.get(base + link_of(attempt), allow_redirects=False))
    huge = TaskHostClient(base, host).request("POST", path, data="ticket=" + "x" * 8000, headers={"Origin": base})
    assert huge.status_code == 413
    # The owner's own browser still gets in, once per ticket.
    client, landing = follow_to_task_host(attacker, base, link_of(attempt))
    assert landing == "/echo" and client.get("/echo").status_code == 200


@pytest.mark.services
def test_it_tells_an_admin_whose_port_it_is_before_letting_them_in(attackers_task, admin_user, bob, cluster):
    owner, attempt = attackers_task
    base = cluster.base_url
    admin = login(base, admin_user)
    page = admin.get(base + link_of(attempt), allow_redirects=False)
    assert page.status_code == 200, page.status_code
    assert owner.username in page.text and "not the portal" in page.text
    assert webports.ENTER_PATH not in page.text  # no ticket until the admin says so
    # A form of the portal's (CSRF-checked), so a link alone cannot skip the notice.
    assert admin.post(base + link_of(attempt), allow_redirects=False).status_code == 403
    client, landing = follow_to_task_host(admin, base, link_of(attempt))
    assert landing == "/echo" and client.get("/echo").status_code == 200

    # The notice and its form are the owner's and admins' only.
    anonymous = requests.Session()
    anonymous.trust_env = False
    assert "/login/" in anonymous.get(base + link_of(attempt), allow_redirects=False).headers["Location"]
    stranger = login(base, bob)
    refused = stranger.post(base + link_of(attempt), data={"csrfmiddlewaretoken": stranger.cookies["csrftoken"]},
                            headers={"Referer": base + "/"}, allow_redirects=False)
    assert refused.status_code == 404


@pytest.mark.services
@pytest.mark.browser
def test_an_admin_goes_on_from_the_notice_in_a_browser(page, attackers_task, admin_user, cluster):
    from playwright.sync_api import expect

    from tests.browser import login as browser_login

    owner, attempt = attackers_task
    browser_login(page, admin_user)
    page.goto(link_of(attempt))
    expect(page.get_by_role("heading")).to_contain_text(owner.username)
    page.get_by_role("button", name=f"Open {owner.username}'s port").click()
    page.wait_for_url(f"http://t{attempt.pk}-{attempt.ports[LABEL][0]}.localhost:*/echo")
    assert '"path": "/echo"' in page.content()
