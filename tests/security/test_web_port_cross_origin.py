"""Finding 37: a page of another origin could use a visitor's sign-in to a
task host. The proxy's cookie goes with every request the browser makes to
the task host, also from a page elsewhere: under a proxy domain shared by
every task (`*.pai-jobs.example.net`) all task hosts are one site, so the
cookie (SameSite=Lax) goes with a WebSocket, a fetch or a form post from
another user's task page too. An admin who had opened Bob's Jupyter and then
Mallory's page let Mallory's page talk to Bob's app as the admin, and any
page of Bob's job's that opens no socket of its own could be driven so.

Now the proxy refuses a WebSocket, and any request but GET, HEAD and
OPTIONS, whose Origin is not the task host's own (a request with no Origin
still passes: browsers send one with both)."""

from __future__ import annotations

import socket

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.helpers import login
from tests.task_hosts import follow_to_task_host, running_app

LABEL = "http"


@pytest.fixture(scope="module")
def signed_in(cluster):
    """The owner's client signed in to a task host of a running app."""
    with running_app("xorigin", LABEL) as (owner, attempt):
        link = f"/jobs/{attempt.job_id}/tasks/{attempt.pk}/ports/{attempt.ports[LABEL][0]}/"
        client, _landing = follow_to_task_host(login(cluster.base_url, owner), cluster.base_url, link)
        yield client


def _elsewhere(client) -> list[str]:
    port = client.host.rsplit(":", 1)[1]
    return [f"http://t1-1.localhost:{port}", "http://evil.example", "null", f"https://{client.host}",
            f"http://{client.host.replace(':', '0:')}"]


@pytest.mark.services
def test_it_refuses_a_post_from_a_page_of_another_origin(signed_in):
    client = signed_in
    own = client.request("POST", "/upload", data=b"x" * 10, headers={"Origin": f"http://{client.host}"})
    assert own.status_code == 200 and own.json() == {"received": 10}
    assert client.request("POST", "/upload", data=b"x" * 10).status_code == 200  # no Origin: not a browser's page
    for origin in _elsewhere(client):
        refused = client.request("POST", "/upload", data=b"x" * 10, headers={"Origin": origin})
        assert refused.status_code == 403, (origin, refused.status_code)
        assert "origin" in refused.text.lower()
    # A page's GET (a link, an image, a script) is the app's to judge.
    assert client.get("/echo", headers={"Origin": "http://evil.example"}).status_code == 200


@pytest.mark.services
def test_it_refuses_a_websocket_from_a_page_of_another_origin(signed_in):
    client = signed_in
    address = ("127.0.0.1", int(client.base_url.rsplit(":", 1)[1]))
    with ws_connect(f"ws://{client.host}/socket", sock=socket.create_connection(address), origin=f"http://{client.host}",
                    additional_headers={"Cookie": client.cookie}, open_timeout=10) as own:
        assert own.recv(timeout=10) == "hello"  # the app's own pages open theirs
    for origin in _elsewhere(client):
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(f"ws://{client.host}/socket", sock=socket.create_connection(address), origin=origin,
                       additional_headers={"Cookie": client.cookie}, open_timeout=10)
        assert refused.value.response.status_code == 403, origin
