"""Finding 2: a task's web ports (Jupyter, TensorBoard, ...) were open to
anyone who could reach the node, with no login.

Now web-labelled ports are published on the node's loopback only, and their
owner (or a portal admin) reaches them through the portal's proxy, at a host
name of the task's own: the job page's link checks who asks and hands a
one-time ticket to the task host, which sets its own cookie; every request
is checked again, and no credential of the portal's reaches the job."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import docker
import pytest
import requests
from django.core import signing
from django.test import override_settings

from jobs import services
from jobs.models import State, TaskAttempt
from jobs.services import webports
from tests.cluster import wait_for
from tests.helpers import DEBIAN_IMAGE, config, lines, login, role, running_attempt, submit, wait_state
from tests.task_hosts import (
    TaskHostClient, app_command, enter_form, enter_page, follow_to_task_host, port_spec, running_app,
)

LABEL = "http"


def link_of(attempt: TaskAttempt, path: str = "") -> str:
    return f"/jobs/{attempt.job_id}/tasks/{attempt.pk}/ports/{attempt.ports[LABEL][0]}/" + (f"?next={path}" if path else "")


@pytest.fixture(scope="module")
def web_task(cluster):
    """A running task of its own user serving the test app on an `http` port."""
    with running_app("webowner", LABEL) as (owner, attempt):
        yield owner, attempt.job, attempt


def test_it_signs_tickets_for_one_host_and_one_use(alice, monkeypatch):
    host = webports.TaskHost(41, 20001)
    grant = webports.Grant(user_id=alice.pk, auth_tag="x", host=host)
    portal = "http://localhost:8000"
    ticket = signing.dumps({"u": alice.pk, "h": "x", "a": 41, "p": 20001, "n": "n-" + str(time.monotonic_ns()),
                            "next": "/tree", "o": portal}, salt="jobs.webports.ticket")
    assert webports.ticket_redeem(ticket, host=webports.TaskHost(41, 20002), origin=portal) is None  # another task host
    for elsewhere in (None, "", "null", "http://localhost:8001", "http://t41-20001.localhost:8000"):
        assert webports.ticket_redeem(ticket, host=host, origin=elsewhere) is None  # posted from no page of the portal's
    redeemed = webports.ticket_redeem(ticket, host=host, origin=portal)
    assert redeemed is not None and redeemed.user_id == alice.pk and redeemed.next_path == "/tree"
    assert webports.ticket_redeem(ticket, host=host, origin=portal) is None  # once only
    assert webports.ticket_redeem(ticket[:-2] + "xx", host=host, origin=portal) is None
    cookie = webports.cookie_value(grant)
    assert webports.cookie_grant(cookie, host=host) == grant
    assert webports.cookie_grant(cookie, host=webports.TaskHost(42, 20001)) is None
    now = time.time()
    monkeypatch.setattr(signing.time, "time", lambda: now - 61)
    stale = webports.cookie_value(grant)
    monkeypatch.undo()
    with override_settings(PORTAL_PROXY_SESSION_SECONDS=60):
        assert webports.cookie_grant(stale, host=host) is None
        assert webports.cookie_grant(cookie, host=host) == grant
    for bad in ("//evil.example/", "/\\evil.example", "https://evil.example/", "x", "/a\r\nSet-Cookie: x=1"):
        assert webports.safe_next_path(bad) == "/"


def test_it_routes_only_task_hosts_to_the_proxy():
    assert webports.task_host_from_header("t12-20001.localhost:8000") == webports.TaskHost(12, 20001)
    assert webports.task_host_from_header("T12-20001.LOCALHOST") == webports.TaskHost(12, 20001)
    for portal in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "t12-20001.localhost.evil:80"):
        assert webports.task_host_from_header(portal) is None and not webports.is_proxy_host(portal)
    assert webports.is_proxy_host("anything.localhost:8000")  # never the portal, even if it names no task


@pytest.mark.services
def test_it_keeps_web_ports_off_the_nodes_address(web_task, bob, cluster):
    owner, job, attempt = web_task
    port = attempt.ports[LABEL][0]
    bindings = docker.from_env().api.inspect_container(attempt.container_id)["HostConfig"]["PortBindings"]
    assert bindings[f"{port}/tcp"] == [{"HostIp": "127.0.0.3", "HostPort": str(port)}]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((attempt.host_ip, port), timeout=5)
    # Another user's task tries the node's address and the host as its containers see it.
    probe = (f"gw=$(ip route | awk '/default/ {{print $3}}'); "
             f"for target in {attempt.host_ip} $gw; do "
             f"if timeout 5 wget -q -O- http://$target:{port}/echo >/dev/null 2>&1; then echo reached; else echo refused; fi; done")
    prober = wait_state(submit(bob, config("probe", role(command=probe))), State.SUCCEEDED, timeout=60)
    assert lines(prober) == ["refused", "refused"]


@pytest.mark.services
def test_it_lets_no_anonymous_client_and_no_other_user_in(web_task, bob, cluster):
    owner, job, attempt = web_task
    base = cluster.base_url
    anonymous = requests.get(base + link_of(attempt), allow_redirects=False)
    assert anonymous.status_code == 302 and "/login/" in anonymous.headers["Location"]
    task_host = TaskHostClient(base, f"t{attempt.pk}-{attempt.ports[LABEL][0]}.localhost:{base.rsplit(':', 1)[1]}")
    assert task_host.get("/echo").status_code == 403
    forged = webports.Grant(user_id=owner.pk, auth_tag="0" * 32, host=webports.TaskHost(attempt.pk, attempt.ports[LABEL][0]))
    assert task_host.get("/echo", headers={"Cookie": f"pai_webport={webports.cookie_value(forged)}"}).status_code == 403
    assert task_host.get("/__pai_portal__/enter?ticket=nonsense").status_code == 405
    assert task_host.request("POST", "/__pai_portal__/enter", data="ticket=nonsense", headers={
        "Origin": base, "Content-Type": "application/x-www-form-urlencoded"}).status_code == 403

    stranger = login(base, bob)
    assert stranger.get(base + link_of(attempt), allow_redirects=False).status_code == 404
    # The owner's portal session is no key to the task host either.
    owner_session = login(base, owner)
    portal_cookies = "; ".join(f"{c.name}={c.value}" for c in owner_session.cookies)
    assert task_host.get("/echo", headers={"Cookie": portal_cookies}).status_code == 403
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect as ws_connect

    portal_address = ("127.0.0.1", int(base.rsplit(":", 1)[1]))
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(f"ws://{task_host.host}/echo", sock=socket.create_connection(portal_address),
                   additional_headers={"Cookie": portal_cookies}, open_timeout=10)
    assert refused.value.response.status_code == 403


@pytest.mark.services
def test_it_lets_the_owner_in_once_per_ticket_and_passes_no_portal_credential(web_task, admin_user, cluster):
    owner, job, attempt = web_task
    base = cluster.base_url
    session = login(base, owner)
    page = enter_page(session, base, link_of(attempt, "/echo%3Fq%3D1"))
    form_html = page.text.split('id="web-port-enter"', 1)[1].split("</form>", 1)[0]
    assert page.headers["Cache-Control"] == "no-store" and "csrfmiddlewaretoken" not in form_html  # not to the job
    first = urlsplit(enter_form(page.text).action)
    assert first.netloc == f"t{attempt.pk}-{attempt.ports[LABEL][0]}.localhost:{base.rsplit(':', 1)[1]}"
    client = TaskHostClient(base, first.netloc)

    def post_ticket() -> requests.Response:
        return client.request("POST", first.path, data=f"ticket={enter_form(page.text).ticket}",
                              headers={"Origin": base, "Content-Type": "application/x-www-form-urlencoded"})

    entered = post_ticket()
    assert entered.status_code == 303 and entered.headers["Location"] == "/echo?q=1"
    cookie = entered.headers["Set-Cookie"]
    assert cookie.startswith("pai_webport=") and "HttpOnly" in cookie and "Domain" not in cookie
    assert post_ticket().status_code == 403  # used already

    client.cookie = cookie.split(";")[0]
    portal_cookies = "; ".join(f"{c.name}={c.value}" for c in session.cookies)
    seen = client.get("/echo?q=1", headers={
        "Cookie": f"{portal_cookies}; app=kept", "Authorization": "Basic c2VjcmV0", "X-CSRFToken": "token"})
    assert seen.status_code == 200
    headers = dict(seen.json()["headers"])
    assert headers["cookie"] == "app=kept"  # no sessionid, csrftoken, nor the proxy's own cookie
    assert "authorization" not in headers and "x-csrftoken" not in headers
    assert headers["x-forwarded-for"] == "127.0.0.1" and headers["host"] == client.host
    # Bodies stream both ways.
    posted = client.request("POST", "/upload", data=b"x" * (8 * 1024 * 1024))
    assert posted.json() == {"received": 8 * 1024 * 1024}

    # Admins may open any task's web port, as they may open a terminal in it.
    admin, _path = follow_to_task_host(login(base, admin_user), base, link_of(attempt))
    assert admin.get("/echo").status_code == 200


@pytest.mark.services
def test_it_streams_a_response_as_the_job_sends_it(web_task, cluster):
    owner, job, attempt = web_task
    client, _path = follow_to_task_host(login(cluster.base_url, owner), cluster.base_url, link_of(attempt))
    started = time.monotonic()
    with client.get("/stream", stream=True, timeout=20) as response:
        assert response.status_code == 200
        assert next(response.iter_lines()) == b"first line"  # the job holds the rest for a minute
    assert time.monotonic() - started < 15


@pytest.mark.services
def test_it_checks_every_request_again(alice, cluster):
    job = submit(alice, config("rechecked", role(command=app_command(LABEL), portList=port_spec(LABEL)), image=DEBIAN_IMAGE))
    attempt = running_attempt(job, timeout=90)
    wait_for(lambda: lines(job) == ["serving"], timeout=60, what="the app to listen")
    client, _path = follow_to_task_host(login(cluster.base_url, alice), cluster.base_url, link_of(attempt))
    assert client.get("/echo").status_code == 200
    type(alice).objects.filter(pk=alice.pk).update(is_active=False)
    assert client.get("/echo").status_code == 403
    type(alice).objects.filter(pk=alice.pk).update(is_active=True)
    assert client.get("/echo").status_code == 200
    alice.set_password("a-new-password-for-tests")
    alice.save(update_fields=["password"])
    assert client.get("/echo").status_code == 403  # a password change ends the proxy's sign-in too
    services.job_stop(job=job, by=alice)
    wait_state(job, State.STOPPED, timeout=60)
    again = TaskHostClient(client.base_url, client.host, client.cookie)
    assert again.get("/echo").status_code == 403
