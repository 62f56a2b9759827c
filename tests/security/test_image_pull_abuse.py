"""Pulls other users can abuse (findings 40 and 41).

Finding 40: a pull from a registry that stops sending, mid-download, never
ended (dockerd has no deadline for a layer's body), and its launch waited
for it: a node launches LAUNCH_THREADS tasks at once, so one user's job of
that many tasks on a registry of theirs that hangs held every launch of the
node, every other user's included, for good.

Against a real registry (Debian's docker-registry on loopback) frozen with
SIGSTOP once the node has begun to download the image's big layer: the
kernel keeps the connection open and nothing more ever arrives, as from a
registry that hangs on purpose."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import docker
import docker.errors
import pytest

from jobs.models import ExitType, ImagePull, State
from jobs.node.runner import LAUNCH_THREADS
from tests.cluster import wait_for
from tests.helpers import BUSYBOX_IMAGE, config, lines, role, submit, wait_state
from tests.registry import frozen, registry_agent, running_registry

pytestmark = pytest.mark.services

NODE, GPU_TYPE = "t-node-pullabuse", "PULLABUSE"
STALL_SECONDS = 4
LAYER_MB = 800  # long enough to download (seconds on loopback) that the registry is frozen mid-way


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[str]:
    with running_registry(tmp_path_factory.mktemp("abuse-registry")) as address:
        yield address


def forget(image: str) -> None:
    api = docker.from_env().api

    def removed() -> bool:
        try:
            api.remove_image(image)
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError:
            return False  # a container still uses it
        return True

    wait_for(removed, timeout=60, what=f"{image} to be removable")


@pytest.fixture(scope="module")
def big_image(registry) -> Iterator[str]:
    """<registry>/abuse/big:latest, busybox and a layer of LAYER_MB MB of
    random bytes, in the registry only."""
    image = f"{registry}/abuse/big:latest"
    subprocess.run(["docker", "build", "-q", "-t", image, "-"], text=True, check=True, capture_output=True,
                   input=f"FROM {BUSYBOX_IMAGE}\nRUN head -c {LAYER_MB * 1000 * 1000} /dev/urandom > /layer\n",
                   timeout=600)
    try:
        events = list(docker.from_env().api.push(image, stream=True, decode=True))
        assert not [e for e in events if e.get("error")], events
        forget(image)
        yield image
    finally:
        forget(image)


@pytest.fixture(scope="module")
def abuse_node(cluster, registry) -> Iterator[str]:
    """Room for one user's LAUNCH_THREADS tasks and one task of another's."""
    with registry_agent(cluster, registry, NODE, gpus=LAUNCH_THREADS + 1, gpu_type=GPU_TYPE,
                        env={"IMAGE_PULL_STALL_SECONDS": str(STALL_SECONDS)}) as name:
        yield name


@pytest.fixture(autouse=True)
def _registry_allowed(settings, registry) -> None:
    settings.REGISTRY_ALLOWED = [registry]  # submission runs in this process


def test_a_registry_that_stops_sending_holds_no_launch_of_the_node(alice, bob, registry, big_image, abuse_node):
    hog = submit(alice, config("hang", role(command="echo hang ran", tasks=LAUNCH_THREADS, gpus=1),
                               image=big_image, gpuType=GPU_TYPE))
    wait_for(lambda: ImagePull.objects.filter(attempt__job=hog, state=ImagePull.State.PULLING,
                                              bytes_done__gt=0).exists(),
             timeout=60, interval=0.05, what="the pull to be under way")
    with frozen(registry):
        other = submit(bob, config("other", role(command="echo other ran", gpus=1), gpuType=GPU_TYPE))
        other = wait_state(other, State.SUCCEEDED, State.FAILED, timeout=STALL_SECONDS + 45)
        assert other.state == State.SUCCEEDED, other.exit_reason
        assert lines(other) == ["other ran"]

        hog = wait_state(hog, State.FAILED, timeout=30)
        assert hog.exit_type == ExitType.IMAGE_PULL, hog.exit_reason
        assert f"the registry sent nothing for {STALL_SECONDS} s" in hog.exit_reason, hog.exit_reason
        assert "IMAGE_PULL_STALL_SECONDS" in hog.exit_reason
        failed = ImagePull.objects.filter(attempt__job=hog, state=ImagePull.State.FAILED).first()
        assert failed is not None and "sent nothing" in failed.error
    # Given up by the engine too, not left to go on for no one once the
    # registry answers again.
    time.sleep(3)
    with pytest.raises(docker.errors.ImageNotFound):
        docker.from_env().api.inspect_image(big_image)
