"""Finding 38: a user could hold any number of connections through the
web-port proxy. A task's app that never finishes an answer (or a WebSocket
left open) holds the browser's connection in a portal worker and two more
in the node agent's forwarder for as long as the client likes, and the job's
owner is both the client and the app: a script opening thousands of them
used up the file descriptors of the portal's workers (every user's requests
on them failed) and of the node agent (launches and logs of every user's
tasks on that node).

Now each portal worker forwards at most WEB_PORT_CONNECTIONS_PER_USER
requests and WebSockets of one user at once; more get a 429 (a WebSocket
is refused before it opens)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import requests
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.cluster import wait_for
from tests.helpers import login
from tests.task_hosts import TaskHostClient, follow_to_task_host, running_app

LABEL = "http"
CAP = 3


@pytest.fixture(scope="module")
def capped_portal(cluster) -> Iterator[str]:
    """A portal of one worker (the limit is a worker's) allowing CAP."""
    shared = cluster.base_url
    cluster.start_portal(name="gunicorn-capped", env={"WEB_PORT_CONNECTIONS_PER_USER": str(CAP)}, workers=1)
    capped, cluster.base_url = cluster.base_url, shared
    yield capped
    cluster.processes.pop("gunicorn-capped").stop()


@pytest.fixture(scope="module")
def web_task(cluster):
    with running_app("holder", LABEL) as (owner, attempt):
        yield owner, attempt


def _link(attempt) -> str:
    return f"/jobs/{attempt.job_id}/tasks/{attempt.pk}/ports/{attempt.ports[LABEL][0]}/"


def _held_stream(client: TaskHostClient) -> requests.Response:
    """A response the app holds open for a minute, its first line read."""
    response = client.get("/stream", stream=True, timeout=20)
    # Read from the raw stream: a generator of requests' left unfinished
    # would close the connection when it is collected.
    assert response.status_code == 200 and response.raw.read(len(b"first line\n")) == b"first line\n"
    return response


@pytest.mark.services
def test_it_forwards_at_most_so_many_of_one_users_requests_at_once(web_task, capped_portal, admin_user, bob):
    owner, attempt = web_task
    base = capped_portal
    client, _landing = follow_to_task_host(login(base, owner), base, _link(attempt))
    held = [_held_stream(client) for _ in range(CAP)]
    refused = client.get("/echo")
    assert refused.status_code == 429 and "WEB_PORT_CONNECTIONS_PER_USER" in refused.text
    with pytest.raises(InvalidStatus) as socket_refused:
        ws_connect(f"ws://{client.host}/socket", sock=socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1]))),
                   origin=f"http://{client.host}", additional_headers={"Cookie": client.cookie}, open_timeout=10)
    assert socket_refused.value.response.status_code == 403  # a refused handshake: the ASGI server's 403

    # Other users are not held up by one user's count.
    admin, _landing = follow_to_task_host(login(base, admin_user), base, _link(attempt))
    assert admin.get("/echo").status_code == 200
    # ... nor let in by it.
    assert TaskHostClient(base, client.host).get("/echo").status_code == 403
    assert login(base, bob).get(base + _link(attempt), allow_redirects=False).status_code == 404

    held.pop().close()  # a slot comes back as soon as its client goes
    wait_for(lambda: client.get("/echo").status_code == 200, timeout=10, what="the slot to come back")
    for response in held:
        response.close()
