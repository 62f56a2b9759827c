"""Finding 45: under a shared proxy domain, a sibling task host could set
the proxy's own sign-in cookie.

A page may set a cookie for a parent domain of its host (`document.cookie =
"pai_webport=...; domain=pai-jobs.example.net"`), and the browser then
sends it to every task host under it. The proxy's cookie was a plain
`pai_webport` under HTTPS too, so a page of Mallory's task, once opened in
a victim's browser (an admin who opened her port; any user's own app with a
cross-site scripting hole), could set `pai_webport` to her own cookie for
another task host of hers: a link then took the victim there signed in as
Mallory, with no notice, at a task host of the portal's (finding 36's
phishing by another way).

Now under HTTPS the proxy's cookie is `__Host-pai_webport`, which browsers
take only from the host itself (Secure, Path=/, no Domain), and the proxy
reads no other name; a `pai_webport` lets no one in. Under plain HTTP no
prefix can help (see SECURITY.md, "Choosing PORTAL_PROXY_DOMAIN")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from jobs.services import webports
from tests.task_hosts import portal_in_thread, running_app

pytestmark = pytest.mark.services

LABEL = "http"


@pytest.fixture(scope="module")
def portal(cluster) -> Iterator[str]:
    """portal.asgi's application under uvicorn in a thread of this process
    (so a test's settings are the portal's, HTTPS among them); its base URL."""
    with portal_in_thread() as base_url:
        yield base_url


@pytest.fixture(scope="module")
def malloryss_task(cluster) -> Iterator[tuple]:
    with running_app("tosser", LABEL) as (owner, attempt):
        yield owner, attempt


def _host(portal: str, attempt) -> str:
    return f"t{attempt.pk}-{attempt.ports[LABEL][0]}.localhost:{portal.rsplit(':', 1)[1]}"


def _request(portal: str, attempt, path: str, *, method: str = "GET", cookie: str = "", **kwargs) -> requests.Response:
    headers = {"Host": _host(portal, attempt), **kwargs.pop("headers", {})}
    if cookie:
        headers["Cookie"] = cookie
    return requests.request(method, portal + path, headers=headers, allow_redirects=False, timeout=30,
                            proxies={"http": ""}, **kwargs)


def _enter(portal: str, owner, attempt) -> requests.Response:
    ticket = webports.ticket_issue(user=owner, attempt_id=attempt.pk, port=attempt.ports[LABEL][0], next_path="/",
                                   origin=portal)
    return _request(portal, attempt, webports.ENTER_PATH, method="POST", data=f"ticket={ticket}",
                    headers={"Origin": portal, "Content-Type": "application/x-www-form-urlencoded"})


def _valid_value(owner, attempt) -> str:
    """The proxy's cookie value for this task host, as Mallory has it in her own browser."""
    grant = webports.Grant(user_id=owner.pk, auth_tag=webports._auth_tag(owner),
                           host=webports.TaskHost(attempt.pk, attempt.ports[LABEL][0]))
    return webports.cookie_value(grant)


def test_under_https_the_proxys_cookie_is_one_no_sibling_can_set(portal, malloryss_task, settings, bob):
    settings.HTTPS = True
    mallory, attempt = malloryss_task
    entered = _enter(portal, mallory, attempt)
    assert entered.status_code == 303, entered.text
    cookie = entered.headers["Set-Cookie"]
    name, _, value = cookie.split(";", 1)[0].partition("=")
    # What a browser takes from this host alone: Secure, Path=/, no Domain.
    assert name == "__Host-pai_webport", cookie
    attributes = [a.strip().lower() for a in cookie.split(";")[1:]]
    assert "secure" in attributes and "path=/" in attributes and not any(a.startswith("domain") for a in attributes)
    assert _request(portal, attempt, "/echo", cookie=f"{name}={value}").status_code == 200

    # What a sibling task host's page can set on the parent domain: the
    # plain name, even with Mallory's valid value for this very host.
    tossed = f"pai_webport={_valid_value(mallory, attempt)}"
    refused = _request(portal, attempt, "/echo", cookie=tossed)
    assert refused.status_code == 403 and "Not signed in" in refused.text
    # Neither name reaches the job, whichever is sent.
    seen = _request(portal, attempt, "/echo", cookie=f"{tossed}; {name}={value}; theirs=1").json()["headers"]
    assert [v for k, v in seen if k == "cookie"] == ["theirs=1"]

    # No one else is let in: an anonymous client, and another user's cookie
    # for this host under the right name.
    assert _request(portal, attempt, "/echo").status_code == 403
    assert _request(portal, attempt, "/echo", cookie=f"__Host-pai_webport={_valid_value(bob, attempt)}"
                    ).status_code == 403


def test_under_plain_http_the_cookie_keeps_its_name(portal, malloryss_task, settings):
    settings.HTTPS = False
    mallory, attempt = malloryss_task
    entered = _enter(portal, mallory, attempt)
    name, _, value = entered.headers["Set-Cookie"].split(";", 1)[0].partition("=")
    assert name == "pai_webport" and "secure" not in entered.headers["Set-Cookie"].lower()
    assert _request(portal, attempt, "/echo", cookie=f"{name}={value}").status_code == 200
    # The __Host- name is no sign-in without HTTPS (a browser would not keep it).
    assert _request(portal, attempt, "/echo", cookie=f"__Host-pai_webport={value}").status_code == 403
