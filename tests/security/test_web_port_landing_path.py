"""Finding 43: anyone could send a task's owner into their own app at a path
of the sender's choosing.

The portal's link into a web port took `?next=` as the path to land on and
went straight on for the job's owner (the page posts its ticket by itself):
a link in a mail or on another site opened the owner's own Jupyter, signed
in, at a path that makes it act (a notebook to open and run, a terminal, a
GET with side effects in whatever app the task serves).

Now a link goes straight on only to the app's start page ("/") or to a path
the portal's own page signed (the job page's Open Jupyter link, with its
token). Any other path is shown on a notice of the portal's, and opened
only by its form (a POST under the portal's CSRF check)."""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import pytest
import requests

from jobs.services import access, webports
from tests.helpers import login
from tests.task_hosts import enter_form, follow_to_task_host, running_app

LABEL = "http"
# A path with a side effect in some app, as an attacker would pick it.
PICKED = "/echo?action=delete&file=thesis.tex"


@pytest.fixture(scope="module")
def owners_task(cluster):
    with running_app("landing", LABEL) as (owner, attempt):
        yield owner, attempt


def _link(attempt, query: str = "") -> str:
    return f"/jobs/{attempt.job_id}/tasks/{attempt.pk}/ports/{attempt.ports[LABEL][0]}/" + query


@pytest.mark.services
def test_a_link_from_anywhere_does_not_open_the_owners_app_at_its_path(owners_task, cluster):
    owner, attempt = owners_task
    base = cluster.base_url
    session = login(base, owner)
    link = _link(attempt, f"?next={quote(PICKED, safe='')}")
    page = session.get(base + link, allow_redirects=False)
    # No ticket, no form that posts itself: the path is shown and waits for the owner.
    assert page.status_code == 200 and 'id="web-port-enter"' not in page.text and "ticket" not in page.text
    assert page.headers["Cache-Control"] == "no-store"
    shown = re.search(r'id="web-port-landing">(.*?)</p>', page.text, re.S).group(1)
    assert f"<code>{PICKED.replace('&', '&amp;')}</code>" in shown
    # A forged or another port's signature is no signature.
    for signature in ("0" * 32, webports.landing_signature(attempt_id=attempt.pk, port=1, path=PICKED)):
        forged = session.get(base + link + f"&landing={signature}", allow_redirects=False)
        assert forged.status_code == 200 and 'id="web-port-enter"' not in forged.text
    # A form on another site posting `next` has no CSRF token (and no Referer of the portal's).
    posted = session.post(base + _link(attempt), data={"next": PICKED}, allow_redirects=False)
    assert posted.status_code == 403 and 'id="web-port-enter"' not in posted.text

    # The owner who means it goes on by the notice's form, and lands there.
    client, landing = follow_to_task_host(session, base, link)
    assert landing == PICKED
    assert json.loads(client.get(landing).text)["path"] == PICKED
    # "Open its start page instead" is the link without a path: straight in, at "/".
    start = session.get(base + _link(attempt), allow_redirects=False)
    assert start.status_code == 200 and 'id="web-port-enter"' in start.text
    _client, landing = follow_to_task_host(session, base, _link(attempt))
    assert landing == "/"


@pytest.mark.services
def test_the_portals_own_links_go_straight_on(owners_task, cluster):
    owner, attempt = owners_task
    base = cluster.base_url
    session = login(base, owner)
    signed = access.web_port_url(attempt, attempt.ports[LABEL][0], "/echo?token=abc")
    page = session.get(base + signed, allow_redirects=False)
    assert page.status_code == 200 and 'id="web-port-enter"' in page.text
    _client, landing = follow_to_task_host(session, base, signed)
    assert landing == "/echo?token=abc"
    # The signature is for that path only.
    other = signed.replace("token%3Dabc", "token%3Dabd")
    assert 'id="web-port-enter"' not in session.get(base + other, allow_redirects=False).text


@pytest.mark.services
def test_it_refuses_others_and_bad_paths_clearly(owners_task, cluster, bob, admin_user):
    owner, attempt = owners_task
    base = cluster.base_url
    link = _link(attempt, f"?next={quote(PICKED, safe='')}")
    # Another user: the usual 404, by link and by post; an anonymous client: the login.
    other = login(base, bob)
    assert other.get(base + link, allow_redirects=False).status_code == 404
    assert other.post(base + _link(attempt), data={"next": PICKED, "csrfmiddlewaretoken": other.cookies["csrftoken"]},
                      headers={"Referer": base + "/"}, allow_redirects=False).status_code == 404
    anonymous = requests.get(base + link, allow_redirects=False, proxies={"http": ""})
    assert anonymous.status_code == 302 and "/login/" in anonymous.headers["Location"]
    # An admin sees the owner's name and the path on one notice, and lands there only through it.
    admin = login(base, admin_user)
    notice = admin.get(base + link, allow_redirects=False)
    assert notice.status_code == 200 and owner.username in notice.text and "<code>/echo?action=delete" in notice.text
    _client, landing = follow_to_task_host(admin, base, link)
    assert landing == PICKED

    session = login(base, owner)
    too_long = session.get(base + _link(attempt, "?next=/" + "a" * webports.LANDING_MAX_CHARS), allow_redirects=False)
    assert too_long.status_code == 400 and "longer than 2048 characters" in too_long.text
    # Paths that are no path on the task host land on "/", never elsewhere.
    for bad in ("//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:alert(1)"):
        page = session.get(base + _link(attempt, f"?next={quote(bad, safe='')}"), allow_redirects=False)
        assert page.status_code == 200 and enter_form(page.text).ticket  # "/" needs no notice
        _client, landing = follow_to_task_host(session, base, _link(attempt, f"?next={quote(bad, safe='')}"))
        assert landing == "/"
