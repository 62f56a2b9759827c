"""Hosts that are really separate (tests/multihost.py): a portal host
(PostgreSQL, Redis, gunicorn) and node hosts, each a network namespace with
its own Docker engine and node agent, joined by a bridge. Jobs go in through
the REST API; what the API does not show (timestamps, allocations, log rows)
is read from the portal's PostgreSQL.

One cluster is built for the whole file (half a minute to a minute, most
of it the portal's migrations); n3 gets its engine at once but its agent
only when a test starts it. Nodes join with scripts/join-node and a join
token, as the README tells an admin to.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests import services as test_services
from tests.cluster import wait_for
from tests.helpers import config, login, role
from tests.multihost import TIMINGS, Api, MultiHostCluster, multihost_cluster
from tests.task_hosts import TaskHostClient, follow_to_task_host, port_spec

pytestmark = [pytest.mark.services, pytest.mark.multihost]

USER = "mh_user"
GPU_TYPE = "MH"
# Each node host offers one simulated GPU of this type; n3, the late one, two.


@pytest.fixture(scope="module")
def mh() -> Iterator[MultiHostCluster]:
    if os.geteuid() != 0:
        test_services.unavailable("root (network namespaces, dockerd, iptables)")
    for program in ("dockerd", "redis-server", "nsenter", "unshare", "ip", "iptables", "setpriv"):
        test_services.need(program)
    if not shutil.which("/usr/lib/postgresql/15/bin/postgres"):
        test_services.unavailable("PostgreSQL 15 (/usr/lib/postgresql/15/bin/postgres)")
    test_services.need_docker()  # the local images come from the machine's engine
    try:
        with multihost_cluster(["n1", "n2"], late=["n3"], gpus={"n3": 2}, users=[USER]) as cluster:
            yield cluster
    finally:  # shown with -s: where the build and tear-down spend their time
        print("\nmulti-host cluster:", ", ".join(f"{step} {seconds:.1f} s" for step, seconds in TIMINGS))


def api(mh: MultiHostCluster) -> Api:
    return mh.apis[USER]


def attempts(mh: MultiHostCluster, job_name: str) -> list[dict[str, Any]]:
    assert mh.db is not None
    job = mh.db.job(USER, job_name)
    assert job is not None, f"no job {job_name}"
    return mh.db.task_attempts(job["id"])


def describe(mh: MultiHostCluster, job_name: str) -> str:
    """The job's tasks and their first log lines, for failure messages."""
    out = []
    for attempt in attempts(mh, job_name):
        out.append(f"  {attempt['role']}-{attempt['index']} #{attempt['number']} on {attempt['node_name']}: "
                   f"{attempt['state']} {attempt['exit_reason']}")
        for stream in (1, 2):
            out += [f"    [{stream}] {line}" for line in mh.db.log_lines(attempt["id"], stream)[:10]]
    return "\n".join(out)


def finished(mh: MultiHostCluster, job_name: str, *, timeout: float = 90) -> dict[str, Any]:
    job = api(mh).wait_state(job_name, "SUCCEEDED", "FAILED", "STOPPED", timeout=timeout)
    assert job["jobStatus"]["state"] == "SUCCEEDED", f"{job['jobStatus']}\n{describe(mh, job_name)}"
    return job


def started_containers(mh: MultiHostCluster, host: str, since: datetime) -> set[str]:
    """Ids of the containers host's engine started since `since` (its events:
    the containers themselves are removed when their task ends)."""
    # Docker takes whole seconds: `until` a second ahead, or a start within
    # the current second is cut off (seen when the job ended quickly).
    until = datetime.now(timezone.utc) + timedelta(seconds=1)
    events = mh.nodes[host].engine.client().events(since=since, until=until, decode=True,
                                                   filters={"type": "container", "event": "start"})
    return {event["id"] for event in events}


# ------------------------------------------------------------- scenario 1


def test_it_runs_two_tasks_on_two_hosts_that_talk_over_tcp(mh):
    # One simulated GPU per node host and one per task: the two tasks must
    # land on different hosts, so task 1 reaches task 0 only through the
    # node's address and published port (PAI_HOST_IP_*, PAI_PORT_LIST_*).
    begin = datetime.now(timezone.utc)
    command = (
        'if [ "$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX" = 0 ]; then '
        '  nc -l -p "$PAI_CONTAINER_HOST_talk_PORT_LIST" -e sh -c \'read msg; echo "$msg" > /tmp/got; echo ack\' '
        '  && echo "server got: $(cat /tmp/got)"; '
        'else '
        '  for i in $(seq 300); do '
        '    r=$(echo "hello from $PAI_CONTAINER_HOST_IP" | nc -w 2 "$PAI_HOST_IP_peer_0" "$PAI_PORT_LIST_peer_0_talk") '
        '    && [ "$r" = ack ] && echo "client got: $r from $PAI_HOST_IP_peer_0:$PAI_PORT_LIST_peer_0_talk" && exit 0; '
        '    sleep 0.2; '
        '  done; exit 1; '
        'fi')
    api(mh).submit(config("talk", role("peer", command, tasks=2, gpus=1, portList=port_spec("talk")),
                          gpuType=GPU_TYPE))
    finished(mh, "talk")

    server, client = attempts(mh, "talk")
    assert {server["node_name"], client["node_name"]} == {"mh-n1", "mh-n2"}
    by_node = {node.node_name: node for node in mh.nodes.values()}
    server_host = by_node[server["node_name"]].host.address
    client_host = by_node[client["node_name"]].host.address
    assert (server["host_ip"], client["host_ip"]) == (server_host, client_host)
    port = server["ports"]["talk"][0]
    assert mh.db.log_lines(server["id"]) == [f"server got: hello from {client_host}"]
    assert mh.db.log_lines(client["id"]) == [f"client got: ack from {server_host}:{port}"]
    # Each container ran on its own host's engine, and only there.
    for attempt, host in ((server, by_node[server["node_name"]]), (client, by_node[client["node_name"]])):
        other = next(n for n in ("n1", "n2") if mh.nodes[n] is not host)
        assert attempt["container_id"] in started_containers(mh, host.host.name, begin)
        assert attempt["container_id"] not in started_containers(mh, other, begin)


# ------------------------------------------------------------- scenario 2


def test_it_retries_the_job_of_a_host_cut_off_and_the_host_back_stops_its_container(mh):
    # The first attempt runs until it is cut off, and ignores SIGTERM (it
    # takes the stop's grace period to end); the retry just finishes.
    command = ('if [ "$PAI_JOB_ATTEMPT" = 1 ]; then trap "" TERM; echo first; exec sleep 600; fi; '
               'echo "finished on $PAI_CONTAINER_HOST_IP"')
    api(mh).submit(config("cut", role(command=command, gpus=1), gpuType=GPU_TYPE, retryCount=1))
    first = wait_for(lambda: next((a for a in attempts(mh, "cut") if a["state"] == "RUNNING"
                                   and mh.db.log_lines(a["id"]) == ["first"]), None),
                     timeout=60, what="the first attempt to run")
    lost = next(node for node in mh.nodes.values() if node.node_name == first["node_name"])
    other = next(node for node in mh.nodes.values() if node.agent and node is not lost)
    lost.host.link(up=False)
    try:
        finished(mh, "cut")
        # The portal gave the host up for lost; the agent there, cut off,
        # still runs the first attempt's container.
        assert mh.db.node(lost.node_name)["status"] == "LOST"
        assert lost.engine.client().containers.get(first["container_id"]).status == "running"
    finally:
        lost.host.link(up=True)

    failed, retried = attempts(mh, "cut")
    assert (failed["number"], failed["state"], failed["exit_type"]) == (1, "FAILED", "NODE_LOST")
    assert f"node {lost.node_name} was lost" in failed["exit_reason"]
    assert (retried["number"], retried["node_name"], retried["state"]) == (2, other.node_name, "SUCCEEDED")
    assert mh.db.log_lines(retried["id"]) == [f"finished on {other.host.address}"]

    # Back on the network, the agent stops the orphan of the failed attempt;
    # until it has, the node stays lost: nothing new may be given the GPU
    # and ports the orphan still holds.
    ready_while_orphan_ran = []

    def orphan_gone() -> bool:
        import docker

        status = mh.db.node(lost.node_name)["status"]  # read first: READY must mean gone already
        try:
            running = lost.engine.client().containers.get(first["container_id"]).status == "running"
        except docker.errors.NotFound:
            running = False
        if running and status == "READY":
            ready_while_orphan_ran.append(datetime.now(timezone.utc))
        return not running

    wait_for(orphan_gone, timeout=60, what=f"the agent of {lost.node_name} to stop the orphaned container")
    assert ready_while_orphan_ran == []
    mh.wait_node_ready(lost.host.name, since=datetime.now(timezone.utc))
    # Its late report of the container's end changed nothing: the attempt
    # ended once, as "node lost", and no third attempt was made.
    ended = ("state", "exit_type", "exit_code", "exit_reason", "finished_at")
    now = attempts(mh, "cut")
    assert len(now) == 2 and {key: now[0][key] for key in ended} == {key: failed[key] for key in ended}
    # Both hosts' GPUs and ports can be given out again, to one job; then
    # nothing at all is held (no job runs): nothing was freed twice or kept.
    api(mh).submit(config("after-cut", role(command="echo ok", tasks=2, gpus=1), gpuType=GPU_TYPE))
    finished(mh, "after-cut")
    assert {a["node_name"] for a in attempts(mh, "after-cut")} == {"mh-n1", "mh-n2"}
    held = mh.db.rows("SELECT 'gpu' AS kind, node_id, attempt_id FROM jobs_gpuallocation "
                      "UNION ALL SELECT 'port', node_id, attempt_id FROM jobs_portallocation")
    assert held == []


# ------------------------------------------------------------- scenario 5


def test_it_starts_waiting_jobs_within_2_s_of_a_joining_nodes_first_heartbeat(mh):
    # n1 and n2 are kept busy, so the cluster has no room for more.
    api(mh).submit(config("hold", role(command="exec sleep 600", tasks=2, gpus=1), gpuType=GPU_TYPE))
    api(mh).wait_state("hold", "RUNNING")
    waiting = ["wait-0", "wait-1"]
    for name in waiting:
        api(mh).submit(config(name, role(command="echo started on $PAI_CONTAINER_HOST_IP", gpus=1),
                              gpuType=GPU_TYPE))
    for name in waiting:  # a pass looked at them and found no room
        wait_for(lambda: f"0 GPUs of type {GPU_TYPE}" in mh.db.job(USER, name)["waiting_reason"],
                 what=f"{name} to wait for a GPU")
        assert api(mh).job(name)["jobStatus"]["state"] == "WAITING"

    late = mh.nodes["n3"]
    mh.start_agent("n3")
    node = mh.wait_node_ready("n3")
    try:
        for name in waiting:
            finished(mh, name)
        # The node's first heartbeat is its registration. A job starts when
        # it leaves WAITING: placed on a node (assigned_at), RUNNING. Its
        # container then starts on that node's engine; the engine's pace
        # (containers of one node are launched one after the other) is
        # reported, not bounded.
        joined = node["registered_at"]
        started = {name: attempts(mh, name)[0] for name in waiting}
        times = "; ".join(f"{name} placed +{(a['assigned_at'] - joined).total_seconds():.3f} s, container started "
                          f"+{(a['started_at'] - joined).total_seconds():.3f} s" for name, a in started.items())
        for name, attempt in started.items():
            assert attempt["node_name"] == late.node_name
            assert joined <= attempt["assigned_at"] <= joined + timedelta(seconds=2), times
            assert attempt["assigned_at"] <= attempt["started_at"], times
            assert mh.db.log_lines(attempt["id"]) == [f"started on {late.host.address}"]
        print(f"node joined -> {times}")
    finally:
        api(mh).stop("hold")


# ------------------------------------------- a web port on another host


def test_it_serves_a_tasks_web_port_on_another_host_through_the_portals_proxy(mh):
    owner_api = api(mh)
    command = ('mkdir -p /www && echo "served by $PAI_CURRENT_TASK_ROLE_NAME on $PAI_CONTAINER_HOST_IP" > /www/index.html'
               ' && exec httpd -f -p "$PAI_CONTAINER_HOST_http_PORT_LIST" -h /www')
    owner_api.submit(config("web", role(command=command, portList=port_spec("http"))))
    attempt = wait_for(lambda: next((a for a in attempts(mh, "web") if a["state"] == "RUNNING"), None),
                       timeout=60, what="the web task to run")
    node = next(node for node in mh.nodes.values() if node.node_name == attempt["node_name"])
    port = attempt["ports"]["http"][0]
    try:
        # Published on the node's loopback only: not on its address.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((node.host.address, port), timeout=10).close()
        # The owner, signed in to the portal, goes through its proxy, which
        # reaches the node host's forwarder over the network.
        owner = login(mh.portal.base_url, owner_api)
        link = f"/jobs/{mh.db.job(USER, 'web')['id']}/tasks/{attempt['id']}/ports/{port}/"
        client, landing = follow_to_task_host(owner, mh.portal.base_url, link)
        page = wait_for(lambda: (r := client.get(landing)).status_code == 200 and r, timeout=30,
                        what="the task's web server to answer through the proxy")
        assert page.text == f"served by main on {node.host.address}\n"
        # Without the proxy's cookie, the task host is closed.
        assert TaskHostClient(client.base_url, client.host).get(landing).status_code == 403
    finally:
        owner_api.stop("web")


def test_a_node_engine_as_docker_comes_is_not_taken_for_an_isolating_one(mh):
    """A node host's dockerd with Docker's own default bridge (traffic
    between containers on, a bridge the firewall does not match): its one-task
    jobs go on our shared network (settings.SINGLE_TASK_NETWORK), never on
    that bridge, whose containers all reach each other."""
    from jobs.node import launcher

    assert launcher.engine_for(mh.nodes["n1"].engine.socket).isolating_default_network() == ""


def test_a_launch_on_a_kept_answer_about_the_default_bridge_asks_again_before_its_start(mh):
    """DefaultNetwork (jobs/node/runner.py) keeps an engine's answer for the
    next launch, which asks again while its container is created: when the
    engine now answers as Docker comes (n1's, standing for the same engine
    restarted without --icc=false), the task does not start on its bridge."""
    from django.conf import settings

    from jobs.node import launcher
    from jobs.node.runner import DefaultNetwork, DefaultNetworkChanged

    kept = DefaultNetwork(launcher.engine_for(settings.DOCKER_HOST))  # started isolating: test_scripts.py
    assert kept.choose() == ("bridge", False)
    assert kept.choose() == ("bridge", True)
    kept.check("bridge")
    kept.engine = launcher.engine_for(mh.nodes["n1"].engine.socket)
    with pytest.raises(DefaultNetworkChanged):
        kept.check("bridge")
    assert kept.choose() == ("", True)  # the next launch goes on our network
    kept.check("")  # which is safe whatever the engine says
