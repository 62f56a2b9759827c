"""How the node agent launches task containers, where a job's image or
config is hostile: a private image's record, the firewall's metadata
addresses, where ports are published, task volumes, and what a short
command in a task's container may make the agent hold. No Docker engine:
the engine's client is replaced by fakes (or the real SDK over a socket
pair); tests/security/test_private_images.py and test_container_isolation.py
run the same against real engines."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
import time

import docker
import pytest

from jobs.node.images import ImageGate, RepositoryRecord
from jobs.node.launcher import LaunchError, RegistryAuth, firewall
from jobs.node.launcher.docker import DockerEngine
from jobs.node.runner import _bind_address


# --------------------------------------------------------------------------
# A private image was on the node, unrecorded, between its pull and
# RepositoryRecord.add (ImageGate.ensure): another job could start it with no
# credentials, and an agent that died in that window left it unrecorded.

PRIVATE = "203.0.113.5:5000/team/private:1"


class _Engine:
    """The engine as ImageGate sees it: the registry refuses anonymous
    requests; while ImageGate asks it so (`_anyone_may_pull`, after the
    pull), another launch thread makes sure of the same image for a job
    without credentials."""

    def __init__(self) -> None:
        self.images: set[str] = set()
        self.during_check = None
        self.outcome: list[str] = []

    def has_image(self, image: str) -> bool:
        return image in self.images

    def has_registry_digest(self, image: str) -> bool:
        return image in self.images  # each came from the registry

    def ensure_image(self, image, auth=None, *, progress=None, stall_seconds=None, max_mb=None,
                     max_seconds=None, max_unpacked_mb=None, min_free_mb=None) -> bool:
        if auth is None:
            raise LaunchError("IMAGE_PULL", "unauthorized")
        self.images.add(image)
        return True

    def check_image_access(self, image, auth) -> None:
        if auth is None:
            if self.during_check is not None:
                other, self.during_check = self.during_check, None
                try:
                    other()
                    self.outcome.append("started without credentials")
                except LaunchError:
                    self.outcome.append("refused")
            raise LaunchError("IMAGE_PULL", "unauthorized: authentication required")


def test_a_private_image_is_recorded_before_its_pull_ends(tmp_path):
    engine = _Engine()
    gate = ImageGate(engine, RepositoryRecord(tmp_path / "private"))  # type: ignore[arg-type]
    allowed = ["203.0.113.5:5000"]
    engine.during_check = lambda: gate.ensure(PRIVATE, None, allowed=allowed, note=lambda _t: None)  # bob
    gate.ensure(PRIVATE, RegistryAuth("203.0.113.5:5000", "alice", "pw"), allowed=allowed,
                note=lambda _t: None)  # alice's pull
    assert PRIVATE in gate.private
    assert engine.outcome == ["refused"], "bob's job (no credentials) started alice's private image"


# --------------------------------------------------------------------------
# The task firewall rejected 169.254.0.0/16 only: Alibaba Cloud's metadata
# service (100.100.100.200, in the shared 100.64/10) stayed reachable from
# every task container, with the instance's RAM-role credentials.

def test_the_task_firewall_rejects_alibabas_metadata_address_too():
    metadata = ipaddress.ip_address("100.100.100.200")
    rejected = []
    for chain, rule in firewall._rules("review"):
        if chain == "DOCKER-USER" and rule[-1] == "REJECT" and "-d" in rule:
            rejected.append(ipaddress.ip_network(rule[rule.index("-d") + 1]))
    assert any(metadata in network for network in rejected), rejected


# --------------------------------------------------------------------------
# A node whose --address was a host name published every non-web task port
# on 0.0.0.0: on every address of the machine, the portal's own included on
# its machine, where browsers send a job's port the portal's session cookie.

def test_a_node_named_by_host_name_publishes_on_its_address_not_every_interface():
    assert _bind_address("127.0.0.2") == "127.0.0.2"
    assert _bind_address("localhost") == "127.0.0.1"
    with pytest.raises(LaunchError, match="does not resolve"):
        _bind_address("no-such-node.invalid")


# --------------------------------------------------------------------------
# Containers were removed without their anonymous volumes: an image's
# VOLUME (postgres, mysql, or one made for it) left a volume, with whatever
# the task wrote there, on the node's disk for good, uncounted.

class _RemovingApi:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def remove_container(self, *args, **kwargs) -> None:
        self.calls.append((args, kwargs))


def test_removing_a_task_container_removes_its_anonymous_volumes():
    engine = DockerEngine("unix:///nonexistent")
    api = _RemovingApi()
    engine._local.api = api
    engine.remove("c0ffee")
    assert api.calls and api.calls[0][1].get("v") is True, api.calls


# --------------------------------------------------------------------------
# The sshd probe (TaskWatcher._probe_ssh -> DockerEngine.exec_status) runs
# the image's /bin/sh on one of the node's shared helper threads, and kept
# all it printed in the agent's memory, with no bound and no deadline.

class _Response:
    status_code = 200
    text = ""

    def close(self) -> None:
        pass

    def raise_for_status(self) -> None:
        pass


class _ExecApi(docker.APIClient):
    """The real SDK's exec_start over a socket pair standing for the
    engine's hijacked connection; the exec prints without end."""

    def __init__(self) -> None:
        super().__init__(base_url="unix:///nonexistent", version="1.41")
        self.engine_side, self.agent_side = socket.socketpair()
        self.sent = 0

    def exec_create(self, container, cmd, **kwargs):
        return {"Id": "exec1"}

    def _post_json(self, url, data, **kwargs):
        if not data.get("Detach"):  # an attached exec: the engine streams what it prints
            threading.Thread(target=self._print_forever, daemon=True).start()
        return _Response()

    def _get_raw_response_socket(self, response):
        return self.agent_side

    def _print_forever(self) -> None:
        frame = struct.pack(">BxxxL", 1, 1 << 20) + b"y\n" * (1 << 19)
        try:
            while self.sent < 64 << 20:  # stop at 64 MB: enough to show it, cheap for the machine
                self.engine_side.sendall(frame)
                self.sent += len(frame)
        except OSError:
            pass
        finally:
            self.engine_side.close()

    def exec_inspect(self, exec_id):
        return {"ExitCode": 0}


def test_a_short_command_in_a_task_never_makes_the_agent_hold_its_output():
    engine = DockerEngine("unix:///nonexistent")
    api = _ExecApi()
    engine._local.api = api
    started = time.monotonic()
    assert engine.exec_status("c0ffee", ["/bin/sh", "-c", "test -x /usr/sbin/sshd"]) == 0
    api.agent_side.close()
    # Whatever a fix does (a deadline, reading at most a little, detaching),
    # the agent must not take in tens of megabytes from the task.
    assert api.sent < 8 << 20, f"the agent read {api.sent >> 20} MB of the probe's output " \
                               f"in {time.monotonic() - started:.1f} s, all kept in memory"


class _NeverEndingExec:
    def exec_create(self, container, cmd, **kwargs):
        assert kwargs == {"stdout": False, "stderr": False}  # nothing it prints comes back to the agent
        return {"Id": "exec1"}

    def exec_start(self, exec_id, **kwargs):
        assert kwargs == {"detach": True}

    def exec_inspect(self, exec_id):
        return {"Running": True, "ExitCode": None}


def test_a_short_command_that_never_ends_is_given_up_on(monkeypatch):
    """A /bin/sh that never ends (or trickles output) held one of the
    agent's helper threads for good."""
    from jobs.node.launcher import docker as docker_launcher

    monkeypatch.setattr(docker_launcher, "EXEC_STATUS_SECONDS", 0.2)
    engine = DockerEngine("unix:///nonexistent")
    engine._local.api = _NeverEndingExec()
    started = time.monotonic()
    assert engine.exec_status("c0ffee", ["/bin/sh", "-c", "test -x /usr/sbin/sshd"]) is None
    assert time.monotonic() - started < 2
