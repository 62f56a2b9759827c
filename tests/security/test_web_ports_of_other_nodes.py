"""Finding 2, for nodes on other machines: a task's web port is bound to its
node's loopback, which the portal's proxy reaches only on its own machine.

Now the proxy always goes through the node agent's forwarder
(jobs/node/webforward.py), which listens on the node's address and splices
a connection to a task's loopback-bound web port only after the portal
proves itself (an HMAC with the node's key over the node, the task attempt,
the port, a timestamp and a nonce; once, fresh), and only to a web port of
a task running on that node. The test cluster's nodes are at 127.0.0.2 and
publish web ports on 127.0.0.3: the proxy's way there is the forwarder's.
The last test puts the node on another host for real (a network namespace
with its own Docker engine, joined with a join token: tests/multihost.py).
Anonymous clients and other users at the proxy itself:
test_web_ports_behind_login.py."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest
from django.test import override_settings

from jobs import services
from jobs.models import State, TaskAttempt
from jobs.node.webforward import Nonces
from jobs.services import webports
from tests.cluster import wait_for
from tests.helpers import config, lines, login, new_user, role, running_attempt, submit, wait_state
from tests.task_hosts import follow_to_task_host, forwarder_answer, port_spec

LABEL = "http"
# busybox httpd on the task's http port: a page, and a CGI that sends one
# line and then holds the response open.
HTTPD = ("mkdir -p /www/cgi-bin && echo hello-from-busybox > /www/index.html && "
         "printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\necho first line\\nsleep 600\\n' "
         "> /www/cgi-bin/slow && chmod +x /www/cgi-bin/slow && echo serving && "
         f"exec httpd -f -p $PAI_CONTAINER_HOST_{LABEL}_PORT_LIST -h /www")


def _serve(user, name: str) -> TaskAttempt:
    job = submit(user, config(name, role(command=HTTPD, portList=port_spec(LABEL))))
    attempt = running_attempt(job, timeout=90)
    wait_for(lambda: lines(job) == ["serving"], timeout=60, what="httpd to start")
    return TaskAttempt.objects.select_related("node").get(pk=attempt.pk)


@pytest.fixture(scope="module")
def httpd_tasks(cluster):
    """Two running busybox httpd tasks of two users."""
    users = [new_user(f"fwd{who}") for who in "ab"]
    attempts = [_serve(user, f"httpd-{i}") for i, user in enumerate(users)]
    yield users, attempts
    for attempt in attempts:
        job = attempt.job
        job.refresh_from_db()
        if not job.is_final:
            services.job_stop(job=job, by=job.owner)


def _link(attempt: TaskAttempt) -> str:
    return f"/jobs/{attempt.job_id}/tasks/{attempt.pk}/ports/{attempt.ports[LABEL][0]}/"


def _forwarder(attempt: TaskAttempt) -> tuple[str, int]:
    port = webports.forward_port_of(attempt.node.name)
    assert port is not None, "the node's agent advertises its forwarder"
    return attempt.node.address, port


def _knock(address: tuple[str, int], line: bytes, then: bytes = b"") -> tuple[bytes, bytes]:
    """(the forwarder's answer, what came back for `then` until it closed)."""
    with socket.create_connection(address, timeout=20) as sock:
        sock.sendall(line)
        answer = forwarder_answer(sock)
        if answer != b"OK\n":
            assert sock.recv(1024) == b""  # and closed
            return answer, b""
        sock.sendall(then)
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
        return answer, rest


def _proof(attempt: TaskAttempt, port: int | None = None, **kwargs) -> bytes:
    return webports.forward_proof_line(node_name=attempt.node.name, attempt_id=attempt.pk,
                                       port=port if port is not None else attempt.ports[LABEL][0], **kwargs)


GET = b"GET / HTTP/1.0\r\nHost: task\r\n\r\n"
REFUSED_PROOF = b"NO bad, stale or used proof\n"
REFUSED_PORT = b"NO not a web port of a task running on this node\n"


def test_it_checks_forward_proofs(settings):
    now = int(time.time() * 1000)
    line = webports.forward_proof_line(node_name="gpu-01", attempt_id=7, port=20001, now_ms=now)
    request = webports.forward_proof_read(line, node_name="gpu-01", now_ms=now + 1000)
    assert (request.node_name, request.attempt_id, request.port) == ("gpu-01", 7, 20001)
    assert webports.forward_proof_read(line, node_name="gpu-02", now_ms=now) is None  # another node's
    stale = webports.FORWARD_PROOF_SECONDS * 1000 + 1
    assert webports.forward_proof_read(line, node_name="gpu-01", now_ms=now + stale) is None
    assert webports.forward_proof_read(line, node_name="gpu-01", now_ms=now - stale) is None  # from the future
    tampered = line.replace(b" 20001 ", b" 20002 ")
    assert webports.forward_proof_read(tampered, node_name="gpu-01", now_ms=now) is None
    for junk in (b"", b"GET / HTTP/1.1\r\n", line[:-1], line + b"x", b"\xff" * 40 + b"\n"):
        assert webports.forward_proof_read(junk, node_name="gpu-01", now_ms=now) is None
    # While the secret key is rotated, nodes still on the old one are reached.
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-secret-key-" + "y" * 40, [old]
    assert webports.forward_proof_read(line, node_name="gpu-01", now_ms=now) is not None
    nonces = Nonces()
    assert nonces.claim("n1", now=0) and not nonces.claim("n1", now=1) and nonces.claim("n2", now=1)


@pytest.mark.services
def test_it_reaches_a_task_on_a_node_at_another_address_through_its_forwarder(httpd_tasks, cluster):
    (owner, _other), (attempt, _) = httpd_tasks
    assert attempt.node.address == "127.0.0.2"  # the web port itself is on 127.0.0.3 only
    client, _path = follow_to_task_host(login(cluster.base_url, owner), cluster.base_url, _link(attempt))
    page = client.get("/")
    assert page.status_code == 200 and page.text == "hello-from-busybox\n"
    # While a response streams, the proxy's connection is to the forwarder,
    # and the forwarder's to the task's port on the loopback.
    forwarder = _forwarder(attempt)
    portal = cluster.base_url.removeprefix("http://").split(":")
    with socket.create_connection((portal[0], int(portal[1])), timeout=20) as browser:
        browser.sendall(f"GET /cgi-bin/slow HTTP/1.1\r\nHost: {client.host}\r\nCookie: {client.cookie}\r\n\r\n"
                        .encode())
        seen = b""
        while b"first line" not in seen:
            chunk = browser.recv(4096)
            assert chunk, seen
            seen += chunk
        connected = _established()
        assert forwarder in connected
        assert ("127.0.0.3", attempt.ports[LABEL][0]) in connected


def _established() -> set[tuple[str, int]]:
    """Remote ends of this machine's established IPv4 TCP connections."""
    remote = set()
    for row in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = row.split()
        if fields[3] != "01":
            continue
        address, port = fields[2].split(":")
        remote.add((socket.inet_ntoa(bytes.fromhex(address)[::-1]), int(port, 16)))
    return remote


@pytest.mark.services
def test_it_forwards_only_with_a_fresh_proof_used_once(httpd_tasks):
    _users, (attempt, _) = httpd_tasks
    forwarder = _forwarder(attempt)
    line = _proof(attempt)
    answer, page = _knock(forwarder, line, GET)
    assert answer == b"OK\n" and page.startswith(b"HTTP/1.") and page.endswith(b"hello-from-busybox\n")
    assert _knock(forwarder, line, GET) == (REFUSED_PROOF, b"")  # replayed
    assert _knock(forwarder, GET) == (REFUSED_PROOF, b"")  # no proof: straight to HTTP
    with socket.create_connection(forwarder, timeout=30) as silent:  # nothing at all: let go after a few seconds
        assert silent.recv(1) == b""
    stale = int(time.time() * 1000) - (webports.FORWARD_PROOF_SECONDS + 5) * 1000
    assert _knock(forwarder, _proof(attempt, now_ms=stale), GET) == (REFUSED_PROOF, b"")
    with override_settings(SECRET_KEY="not-the-portals-secret-key-" + "z" * 40):
        forged = _proof(attempt)
    assert _knock(forwarder, forged, GET) == (REFUSED_PROOF, b"")
    other_node = webports.forward_proof_line(node_name=attempt.node.name + "x", attempt_id=attempt.pk,
                                             port=attempt.ports[LABEL][0])
    assert _knock(forwarder, other_node, GET) == (REFUSED_PROOF, b"")


@pytest.mark.services
def test_it_forwards_only_to_a_web_port_of_that_running_task(httpd_tasks, cluster):
    users, (attempt, other) = httpd_tasks
    forwarder = _forwarder(attempt)
    # Another job's port, with this task's attempt (the other task may run
    # on either node: it is refused on both).
    assert _knock(forwarder, _proof(attempt, other.ports[LABEL][0]), GET) == (REFUSED_PORT, b"")
    # Ports that are no task's web port: the forwarder's own, the portal's.
    portal_port = int(cluster.base_url.rsplit(":", 1)[1])
    for port in (forwarder[1], portal_port, attempt.ports[LABEL][0] + 1):
        assert _knock(forwarder, _proof(attempt, port), GET) == (REFUSED_PORT, b"")
    # The same task on another node's forwarder (the node is in the proof and checked against the database).
    assert webports.web_port_owner_on_node(node_name=attempt.node.name + "x", attempt_id=attempt.pk,
                                           port=attempt.ports[LABEL][0]) is None
    assert webports.web_port_owner_on_node(node_name=attempt.node.name, attempt_id=attempt.pk,
                                           port=attempt.ports[LABEL][0]) == attempt.job.owner_id


@pytest.mark.services
def test_it_forwards_nothing_once_the_task_stops(cluster, alice):
    attempt = _serve(alice, "httpd-stopping")
    forwarder = _forwarder(attempt)
    assert _knock(forwarder, _proof(attempt), GET)[0] == b"OK\n"
    services.job_stop(job=attempt.job, by=alice)
    wait_state(attempt.job, State.STOPPED, timeout=60)
    assert _knock(forwarder, _proof(attempt), GET) == (REFUSED_PORT, b"")


@pytest.mark.services
def test_it_keeps_the_forwarder_out_of_other_users_containers(httpd_tasks, bob, cluster):
    _users, (attempt, _) = httpd_tasks
    address, port = _forwarder(attempt)
    probe = (f"gw=$(ip route | awk '/default/ {{print $3}}'); for target in {address} $gw; do "
             f"if echo | timeout 5 nc $target {port} >/dev/null 2>&1; then echo reached; else echo refused; fi; done")
    prober = wait_state(submit(bob, config("probe-forwarder", role(command=probe))), State.SUCCEEDED, timeout=60)
    assert lines(prober) == ["refused", "refused"]


# ------------------------------------------------ a node on another machine

MH_USER = "mh_web"


@pytest.fixture(scope="module")
def other_machine():
    """A portal host and one node host, each a network namespace of its own
    with its own Docker engine (tests/multihost.py): the node joined with a
    join token, and its web ports are on *its* loopback."""
    from tests import services as test_services
    from tests.multihost import multihost_cluster

    for program in ("dockerd", "redis-server", "nsenter", "unshare", "ip", "iptables", "setpriv", "ss"):
        test_services.need(program)
    if not shutil.which("/usr/lib/postgresql/15/bin/postgres"):
        test_services.unavailable("PostgreSQL 15 (/usr/lib/postgresql/15/bin/postgres)")
    test_services.need_docker()
    with multihost_cluster(["n1"], users=[MH_USER]) as cluster:
        yield cluster


def _listening_ports(netns: str, address: str) -> set[int]:
    listed = subprocess.run(["nsenter", f"--net=/var/run/netns/{netns}", "--", "ss", "-Htln"], capture_output=True,
                            text=True, check=True).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in listed.splitlines()
            if line.split()[3].rsplit(":", 1)[0] == address}


@pytest.mark.services
@pytest.mark.multihost
def test_it_reaches_a_web_port_of_a_node_on_another_machine(other_machine):
    mh = other_machine
    api = mh.apis[MH_USER]
    api.submit(config("mh-httpd", role(command=HTTPD, portList=port_spec(LABEL))))
    api.wait_state("mh-httpd", "RUNNING")
    job = mh.db.job(MH_USER, "mh-httpd")
    attempt = mh.db.task_attempts(job["id"])[0]
    wait_for(lambda: mh.db.log_lines(attempt["id"]) == ["serving"], timeout=60, what="httpd to start")
    port = attempt["ports"][LABEL][0]
    base = mh.portal.base_url
    client, _path = follow_to_task_host(login(base, api), base, f"/jobs/{job['id']}/tasks/{attempt['id']}/ports/{port}/")
    page = client.get("/")
    assert page.status_code == 200 and page.text == "hello-from-busybox\n"
    # Off the node, its web port is out of reach, and its forwarder wants a proof.
    node = mh.nodes["n1"].host
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((node.address, port), timeout=10)
    # On the node's address: the agent's forwarder, and the task's other
    # (published) ports in the node's range.
    from tests.multihost import NODE_PORTS

    first, last = map(int, NODE_PORTS.split("-"))
    forwarders = {p for p in _listening_ports(node.netns, node.address) if not first <= p <= last}
    assert len(forwarders) == 1, forwarders
    assert _knock((node.address, forwarders.pop()), GET) == (REFUSED_PROOF, b"")
    api.stop("mh-httpd")
