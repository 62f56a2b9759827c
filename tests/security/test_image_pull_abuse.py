"""Pulls other users can abuse (findings 30 and 31).

Finding 30: a pull from a registry that stops sending, mid-download, never
ended (dockerd has no deadline for a layer's body), and its launch waited
for it: a node launches LAUNCH_THREADS tasks at once, so one user's job of
that many tasks on a registry of theirs that hangs held every launch of the
node, every other user's included, for good.

Against a real registry (Debian's docker-registry on loopback) frozen with
SIGSTOP once the node has begun to download the image's big layer: the
kernel keeps the connection open and nothing more ever arrives, as from a
registry that hangs on purpose.

Finding 31: a pull that goes on (a big image, a registry that trickles, or
one that hangs where no stall limit is set) held its launch thread all the
while, so one user's job of LAUNCH_THREADS tasks held every launch of the
node. Now one user has at most IMAGE_PULLS_PER_USER pulls under way on a
node; their other launches there wait off the launch threads.

Finding 32: nothing bounded an image's size: one user's enormous image
filled the disk of the node's engine, which every task on it writes to.
Now a pull whose new layers pass IMAGE_PULL_MAX_MB is given up; and, as
that counts compressed bytes, a pulled image that unpacks to more than
IMAGE_MAX_UNPACKED_MB (a layer of zeros: a gzip bomb) is refused and
removed from the engine; and a pull is given up once the engine's disk has
less than IMAGE_PULL_MIN_FREE_MB free, so that the bomb does not fill it
before that check.

Finding 33: a registry that trickles (a little now and then) keeps news
coming, so the stall limit never trips, and made a pull (with its owner's
pull slot and a launch thread) last as long as it liked. Now a pull still
under way after IMAGE_PULL_MAX_SECONDS is given up. The trickle is the real
registry stopped and continued in turn.

Finding 47: each pull of finding 31's share was still waited for on a launch
thread, so two users' shares were all of them. Now a check or pull that
lasts is waited for off the launch threads."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import docker
import docker.errors
import pytest

from jobs import services
from jobs.models import ExitType, ImagePull, Job, LogLine, State, Stream
from jobs.node.launcher import LaunchError
from jobs.node.launcher.docker import DockerEngine
from jobs.node.runner import LAUNCH_THREADS
from tests.cluster import wait_for
from tests.helpers import BUSYBOX_IMAGE, config, lines, role, submit, wait_state
from tests.registry import forget, frozen, image_in_registry, registry_agent, running_registry, trickling

pytestmark = pytest.mark.services

STALL_SECONDS = 4
LAYER_MB = 800  # long enough to download (seconds on loopback) that the registry is frozen mid-way
ZEROS_MB = 400  # a layer of zeros: a few hundred KB compressed, ZEROS_MB unpacked


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[str]:
    with running_registry(tmp_path_factory.mktemp("abuse-registry")) as address:
        yield address


@pytest.fixture(scope="module")
def big_image(registry) -> Iterator[str]:
    """<registry>/abuse/big:latest, busybox and a layer of LAYER_MB MB of
    random bytes, in the registry only."""
    with image_in_registry(f"{registry}/abuse/big:latest",
                           f"FROM {BUSYBOX_IMAGE}\nRUN head -c {LAYER_MB * 1000 * 1000} /dev/urandom > /layer\n") as image:
        yield image


@pytest.fixture(scope="module")
def bomb_image(registry) -> Iterator[str]:
    """<registry>/abuse/bomb:latest, busybox and a layer of ZEROS_MB MB of
    zeros, in the registry only."""
    with image_in_registry(f"{registry}/abuse/bomb:latest",
                           f"FROM {BUSYBOX_IMAGE}\nRUN head -c {ZEROS_MB * 1000 * 1000} /dev/zero > /zeros\n") as image:
        yield image


def abuse_node(cluster, registry: str, gpu_type: str, **env: str):
    """A node of its own, with room for one user's LAUNCH_THREADS tasks and
    one task of another's, its agent's environment given `env`."""
    return registry_agent(cluster, registry, f"t-node-{gpu_type.lower()}", gpus=LAUNCH_THREADS + 1,
                          gpu_type=gpu_type, env=env)


def hog(alice, image: str, gpu_type: str) -> Job:
    """Alice's job of LAUNCH_THREADS tasks pulling `image`, once its pull is
    under way (and the registry may be frozen mid-download)."""
    job = submit(alice, config("hang", role(command="echo hang ran", tasks=LAUNCH_THREADS, gpus=1),
                               image=image, gpuType=gpu_type))
    wait_for(lambda: ImagePull.objects.filter(attempt__job=job, state=ImagePull.State.PULLING,
                                              bytes_done__gt=0).exists(),
             timeout=60, interval=0.05, what="the pull to be under way")
    return job


def others_job_runs(bob, gpu_type: str, timeout: float) -> None:
    other = submit(bob, config("other", role(command="echo other ran", gpus=1), gpuType=gpu_type))
    other = wait_state(other, State.SUCCEEDED, State.FAILED, timeout=timeout)
    assert other.state == State.SUCCEEDED, other.exit_reason
    assert lines(other) == ["other ran"]


@pytest.fixture(autouse=True)
def _registry_allowed(settings, registry) -> None:
    settings.REGISTRY_ALLOWED = [registry]  # submission runs in this process


def test_a_registry_that_stops_sending_holds_no_launch_of_the_node(alice, bob, registry, big_image, cluster):
    with abuse_node(cluster, registry, "STALL", IMAGE_PULL_STALL_SECONDS=str(STALL_SECONDS),
                    IMAGE_PULLS_PER_USER="0"):
        job = hog(alice, big_image, "STALL")
        with frozen(registry):
            others_job_runs(bob, "STALL", timeout=STALL_SECONDS + 45)
            job = wait_state(job, State.FAILED, timeout=30)
            assert job.exit_type == ExitType.IMAGE_PULL, job.exit_reason
            assert f"the registry sent nothing for {STALL_SECONDS} s" in job.exit_reason, job.exit_reason
            assert "IMAGE_PULL_STALL_SECONDS" in job.exit_reason
            failed = ImagePull.objects.filter(attempt__job=job, state=ImagePull.State.FAILED).first()
            assert failed is not None and "sent nothing" in failed.error
        # Given up by the engine too, not left to go on for no one once the
        # registry answers again.
        time.sleep(3)
        with pytest.raises(docker.errors.ImageNotFound):
            docker.from_env().api.inspect_image(big_image)


def test_one_users_pulls_hold_no_more_than_their_share_of_the_nodes_launches(
        alice, bob, registry, big_image, cluster):
    # No stall limit: the pulls go on as long as the registry is frozen, as
    # they would from one that trickles.
    with abuse_node(cluster, registry, "SHARE", IMAGE_PULL_STALL_SECONDS="0"):
        job = hog(alice, big_image, "SHARE")
        with frozen(registry):
            others_job_runs(bob, "SHARE", timeout=45)
            assert State.RUNNING == Job.objects.get(pk=job.pk).state  # still pulling, and waiting for its share
            waiting = "this user has 2 image pulls under way on this node (IMAGE_PULLS_PER_USER)"
            wait_for(lambda: LogLine.objects.filter(attempt__job=job, stream=Stream.PLATFORM, text__contains=waiting)
                     .exists(), timeout=10, what="the waiting tasks' note")
            services.job_stop(job=job, by=alice)
            job = wait_state(job, State.STOPPED, timeout=30)  # the tasks set aside end too


def test_two_users_pulls_leave_the_nodes_launches_to_a_third(alice, bob, make_user, registry, big_image, cluster):
    """Finding 47: each of two users had their IMAGE_PULLS_PER_USER (2)
    pulls waited for on the node's launch threads: 2 + 2 were all
    LAUNCH_THREADS of them, and a third user's task stayed LAUNCHING for as
    long as the pulls lasted (here, with no stall limit, for ever)."""
    carol = make_user("carol")
    with registry_agent(cluster, registry, "t-node-two", gpus=2 * LAUNCH_THREADS + 1, gpu_type="TWO",
                        env={"IMAGE_PULL_STALL_SECONDS": "0"}):
        first = hog(alice, big_image, "TWO")
        second = submit(bob, config("hang2", role(command="echo hang ran", tasks=LAUNCH_THREADS, gpus=1),
                                    image=big_image, gpuType="TWO"))
        wait_for(lambda: ImagePull.objects.filter(attempt__job=second, state=ImagePull.State.PULLING,
                                                  layers_total__gt=0).count() == 2,
                 timeout=60, interval=0.05, what="the second user's pulls to be under way")
        with frozen(registry):
            others_job_runs(carol, "TWO", timeout=45)
            assert Job.objects.get(pk=first.pk).state == Job.objects.get(pk=second.pk).state == State.RUNNING
            for job in (first, second):
                services.job_stop(job=job, by=job.owner)
            for job in (first, second):
                wait_state(job, State.STOPPED, timeout=30)


def test_an_image_larger_than_the_limit_is_given_up_mid_pull(alice, registry, big_image, cluster):
    with abuse_node(cluster, registry, "SIZE", IMAGE_PULL_MAX_MB="100"):
        job = submit(alice, config("huge", role(command="echo huge ran", gpus=1), image=big_image, gpuType="SIZE"))
        job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=90)
        assert job.exit_type == ExitType.IMAGE_PULL, job.exit_reason
        assert "its layers are larger than 100 MB (IMAGE_PULL_MAX_MB)" in job.exit_reason, job.exit_reason
        assert lines(job) == []
        time.sleep(3)  # the engine gave the pull up: nothing of it arrives later
        with pytest.raises(docker.errors.ImageNotFound):
            docker.from_env().api.inspect_image(big_image)


def test_a_pull_that_trickles_is_given_up_at_its_deadline(alice, registry, big_image, cluster):
    with abuse_node(cluster, registry, "SLOW", IMAGE_PULL_MAX_SECONDS="6"):
        job = submit(alice, config("slow", role(command="echo slow ran", gpus=1), image=big_image, gpuType="SLOW"))
        wait_for(lambda: ImagePull.objects.filter(attempt__job=job, bytes_done__gt=0).exists(),
                 timeout=60, interval=0.05, what="the pull to be under way")
        with trickling(registry):
            job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=30)
        assert job.exit_type == ExitType.IMAGE_PULL, job.exit_reason
        assert "it took longer than 6 s (IMAGE_PULL_MAX_SECONDS)" in job.exit_reason, job.exit_reason
        time.sleep(3)
        with pytest.raises(docker.errors.ImageNotFound):
            docker.from_env().api.inspect_image(big_image)


def test_an_image_that_unpacks_past_the_limit_is_refused_and_removed(alice, registry, bomb_image, cluster):
    """The bomb's new layers are well under IMAGE_PULL_MAX_MB (compressed)
    and far over IMAGE_MAX_UNPACKED_MB; with no unpacked limit the same job
    runs."""
    limit = ZEROS_MB // 2
    with abuse_node(cluster, registry, "BOMB", IMAGE_PULL_MAX_MB="10", IMAGE_MAX_UNPACKED_MB=str(limit)):
        job = submit(alice, config("bomb", role(command="echo bomb ran", gpus=1), image=bomb_image, gpuType="BOMB"))
        job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=120)
        assert job.exit_type == ExitType.IMAGE_PULL, job.exit_reason
        assert f"could not pull image {bomb_image}: it unpacks to " in job.exit_reason, job.exit_reason
        assert f"MB, more than {limit} MB (IMAGE_MAX_UNPACKED_MB)" in job.exit_reason, job.exit_reason
        unpacked = int(job.exit_reason.split("it unpacks to ")[1].split(" MB")[0])
        assert unpacked >= ZEROS_MB, job.exit_reason
        assert lines(job) == []
        failed = ImagePull.objects.filter(attempt__job=job, state=ImagePull.State.FAILED).first()
        assert failed is not None and "IMAGE_MAX_UNPACKED_MB" in failed.error
        # Removed as the task failed, not left to fill the disk.
        with pytest.raises(docker.errors.ImageNotFound):
            docker.from_env().api.inspect_image(bomb_image)
    with abuse_node(cluster, registry, "UNBOUND", IMAGE_PULL_MAX_MB="10", IMAGE_MAX_UNPACKED_MB="0"):
        job = submit(alice, config("bomb-unbound", role(command="echo bomb ran", gpus=1), image=bomb_image,
                                   gpuType="UNBOUND"))
        job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=120)
        assert job.state == State.SUCCEEDED, job.exit_reason
        assert lines(job) == ["bomb ran"]
    forget(bomb_image)


def test_an_image_refused_while_a_container_uses_it_stays_and_still_fails_the_pull(docker_engine, bomb_image):
    """The engine will not remove an image a container uses (here one
    started on it between its pull and the check, as a launch that found it
    present that moment could): the refusal still stands, and the image
    stays for that container; once it is gone, a refusal removes it."""
    engine = DockerEngine(docker_engine)
    api = docker.from_env().api
    assert engine.ensure_image(bomb_image, max_unpacked_mb=0)
    container = api.create_container(bomb_image, command=["sleep", "600"], labels={"pai.test": "bomb"})["Id"]
    try:
        api.start(container)
        assert not engine._drop_image(bomb_image)
        api.inspect_image(bomb_image)  # still there
        with pytest.raises(LaunchError, match=r"it unpacks to \d+ MB, more than 1 MB \(IMAGE_MAX_UNPACKED_MB\)"):
            engine._unpacked_within(bomb_image, 1)
        api.inspect_image(bomb_image)
    finally:
        api.remove_container(container, force=True)
    with pytest.raises(LaunchError, match="IMAGE_MAX_UNPACKED_MB"):
        engine._unpacked_within(bomb_image, 1)
    with pytest.raises(docker.errors.ImageNotFound):
        api.inspect_image(bomb_image)


def test_a_pull_is_given_up_once_the_engines_disk_runs_low(alice, registry, bomb_image, cluster):
    """The floor is put ZEROS_MB / 2 below what the engine's disk has free
    now: the bomb crosses it as it unpacks, and the pull is given up before
    the image is whole, with no unpacked limit to catch it after."""
    disk = os.statvfs(docker.from_env().info()["DockerRootDir"])
    floor = disk.f_bavail * disk.f_frsize // 1_000_000 - ZEROS_MB // 2
    with abuse_node(cluster, registry, "FLOOR", IMAGE_PULL_MIN_FREE_MB=str(floor), IMAGE_MAX_UNPACKED_MB="0"):
        job = submit(alice, config("floor", role(command="echo floor ran", gpus=1), image=bomb_image,
                                   gpuType="FLOOR"))
        job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=120)
        assert job.exit_type == ExitType.IMAGE_PULL, job.exit_reason
        assert f"has less than {floor} MB free (IMAGE_PULL_MIN_FREE_MB)" in job.exit_reason, job.exit_reason
        assert lines(job) == []
        time.sleep(3)  # the engine gave the pull up: nothing of it arrives later
        with pytest.raises(docker.errors.ImageNotFound):
            docker.from_env().api.inspect_image(bomb_image)
