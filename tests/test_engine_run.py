"""Engine.run's `alongside`: the launch's own work done while the real
Docker engine creates the container, always before the container starts;
when that work fails, no container is left behind. And the node's runner
around it: its two retries (an image gone, a default bridge that stopped
isolating) on the real engine."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import docker
import pytest

from jobs.node import launcher
from jobs.node.images import ImageGate, RepositoryRecord
from jobs.node.launcher.docker import DockerEngine
from jobs.node.runner import DefaultNetwork, Runner
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


# ------------------------------------------- the runner's two retries, wired


class _RestartedEngine:
    """The real engine, but for its answers about its default bridge, given
    in turn (the last repeats): as if it were restarted without --icc=false
    between two of them. Scripted at our own interface (launcher.Engine)."""

    def __init__(self, real: DockerEngine, answers: list[str]) -> None:
        self.real, self.answers = real, answers

    def isolating_default_network(self) -> str:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def _runner(engine) -> tuple[Runner, list[dict | None]]:
    """A Runner over `engine` with only what _create_and_start uses; each
    outputDir it makes records the container's state at that moment."""
    runner = Runner.__new__(Runner)
    runner.engine = engine
    runner._default_network = DefaultNetwork(engine)
    runner._images = ImageGate(engine, RepositoryRecord(Path("/nonexistent/private-images")))
    runner._network_locks = [threading.Lock() for _ in range(16)]
    made: list[dict | None] = []
    runner._make_output_dir = lambda ctx: made.append(_state(ctx.name))
    return runner, made


def _not_started(state: dict | None) -> bool:
    """The container's state while outputDir was made: not created yet
    (the create runs alongside) or created and not started."""
    return state is None or (not state["Running"] and state["Status"] == "created")


def _one_task(spec: launcher.ContainerSpec) -> SimpleNamespace:
    return SimpleNamespace(name=spec.name, attempt=SimpleNamespace(ip=""), job=SimpleNamespace(pk=0))


def test_a_task_put_on_a_default_bridge_that_stopped_isolating_starts_on_our_network(docker_engine, own_instance):
    real = DockerEngine(docker_engine)
    if real.isolating_default_network() != "bridge":
        pytest.skip("the engine does not isolate its default bridge (scripts/lib.sh starts it so)")
    engine = _RestartedEngine(real, ["bridge", ""])
    runner, made = _runner(engine)
    assert runner._default_network.choose() == ("bridge", False)
    network, kept = runner._network(_one_task(_spec(own_instance, "bridge")))
    assert (network, kept) == ("bridge", True)
    spec = _spec(own_instance, network)
    container_id = runner._create_and_start(_one_task(spec), spec, kept_answer=kept, ensure_image=lambda: None)
    try:
        found = docker.from_env().api.inspect_container(container_id)
        assert found["State"]["Running"] and list(found["NetworkSettings"]["Networks"]) == [f"{own_instance}-shared"]
        labelled = docker.from_env().containers.list(
            all=True, filters={"label": f"{launcher.LABEL_INSTANCE}={own_instance}"})
        assert [c.id for c in labelled] == [container_id]  # the one made on the bridge is gone
        assert len(made) == 1 and _not_started(made[0])  # outputDir, before the start
    finally:
        real.remove(container_id)
        real.remove_network(f"{own_instance}-shared")


def test_an_image_removed_since_the_node_saw_it_is_made_sure_of_and_outputdir_made_before_the_start(
        docker_engine, own_instance, network):
    real = DockerEngine(docker_engine)
    runner, made = _runner(real)
    spec = _spec(own_instance, network)
    spec.image = f"pai-local/gone-{uuid.uuid4().hex[:8]}:latest"
    client = docker.from_env()
    pulled: list[str] = []

    def ensure_image() -> None:  # what a pull would do: the image is there again
        client.images.get(BUSYBOX_IMAGE).tag(spec.image)
        pulled.append(spec.image)

    try:
        container_id = runner._create_and_start(_one_task(spec), spec, kept_answer=False, ensure_image=ensure_image)
        try:
            assert pulled == [spec.image] and real.state(container_id).running
            assert len(made) == 2 and all(_not_started(state) for state in made)  # before each try's start
        finally:
            real.remove(container_id)
    finally:
        client.images.remove(spec.image)


def test_a_container_left_on_another_network_is_made_again_and_one_on_its_own_adopted(engine, network, own_instance):
    """A container of the task's name from a launch before (an agent that
    crashed, a removal that failed): adopted when made for the task's
    network, removed and made again when made for another, never started
    there."""
    client = docker.from_env()
    other = f"{own_instance}-other"
    engine.ensure_network(other, labels={launcher.LABEL_INSTANCE: own_instance}, isolated=True)
    try:
        spec = _spec(own_instance, network)
        left = client.api.create_container(BUSYBOX_IMAGE, "sleep 60", name=spec.name,
                                           labels={launcher.LABEL_INSTANCE: own_instance},
                                           host_config=client.api.create_host_config(network_mode=other))["Id"]
        made = engine.run(spec)
        try:
            assert made != left and _state(left) is None
            assert docker.from_env().api.inspect_container(made)["HostConfig"]["NetworkMode"] == network
        finally:
            engine.remove(made)
        spec = _spec(own_instance, network)
        kept = client.api.create_container(BUSYBOX_IMAGE, "sleep 60", name=spec.name,
                                           labels={launcher.LABEL_INSTANCE: own_instance},
                                           host_config=client.api.create_host_config(network_mode=network))["Id"]
        try:
            assert engine.run(spec) == kept and engine.state(kept).running
        finally:
            engine.remove(kept)
    finally:
        engine.remove_network(other)


def test_a_multi_task_jobs_launch_after_a_pull_asks_nothing_about_the_default_bridge(docker_engine, own_instance):
    """A task of a job of several runs on the job's own network: the second
    try after an image was made sure of again must not take it for a
    default bridge chosen by a kept answer."""
    real = DockerEngine(docker_engine)
    job_network = f"{own_instance}-jobnet"
    real.ensure_network(job_network, labels={launcher.LABEL_INSTANCE: own_instance})
    runner, made = _runner(real)
    spec = _spec(own_instance, job_network)
    spec.image = f"pai-local/gone-{uuid.uuid4().hex[:8]}:latest"
    client = docker.from_env()
    ctx = SimpleNamespace(name=spec.name, attempt=SimpleNamespace(ip="10.215.0.2"), job=SimpleNamespace(pk=0))
    try:
        container_id = runner._create_and_start(
            ctx, spec, kept_answer=False, ensure_image=lambda: client.images.get(BUSYBOX_IMAGE).tag(spec.image))
        try:
            found = client.api.inspect_container(container_id)
            assert found["State"]["Running"] and found["HostConfig"]["NetworkMode"] == job_network
            assert len(made) == 2  # one try per cause: the image's, and no other
        finally:
            real.remove(container_id)
    finally:
        client.images.remove(spec.image)
        real.remove_network(job_network)
