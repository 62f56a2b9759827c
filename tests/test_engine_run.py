"""Engine.run's `alongside`: the launch's own work done while the real
Docker engine creates the container, always before the container starts;
when that work fails, no container is left behind."""

from __future__ import annotations

import time
import uuid

import docker
import pytest

from jobs.node import launcher
from jobs.node.launcher.docker import DockerEngine
from tests.helpers import BUSYBOX_IMAGE

pytestmark = pytest.mark.services


def _spec(own_instance: str, network: str) -> launcher.ContainerSpec:
    return launcher.ContainerSpec(
        name=f"{own_instance}-run-{uuid.uuid4().hex[:8]}", image=BUSYBOX_IMAGE, command="sleep 60", env={},
        labels={launcher.LABEL_INSTANCE: own_instance}, hostname="main-0", cpus=1, memory_mb=64, shm_mb=0, ports=[],
        bind_address="127.0.0.1", network=network,
    )


def _state(name: str) -> dict | None:
    try:
        return docker.from_env().api.inspect_container(name)["State"]
    except docker.errors.NotFound:
        return None


@pytest.fixture
def engine(docker_engine: str) -> DockerEngine:
    return DockerEngine(docker_engine)


@pytest.fixture
def network(engine: DockerEngine, own_instance: str):
    # The engine's default bridge when it isolates (as the tests' dockerd
    # is started), else an isolated network of the test's own.
    default = engine.isolating_default_network()
    if default:
        yield default
        return
    name = f"{own_instance}-net"
    engine.ensure_network(name, labels={launcher.LABEL_INSTANCE: own_instance}, isolated=True)
    yield name
    engine.remove_network(name)


def test_alongside_runs_while_the_container_is_created_and_before_it_starts(engine, network, own_instance):
    spec = _spec(own_instance, network)
    seen: list[dict] = []

    def alongside() -> None:
        # Wait for the create under way in the engine's other thread: the
        # container then exists, and has not started.
        deadline = time.monotonic() + 30
        while (state := _state(spec.name)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state is not None, "the container was not created while alongside ran"
        seen.append(state)

    container_id = engine.run(spec, alongside=alongside)
    try:
        assert seen and seen[0]["Status"] == "created" and not seen[0]["Running"]
        assert engine.state(container_id).running
    finally:
        engine.remove(container_id)


def test_a_failing_alongside_leaves_no_container_and_its_error_is_raised(engine, network, own_instance):
    spec = _spec(own_instance, network)

    def alongside() -> None:
        raise launcher.LaunchError("PLATFORM", "outputDir could not be made")

    with pytest.raises(launcher.LaunchError, match="outputDir could not be made"):
        engine.run(spec, alongside=alongside)
    assert _state(spec.name) is None
    labelled = docker.from_env().containers.list(all=True, filters={"label": f"{launcher.LABEL_INSTANCE}={own_instance}"})
    assert labelled == []


def test_a_missing_image_is_told_after_alongside_ran(engine, network, own_instance):
    spec = _spec(own_instance, network)
    spec.image = f"pai-local/absent-{uuid.uuid4().hex[:8]}:latest"
    ran: list[bool] = []
    with pytest.raises(launcher.ImageMissing):
        engine.run(spec, alongside=lambda: ran.append(True))
    assert ran == [True] and _state(spec.name) is None
