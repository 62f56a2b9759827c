"""A node agent's start against the real Docker engine, Redis, iptables and
database: what another agent of the same engine does meanwhile must not
stop it, and a start that fails after the node is registered must not leave
the node open to placements nor the agent's firewall rules behind (seen in
CI: an agent gone, its rules still installed)."""

from __future__ import annotations

import os
import signal
import socket
import uuid

import docker
import pytest

from jobs import queues, services
from jobs.models import Node
from jobs.node import agent as agent_module
from jobs.node import launcher
from jobs.node.holders import this_process
from jobs.node.launcher import firewall
from jobs.node.launcher.docker import DockerEngine

pytestmark = pytest.mark.services


def test_listing_networks_skips_one_removed_between_the_list_and_its_inspection(docker_engine, own_instance,
                                                                                monkeypatch):
    client = docker.from_env()
    labels = {launcher.LABEL_INSTANCE: own_instance}
    kept = client.networks.create(f"{own_instance}-kept", labels=labels)
    gone = client.networks.create(f"{own_instance}-gone", labels=labels)
    try:
        engine = DockerEngine(docker_engine)
        inspect = engine.api.inspect_network

        def removed_first(net_id: str, *args, **kwargs) -> dict:
            # As another agent of this engine does in its reconciliation,
            # or a watcher at its task's end, right after our list.
            if net_id == gone.id:
                client.api.remove_network(net_id)
            return inspect(net_id, *args, **kwargs)

        monkeypatch.setattr(engine.api, "inspect_network", removed_first)
        assert engine.networks(labels) == [(kept.name, labels, 0)]
    finally:
        for network in (kept, gone):
            try:
                network.remove()
            except docker.errors.NotFound:
                pass


class _FailingAgent(agent_module.NodeAgent):
    """Fails where a real start can, after the node is registered (its first
    reconciliation talks to the engine and the database)."""

    def reconcile(self, *, fresh_start: bool = False) -> None:
        raise RuntimeError("the engine went away")


@pytest.fixture
def restored_signals():
    # The agent takes SIGTERM and SIGINT over as it starts; this is pytest's process.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    current = agent_module._current
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    agent_module._current = current


def test_an_agent_whose_start_fails_after_registering_leaves_the_node_and_removes_its_firewall(
        docker_engine, own_instance, restored_signals):
    name = f"t-start-fail-{uuid.uuid4().hex[:6]}"
    engine = DockerEngine(docker_engine)
    info = services.NodeInfo(name=name, address="127.0.0.2", docker_host=docker_engine, engine_id="test", cpus=2,
                             memory_mb=1024, gpus=[{"index": 0, "type": "STARTFAIL"}], gpus_simulated=True,
                             port_start=29900, port_end=29909, agent_pid=os.getpid(), agent_host=socket.gethostname(),
                             engine_marker=engine.engine_marker())
    agent = _FailingAgent(info, engine, engine_cpus=2)
    owner = this_process()
    try:
        with pytest.raises(RuntimeError, match="the engine went away"):
            agent.start()
        node = Node.objects.get(name=name)
        assert node.agent_pid is None  # left: no task is placed where no agent launches it
        assert queues.connection().get(agent._lock_key) is None
        assert owner not in firewall.installed_owners()  # no task of ours runs: the rules went with us
        assert not agent.writer._thread.is_alive()
    finally:
        firewall.remove(owner)
        Node.objects.filter(name=name).delete()
