"""Finding 1: the portal's session cookie reached job ports. Browsers send
cookies by host name, not port: with the portal and the node both on
127.0.0.1, a job serving HTTP on its port got a visiting user's `sessionid`,
and its page could open the browser terminal's WebSocket as that user
(Channels' origin check compared host names only).

Now a node never publishes task ports on one of the portal's host names
(the default single-machine node is 127.0.0.2, and the node agent refuses
the portal's own names), and a WebSocket's Origin must equal the portal's
origin exactly: scheme, host and port."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests
from django.test import override_settings
from playwright.sync_api import expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from jobs.models import TerminalSession
from jobs.services.nodes import node_address_clash
from tests.browser import login as browser_login
from tests.cluster import ROOT, process_env, wait_for
from tests.helpers import DEBIAN_IMAGE, config, login, role, running_attempt, submit
from tests.task_hosts import app_command, port_spec

# Not a web label: published on the node's address, as any job may do.
LABEL = "app"


def test_it_refuses_a_node_address_that_is_one_of_the_portals_host_names():
    with override_settings(ALLOWED_HOSTS=["127.0.0.1", "localhost", ".example.org"],
                           CSRF_TRUSTED_ORIGINS=["https://pai.example.net"]):
        for address in ("127.0.0.1", "LOCALHOST", "gpu.example.org", "pai.example.net"):
            assert "one of the portal's own host names" in node_address_clash(address), address
        for address in ("127.0.0.2", "10.0.0.5", "gpu.example.com"):
            assert node_address_clash(address) is None, address


@pytest.mark.parametrize("args, env", [
    (["--address", "127.0.0.1"], {}),
    (["--address", "localhost"], {}),
    (["--address", "127.0.0.2"], {"NODE_WEB_PORT_ADDRESS": "127.0.0.1"}),
])
def test_it_does_not_start_a_node_agent_on_the_portals_host(args, env):
    agent = subprocess.run([sys.executable, "manage.py", "node_agent", "--name", "clash", *args], cwd=ROOT,
                           env=process_env(PORTAL_ALLOWED_HOSTS="127.0.0.1,localhost,[::1]", **env),
                           capture_output=True, text=True, timeout=60)
    assert agent.returncode != 0
    assert "is one of the portal's own host names" in agent.stderr


@pytest.mark.services
def test_it_refuses_a_terminal_websocket_from_another_origin_on_the_portals_host(alice, cluster):
    attempt = running_attempt(submit(alice, config("origin", role(command="sleep 600"))))
    session = login(cluster.base_url, alice)
    cookies = "; ".join(f"{c.name}={c.value}" for c in session.cookies)
    url = cluster.base_url.replace("http://", "ws://") + f"/ws/terminal/{attempt.pk}/"
    portal_port = int(cluster.base_url.rsplit(":", 1)[1])
    for origin in (f"http://127.0.0.1:{portal_port + 1}", f"https://127.0.0.1:{portal_port}",
                   f"http://127.0.0.2:{portal_port}", "http://localhost", "null"):
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(url, origin=origin, additional_headers={"Cookie": cookies}, proxy=None, open_timeout=10)
        assert refused.value.response.status_code == 403, origin
    with ws_connect(url, origin=cluster.base_url, additional_headers={"Cookie": cookies}, proxy=None,
                    open_timeout=10) as allowed:
        assert allowed.recv(timeout=10)  # the shell's first output
    assert TerminalSession.objects.filter(attempt=attempt).count() == 1


@pytest.mark.services
@pytest.mark.browser
def test_it_keeps_the_session_cookie_and_the_terminal_from_a_jobs_page(page, alice, bob, cluster):
    """Alice, signed in, visits a page a job of Bob's serves on its port."""
    victim = running_attempt(submit(alice, config("victim", role(command="sleep 600"))))
    job = submit(bob, config("lure", role(command=app_command(LABEL), portList=port_spec(LABEL)), image=DEBIAN_IMAGE))
    lure = running_attempt(job, timeout=90)
    assert lure.host_ip == "127.0.0.2"  # the node's address is not the portal's 127.0.0.1
    port = lure.ports[LABEL][0]
    wait_for(lambda: requests.get(f"http://{lure.host_ip}:{port}/", timeout=5).ok, timeout=60, what="the job's app")

    browser_login(page, alice)
    assert any(c["name"] == "sessionid" for c in page.context.cookies())
    socket = cluster.base_url.replace("http://", "ws://") + f"/ws/terminal/{victim.pk}/"
    page.goto(f"http://{lure.host_ip}:{port}/?ws={socket}", timeout=60_000)
    expect(page.locator("#ws")).to_contain_text("closed", timeout=15_000)
    assert "sessionid" not in page.locator("#cookie").inner_text()
    assert "csrftoken" not in page.locator("#cookie").inner_text()
    assert "open" not in page.locator("#ws").inner_text()
    assert not TerminalSession.objects.filter(attempt=victim).exists()
