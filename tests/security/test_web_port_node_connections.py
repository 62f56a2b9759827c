"""Finding 44: nothing bounded one user's connections through a node's
web-port forwarder.

The portal's proxy forwards at most WEB_PORT_CONNECTIONS_PER_USER of one
user's exchanges per worker (finding 38), but every worker counts on its
own, and all of them reach a node through its agent's one forwarder
(jobs/node/webforward.py), which spliced whatever it was sent: each
exchange two of the agent's file descriptors, held as long as the client
and the app (both the owner's) liked. Workers times the limit, from one
user, could take all of the agent's descriptors: launches, logs and web
ports of every user's tasks on the node.

Now the forwarder splices at most WEB_PORT_NODE_CONNECTIONS_PER_USER
connections to the web ports of one user's tasks (counted by the task's
owner, whoever opened them); one more gets "NO busy ...", which the proxy
answers as a 429 naming the setting. The setting is handed to joining
nodes (tests/test_join.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import requests

from jobs.models import TaskAttempt
from jobs.node.webforward import REFUSED_PROOF
from jobs.services import webports
from tests.cluster import wait_for
from tests.helpers import login, stop_node_agent
from tests.task_hosts import TaskHostClient, follow_to_task_host, forwarder_answer, running_app

pytestmark = pytest.mark.services

LABEL = "http"
CAP = 3
GPU_TYPE = "FWDCAP"
NODE = "t-node-fwdcap"


@pytest.fixture(scope="module")
def capped_node(cluster) -> Iterator[str]:
    """A node of its own whose forwarder takes CAP connections per user."""
    cluster.start_agent(NODE, ports=cluster.port_range(4), gpus=2, gpu_type=GPU_TYPE,
                        env={"WEB_PORT_NODE_CONNECTIONS_PER_USER": str(CAP)})
    yield NODE
    stop_node_agent(cluster, NODE)


@pytest.fixture(scope="module")
def two_apps(capped_node) -> Iterator[tuple[tuple, tuple]]:
    """The hog's app and another user's, both on the capped node."""
    with running_app("fwdhog", LABEL, gpu_type=GPU_TYPE) as hog, \
            running_app("fwdother", LABEL, gpu_type=GPU_TYPE) as other:
        for _owner, attempt in (hog, other):
            assert TaskAttempt.objects.get(pk=attempt.pk).node.name == NODE
        yield hog, other


def _forwarder(attempt) -> tuple[str, int]:
    attempt = TaskAttempt.objects.select_related("node").get(pk=attempt.pk)
    port = webports.forward_port_of(attempt.node.name)
    assert port is not None
    return attempt.node.address, port


def _proof(attempt) -> bytes:
    return webports.forward_proof_line(node_name=NODE, attempt_id=attempt.pk, port=attempt.ports[LABEL][0])


def _held(attempt) -> socket.socket:
    """A connection through the forwarder to the app's /stream, which the
    app holds open for a minute once its first line is sent."""
    sock = socket.create_connection(_forwarder(attempt), timeout=20)
    sock.sendall(_proof(attempt))
    assert forwarder_answer(sock) == b"OK\n"
    sock.sendall(b"GET /stream HTTP/1.0\r\nHost: task\r\n\r\n")
    seen = b""
    while b"first line\n" not in seen:
        chunk = sock.recv(4096)
        assert chunk, seen
        seen += chunk
    return sock


def _link(attempt) -> str:
    return f"/jobs/{attempt.job_id}/tasks/{attempt.pk}/ports/{attempt.ports[LABEL][0]}/"


def test_a_nodes_forwarder_takes_so_many_connections_to_one_users_tasks(two_apps, cluster, admin_user, bob):
    (owner, attempt), (other_owner, other_attempt) = two_apps
    base = cluster.base_url
    client, _landing = follow_to_task_host(login(base, owner), base, _link(attempt))
    admin, _landing = follow_to_task_host(login(base, admin_user), base, _link(attempt))
    held = [_held(attempt) for _ in range(CAP)]
    try:
        # One more to the owner's task: straight at the forwarder, or through the
        # portal (the owner's or an admin's: the count is the task owner's).
        with socket.create_connection(_forwarder(attempt), timeout=20) as sock:
            sock.sendall(_proof(attempt))
            refused = forwarder_answer(sock)
            assert refused.startswith(b"NO busy: ") and b"WEB_PORT_NODE_CONNECTIONS_PER_USER" in refused, refused
            assert sock.recv(1024) == b""  # and closed
        for someone in (client, admin):
            answer = someone.get("/echo")
            assert answer.status_code == 429 and "WEB_PORT_NODE_CONNECTIONS_PER_USER" in answer.text, answer.text
            assert answer.headers["Retry-After"] == "10"

        # Another user's task on the same node is not held up by it.
        other, _landing = follow_to_task_host(login(base, other_owner), base, _link(other_attempt))
        assert other.get("/echo").status_code == 200
        # No one else gets in by it: an anonymous client at the forwarder (no
        # proof), at the task host and at the portal, another user at the portal.
        with socket.create_connection(_forwarder(attempt), timeout=20) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert forwarder_answer(sock) == REFUSED_PROOF
        assert TaskHostClient(base, client.host).get("/echo").status_code == 403
        anonymous = requests.get(base + _link(attempt), allow_redirects=False, proxies={"http": ""})
        assert anonymous.status_code == 302 and "/login/" in anonymous.headers["Location"]
        assert login(base, bob).get(base + _link(attempt), allow_redirects=False).status_code == 404

        held.pop().close()  # a slot comes back as soon as its connection goes
        wait_for(lambda: client.get("/echo").status_code == 200, timeout=10, what="the slot to come back")
    finally:
        for sock in held:
            sock.close()
