"""Findings 2 and 5, from another user's container on another node: what
stays directly reachable on a node's address.

SSH keeps its direct port and its keys (finding 2): another user's
container reaches a task's SSH port at the node's address, and only the
owner's keys log in. A port the owner published (finding 5) is reached as
the node's published port, at the node's address. On the same node,
Docker's isolation of networks drops even those, and a task's own address
is closed to other users' containers: test_container_isolation.py.

Containers of one engine cannot reach their node's address (on this
machine's single-node cluster it is 127.0.0.2, their own loopback), so two
nodes run here as two hosts, each a network namespace with its own Docker
engine (tests/multihost.py). One simulated GPU each, one per job: the owner's
task and the prober land on different nodes."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import services as test_services
from tests.cluster import wait_for
from tests.helpers import DEBIAN_IMAGE, config, login, role
from tests.settings import TEST_VAR
from tests.task_hosts import port_spec

pytestmark = [pytest.mark.services, pytest.mark.multihost]

OWNER, OTHER = "mh_sshowner", "mh_sshother"
GPU_TYPE = "MH"  # tests/multihost.py's node hosts
SERVICE = "svc"  # a non-web label: published on the node's address
# The owner's task: a marker only its own container holds, and a page on its
# published port.
SERVE = (f"echo owners-container > /tmp/marker && mkdir /www && echo owners-service > /www/index.html && cd /www && "
         f"exec python3 -m http.server $PAI_CONTAINER_HOST_{SERVICE}_PORT_LIST")
SSH_OPTIONS = ("-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=10 "
               "-o IdentitiesOnly=yes -o LogLevel=ERROR")


def _debian_tar() -> Path:
    """The Debian image (sshd and an SSH client), saved from this machine's
    engine for the node hosts' engines (tests/multihost.py loads busybox only)."""
    path = TEST_VAR / "multihost-debian.tar"
    if not path.exists():
        partial = path.with_suffix(".partial")
        subprocess.run(["docker", "save", "-o", str(partial), DEBIAN_IMAGE], check=True, timeout=300)
        partial.rename(path)
    return path


@pytest.fixture(scope="module")
def two_nodes():
    from tests.multihost import multihost_cluster

    for program in ("dockerd", "redis-server", "nsenter", "unshare", "ip", "iptables", "setpriv", "ssh"):
        test_services.need(program)
    if not shutil.which("/usr/lib/postgresql/15/bin/postgres"):
        test_services.unavailable("PostgreSQL 15 (/usr/lib/postgresql/15/bin/postgres)")
    test_services.need_docker()
    images = _debian_tar()
    try:
        with multihost_cluster(["n1", "n2"], users=[OWNER, OTHER]) as mh:
            loads = [(name, node.engine.load(images)) for name, node in mh.nodes.items()]
            for name, load in loads:
                _, errors = load.communicate(timeout=300)
                assert load.returncode == 0, f"docker load on {name}: {errors}"
            yield mh
    finally:
        images.unlink(missing_ok=True)


def _node_address(mh, node_name: str) -> str:
    return next(node.host.address for node in mh.nodes.values() if node.node_name == node_name)


def _job_key(mh, username: str, job_name: str) -> str:
    """A job's SSH private key, as its owner downloads it from the job page."""
    job = mh.db.job(username, job_name)
    key = login(mh.portal.base_url, mh.apis[username]).get(f"{mh.portal.base_url}/jobs/{job['id']}/ssh-key/")
    assert key.status_code == 200 and "OPENSSH PRIVATE KEY" in key.text
    return key.text


def _written(text: str, path: str) -> str:
    """Shell that writes `text` to `path`, mode 0600 (a key in a command)."""
    return f"echo {base64.b64encode(text.encode()).decode()} | base64 -d > {path} && chmod 600 {path}"


@pytest.fixture(scope="module")
def owners_task(two_nodes):
    """The owner's running task: (its attempt row, its node's address, the
    job's SSH private key as the owner downloads it from the job page)."""
    mh = two_nodes
    api = mh.apis[OWNER]
    api.submit(config("sshowner", role(command=SERVE, gpus=1, portList=port_spec(SERVICE)), image=DEBIAN_IMAGE,
                      gpuType=GPU_TYPE))
    api.wait_state("sshowner", "RUNNING", timeout=120)
    job = mh.db.job(OWNER, "sshowner")
    attempt = wait_for(lambda: next((a for a in mh.db.task_attempts(job["id"]) if a["ssh_available"]), None),
                       timeout=60, what="sshd to be found in the owner's task")
    yield attempt, _node_address(mh, attempt["node_name"]), _job_key(mh, OWNER, "sshowner")
    api.stop("sshowner")


@pytest.fixture(scope="module")
def probe(two_nodes, owners_task):
    """What another user's task on the other node saw: a login with the
    owner's key (polled until sshd answers), with the key of another job of
    its user and a key of its own, and the owner's published port at the
    node's address."""
    mh = two_nodes
    attempt, node, owners_key = owners_task
    ssh_port, service_port = attempt["ports"]["ssh"][0], attempt["ports"][SERVICE][0]
    ssh = f"ssh {SSH_OPTIONS} -p {ssh_port}"
    api = mh.apis[OTHER]
    api.submit(config("otherjob", role(command="true")))  # its key: one of the other user's job keys
    command = (
        f"{_written(owners_key, '/tmp/owners.key')} && {_written(_job_key(mh, OTHER, 'otherjob'), '/tmp/others.key')} && "
        "ssh-keygen -q -t ed25519 -N '' -f /tmp/mine && "
        # sshd was found in the owner's task; poll, with a deadline, until it answers.
        f"for i in $(seq 60); do got=$({ssh} -i /tmp/owners.key root@{node} cat /tmp/marker) && break; sleep 0.5; done; "
        "echo \"owners key: $got\"; "
        "for key in /tmp/others.key /tmp/mine; do "
        f"{ssh} -i $key root@{node} cat /tmp/marker 2>&1 | grep -q 'Permission denied' "
        "&& echo \"$key: denied\" || echo \"$key: not denied\"; done; "
        f"echo \"published port: $(curl -s --max-time 10 http://{node}:{service_port}/)\"")
    api.submit(config("sshprobe", role(command=command, gpus=1), image=DEBIAN_IMAGE, gpuType=GPU_TYPE))
    job = api.wait_state("sshprobe", "SUCCEEDED", "FAILED", "STOPPED", timeout=180)
    prober = mh.db.task_attempts(mh.db.job(OTHER, "sshprobe")["id"])[-1]
    logs = mh.db.log_lines(prober["id"])
    assert job["jobStatus"]["state"] == "SUCCEEDED", (job["jobStatus"], logs, mh.db.log_lines(prober["id"], 2))
    assert prober["node_name"] != attempt["node_name"], "the prober must run on the other node"
    return logs


def test_another_users_container_reaches_the_ssh_port_and_only_the_owners_key_logs_in(owners_task, probe, tmp_path):
    assert probe[:3] == ["owners key: owners-container", "/tmp/others.key: denied", "/tmp/mine: denied"]
    # An anonymous client (this machine, off every node) gets the same answer.
    attempt, node, _key = owners_task
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    refused = subprocess.run(["ssh", *SSH_OPTIONS.split(), "-i", str(stranger), "-p", str(attempt["ports"]["ssh"][0]),
                              f"root@{node}", "cat /tmp/marker"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr


def test_another_users_container_reaches_a_published_port_as_the_nodes_port(probe):
    assert probe[3:] == ["published port: owners-service"]
