"""Nodes managed by admins: engine identity (the marker in the engine, and
clashes reported), cordon, drain (stop or wait) and uncordon on real node
agents, through the service, the Nodes page and the REST API v2; and who
may do it (admins only)."""

from __future__ import annotations

import socket
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.models import ExitType, Job, Node, NodeJoinToken, State, Task, TaskAttempt
from jobs.node import launcher
from jobs.services import nodes, tokens
from tests.cluster import Cluster, wait_for
from tests.helpers import config, role, submit, wait_state

GPU_TYPE = "DRAINTEST"
NODE_A, NODE_B = "t-node-drain-a", "t-node-drain-b"
# Until someone connects to the task's port: a task that ends when the test says so.
HOLD = "nc -l -p $PAI_CURRENT_CONTAINER_PORT; echo released"


def _ranges(cluster: Cluster) -> tuple[str, str]:
    """Two halves of one slot of the run's ports: both agents run at once."""
    start = int(cluster.port_range(3).split("-")[0])
    return f"{start}-{start + 49}", f"{start + 50}-{start + 99}"


@pytest.fixture
def two_nodes(cluster):
    """Two agents of our own, one simulated GPU each of a type no other test
    asks for, so our jobs land on them alone. Stopped afterwards, and their
    rows returned to service for the next test."""
    first, second = _ranges(cluster)
    cluster.start_agent(NODE_A, ports=first, gpus=1, gpu_type=GPU_TYPE)
    cluster.start_agent(NODE_B, ports=second, gpus=1, gpu_type=GPU_TYPE)
    try:
        yield Node.objects.get(name=NODE_A), Node.objects.get(name=NODE_B)
    finally:
        Node.objects.filter(name__in=(NODE_A, NODE_B)).update(schedulable=True, drain_mode="", cordoned_at=None,
                                                              cordoned_by="")
        for name in (NODE_A, NODE_B):
            cluster.agent(name).stop()


def _hold(user, name: str, **top):
    return submit(user, config(name, role(command=HOLD, gpus=1), gpuType=GPU_TYPE, **top))


def _running_on(job: Job) -> TaskAttempt:
    return wait_for(lambda: TaskAttempt.objects.filter(job=job, number=Job.objects.get(pk=job.pk).attempt_number,
                                                       state="RUNNING").exclude(container_id="").first(),
                    timeout=60, what=f"job {job.name} to run")


def _release(attempt: TaskAttempt) -> None:
    """Connect to the held task's port (on its node's address) so it ends."""
    port = attempt.ports["main"][0]

    def connected() -> bool:
        with socket.create_connection((attempt.host_ip, port), timeout=5) as conn:
            conn.sendall(b"go\n")
        return True

    wait_for(connected, timeout=30, what=f"the task's port {port} to listen")


def _waits(job: Job) -> bool:
    """The scheduler has looked at the job and left it waiting."""
    job.refresh_from_db()
    return job.state == State.WAITING and bool(job.waiting_reason)


def _state(node: Node) -> str:
    node.refresh_from_db()
    active = TaskAttempt.objects.filter(node=node, state__in=("ASSIGNED", "LAUNCHING", "RUNNING")).count()
    return nodes.node_display_state(node, active)


# ------------------------------------------------------------ engine identity


def test_it_gives_two_agents_on_one_engine_the_same_marker(cluster):
    from django.conf import settings

    marker = launcher.engine_for(settings.DOCKER_HOST).engine_marker()
    a, b = Node.objects.get(name="t-node-a"), Node.objects.get(name="t-node-b")
    assert a.engine_marker == b.engine_marker == marker and len(marker) == 32
    assert a.engine_identity == b.engine_identity
    assert nodes.engine_identity_conflicts([a, b]) == []


def _peer(node: Node, ip: str):
    from jobs.node.runner import _peer

    attempt = TaskAttempt(node=node, task=Task(role="main", index=0), host_ip=node.address, ip=ip, ports={}, gpus=[])
    return _peer(attempt)


def test_it_reports_a_cloned_docker_id_and_does_not_treat_it_as_the_same_engine(cluster, admin_user):
    from jobs import environment

    a = Node.objects.get(name="t-node-a")
    clone = Node.objects.create(
        name=f"t-clone-{uuid.uuid4().hex[:6]}", address="127.0.0.9", docker_host="unix:///elsewhere.sock",
        engine_id=a.engine_id, engine_marker=uuid.uuid4().hex, schedulable=False, last_heartbeat=timezone.now())
    try:
        warnings = nodes.engine_identity_conflicts()
        assert any(clone.name in w and "t-node-a" in w and "key.json" in w for w in warnings), warnings
        assert nodes.engine_conflicts_of(clone.name)
        # Tasks on the clone are reached at its node address, never at a job-network address.
        peer = _peer(clone, ip="10.1.2.3")
        assert environment.peer_address(peer, seen_from_engine=_peer(a, ip="10.1.2.4").engine_id) == "127.0.0.9"
        # ... while a second agent on a's own engine shares the job network.
        twin = Node(pk=-1, name="twin", address=a.address, engine_id=a.engine_id, engine_marker=a.engine_marker)
        assert environment.peer_address(_peer(twin, ip="10.1.2.5"), seen_from_engine=a.engine_identity) == "10.1.2.5"
        client = Client()
        client.force_login(admin_user)
        page = client.get(reverse("jobs:nodes")).content.decode()
        assert "Engine identity:" in page and clone.name in page and "key.json" in page

        def logged() -> bool:  # by the agent that was there first, too
            Node.objects.filter(pk=clone.pk).update(last_heartbeat=timezone.now(), status=Node.Status.READY)
            return clone.name in cluster.agent("t-node-a").log_tail(200)

        wait_for(logged, timeout=30, what="t-node-a's agent to log the clash")
    finally:
        clone.delete()


def test_it_reports_one_marker_claimed_from_two_addresses(cluster):
    a = Node.objects.get(name="t-node-a")
    copy = Node.objects.create(
        name=f"t-copy-{uuid.uuid4().hex[:6]}", address="127.0.0.9", docker_host="unix:///elsewhere.sock",
        engine_id="OTHER:ID", engine_marker=a.engine_marker, schedulable=False, last_heartbeat=timezone.now())
    try:
        warnings = nodes.engine_identity_conflicts()
        assert any(copy.name in w and "t-node-a" in w and "docker volume rm pai-engine-marker" in w
                   for w in warnings), warnings
        # Gone quiet: no longer reported.
        Node.objects.filter(pk=copy.pk).update(last_heartbeat=timezone.now() - timedelta(hours=1))
        assert not any(copy.name in w for w in nodes.engine_identity_conflicts())
    finally:
        copy.delete()


def test_a_node_without_a_marker_shares_an_engine_with_no_other_node():
    old = Node(pk=7, name="old", engine_id="SAME", engine_marker="")
    other = Node(pk=8, name="other", engine_id="SAME", engine_marker="")
    assert old.engine_identity != other.engine_identity


# ------------------------------------------------------ cordon and uncordon


def test_cordon_stops_placement_and_uncordon_resumes_it(alice, admin_user, two_nodes):
    a, b = two_nodes
    nodes.node_cordon(node=a, by=admin_user)
    assert _state(a) == "CORDONED"
    first = _hold(alice, "cordon1")
    on_b = _running_on(first)
    assert on_b.node_name == NODE_B
    second = _hold(alice, "cordon2")
    wait_for(lambda: _waits(second), what="the second job to wait")
    assert not TaskAttempt.objects.filter(job=second).exists()
    nodes.node_uncordon(node=a)
    assert _state(a) == "READY"
    on_a = _running_on(second)
    assert on_a.node_name == NODE_A
    _release(on_b)
    _release(on_a)
    assert wait_state(first, State.SUCCEEDED).exit_type == ExitType.SUCCEEDED
    assert wait_state(second, State.SUCCEEDED).exit_type == ExitType.SUCCEEDED


def test_a_cordon_outlives_the_agent_registering_again(admin_user):
    name = f"t-recordon-{uuid.uuid4().hex[:6]}"
    info = nodes.NodeInfo(name=name, address="127.0.0.9", docker_host="unix:///x.sock", engine_id="X", cpus=1,
                          memory_mb=512, engine_marker="m" * 32)
    node = nodes.node_register(info)
    try:
        nodes.node_drain(node=node, by=admin_user, mode="wait")
        again = nodes.node_register(info)
        assert not again.schedulable and again.drain_mode == "wait" and again.engine_marker == "m" * 32
    finally:
        Node.objects.filter(name=name).delete()


# --------------------------------------------------------------- draining


def test_drain_with_stop_retries_the_job_on_the_other_node(alice, admin_user, two_nodes):
    a, b = two_nodes
    nodes.node_cordon(node=b, by=admin_user)
    command = 'if [ "$PAI_JOB_ATTEMPT" = 1 ]; then sleep 600; fi; echo attempt $PAI_JOB_ATTEMPT done'
    job = submit(alice, config("drained", role(command=command, gpus=1), gpuType=GPU_TYPE, retryCount=1))
    first = _running_on(job)
    assert first.node_name == NODE_A
    nodes.node_uncordon(node=b)
    nodes.node_drain(node=a, by=admin_user, mode="stop")
    job = wait_state(job, State.SUCCEEDED, timeout=90)
    first.refresh_from_db()
    assert first.state == "FAILED" and first.exit_type == ExitType.NODE_DRAINED
    assert first.exit_reason.startswith("node drained")
    second = TaskAttempt.objects.get(job=job, number=2)
    assert job.attempt_number == 2 and second.node_name == NODE_B and second.state == "SUCCEEDED"
    assert _state(a) == "DRAINED" and _state(b) == "READY"
    # No retries left: the drain fails the job, saying so.
    nodes.node_uncordon(node=a)
    nodes.node_cordon(node=b, by=admin_user)
    last = _hold(alice, "drained-last")
    assert _running_on(last).node_name == NODE_A
    nodes.node_drain(node=a, by=admin_user, mode="stop")
    last = wait_state(last, State.FAILED, timeout=60)
    assert last.exit_type == ExitType.NODE_DRAINED and "node drained" in last.exit_reason


def test_drain_with_wait_lets_the_tasks_finish(alice, admin_user, two_nodes):
    a, b = two_nodes
    nodes.node_cordon(node=b, by=admin_user)
    job = _hold(alice, "waited")
    attempt = _running_on(job)
    assert attempt.node_name == NODE_A
    nodes.node_drain(node=a, by=admin_user, mode="wait")
    assert _state(a) == "DRAINING"
    later = submit(alice, config("after-drain", role(command="echo later", gpus=1), gpuType=GPU_TYPE))
    wait_for(lambda: _waits(later), what="the later job to wait: both nodes are out of service")
    attempt.refresh_from_db()
    assert attempt.state == "RUNNING"
    _release(attempt)
    assert wait_state(job, State.SUCCEEDED).exit_type == ExitType.SUCCEEDED
    wait_for(lambda: _state(a) == "DRAINED", what="node a to be drained")
    nodes.node_uncordon(node=a)
    later = wait_state(later, State.SUCCEEDED)
    assert TaskAttempt.objects.get(job=later).node_name == NODE_A


# ------------------------------------------------- the Nodes page and the API


def test_the_nodes_page_cordons_drains_and_uncordons(admin_user, two_nodes):
    a, _b = two_nodes
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    page = client.get(reverse("jobs:nodes"))
    html = page.content.decode()
    assert f'aria-label="Cordon {NODE_A}"' in html and 'data-state="READY"' in html
    token = page.cookies["csrftoken"].value
    # Without the CSRF token: refused.
    assert client.post(reverse("jobs:node_cordon", args=[a.pk])).status_code == 403
    assert _state(a) == "READY"
    assert client.post(reverse("jobs:node_cordon", args=[a.pk]), {"csrfmiddlewaretoken": token}).status_code == 302
    assert _state(a) == "CORDONED"
    assert a.cordoned_by == admin_user.username
    assert client.post(reverse("jobs:node_drain", args=[a.pk]), {"mode": "sideways",
                                                                 "csrfmiddlewaretoken": token}).status_code == 302
    assert _state(a) == "CORDONED"
    client.post(reverse("jobs:node_drain", args=[a.pk]), {"mode": "wait", "csrfmiddlewaretoken": token})
    assert _state(a) == "DRAINED" and a.drain_mode == "wait"
    assert 'data-state="DRAINED"' in client.get(reverse("jobs:nodes")).content.decode()
    client.post(reverse("jobs:node_uncordon", args=[a.pk]), {"csrfmiddlewaretoken": token})
    assert _state(a) == "READY"
    assert client.get(reverse("jobs:node_cordon", args=[a.pk])).status_code == 405


def _api(user=None) -> Client:
    client = Client()
    if user is not None:
        made = tokens.token_create(user=user, lifetime=timedelta(hours=1))
        client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {made.key}"
    return client


def test_the_api_cordons_drains_and_uncordons(admin_user, two_nodes):
    a, _b = two_nodes
    api = _api(admin_user)
    listed = api.get("/api/v2/nodes").json()
    assert {n["name"]: n["state"] for n in listed["nodes"]}[NODE_A] == "READY"
    assert api.post(f"/api/v2/nodes/{NODE_A}/cordon").json()["state"] == "CORDONED"
    bad = api.post(f"/api/v2/nodes/{NODE_A}/drain", {"mode": "now"}, content_type="application/json")
    assert bad.status_code == 400 and "mode must be 'stop'" in bad.json()["message"]
    assert api.post(f"/api/v2/nodes/{NODE_A}/drain", {}, content_type="application/json").status_code == 400
    drained = api.post(f"/api/v2/nodes/{NODE_A}/drain", {"mode": "stop"}, content_type="application/json").json()
    assert drained["state"] == "DRAINED" and drained["drainMode"] == "stop"
    assert api.get(f"/api/v2/nodes/{NODE_A}").json()["cordonedBy"] == admin_user.username
    assert api.post(f"/api/v2/nodes/{NODE_A}/uncordon").json()["state"] == "READY"
    missing = api.post("/api/v2/nodes/no-such-node/cordon")
    assert missing.status_code == 404 and missing.json()["code"] == "NoNodeError"


# -------------------------------------------------------------- who may


def test_only_admins_manage_nodes(alice, redis_server):
    node = Node.objects.create(name=f"t-guarded-{uuid.uuid4().hex[:6]}", address="127.0.0.9",
                               docker_host="unix:///x.sock", schedulable=False)
    try:
        api_paths = ["/api/v2/nodes", f"/api/v2/nodes/{node.name}", "/api/v2/node-join-tokens"]
        actions = [f"/api/v2/nodes/{node.name}/{verb}" for verb in ("cordon", "drain", "uncordon")]
        for client, status, code in ((_api(alice), 403, "ForbiddenUserError"),
                                     (_api(), 401, "UnauthorizedUserError")):
            for path in api_paths:
                answer = client.get(path)
                assert (answer.status_code, answer.json()["code"]) == (status, code), path
            for path in [*actions, "/api/v2/node-join-tokens"]:
                answer = client.post(path, {"mode": "stop"}, content_type="application/json")
                assert (answer.status_code, answer.json()["code"]) == (status, code), path
            assert client.delete("/api/v2/node-join-tokens/pjt_abc").status_code == status
        pages = [reverse(name, args=[node.pk]) for name in ("jobs:node_cordon", "jobs:node_drain", "jobs:node_uncordon")]
        pages += [reverse("jobs:node_join_token_create"), reverse("jobs:node_join_token_revoke", args=[1])]
        user = Client()
        user.force_login(alice)
        anonymous = Client()
        assert user.get(reverse("jobs:nodes")).status_code == 403
        assert anonymous.get(reverse("jobs:nodes")).status_code == 302
        for path in pages:
            assert user.post(path, {"mode": "stop"}).status_code == 403, path
            answer = anonymous.post(path, {"mode": "stop"})
            assert answer.status_code == 302 and "/login/" in answer["Location"], path
        node.refresh_from_db()
        assert node.drain_mode == "" and node.cordoned_by == ""
    finally:
        node.delete()


def test_an_admin_manages_a_node_in_a_real_browser(page, admin_user):
    from tests.browser import login, screenshot

    node = Node.objects.create(name=f"t-page-{uuid.uuid4().hex[:6]}", address="127.0.0.9",
                               docker_host="unix:///x.sock", last_heartbeat=timezone.now())
    try:
        login(page, admin_user)
        page.goto("/nodes/")
        row = page.locator("tr", has=page.locator(".node-name", has_text=node.name))
        assert row.locator(".node-state").get_attribute("data-state") == "READY"
        row.get_by_role("button", name=f"Cordon {node.name}").click()
        row = page.locator("tr", has=page.locator(".node-name", has_text=node.name))
        assert row.locator(".node-state").get_attribute("data-state") == "CORDONED"
        row.get_by_label(f"Drain {node.name}: running tasks").select_option("wait")
        row.get_by_role("button", name=f"Drain {node.name}").click()
        row = page.locator("tr", has=page.locator(".node-name", has_text=node.name))
        assert row.locator(".node-state").get_attribute("data-state") == "DRAINED"
        page.get_by_label("Label").fill("browser")
        page.get_by_role("button", name="Make a join token").click()
        key = page.locator("#new-join-token").input_value()
        assert key.startswith("pjt_") and NodeJoinToken.objects.get(prefix=key[:12]).label == "browser"
        screenshot(page, "nodes-admin")
        row = page.locator("tr", has=page.locator(".node-name", has_text=node.name))
        row.get_by_role("button", name=f"Uncordon {node.name}").click()
        row = page.locator("tr", has=page.locator(".node-name", has_text=node.name))
        assert row.locator(".node-state").get_attribute("data-state") == "READY"
        node.refresh_from_db()
        assert node.schedulable and node.drain_mode == ""
    finally:
        node.delete()
