"""Finding 6: an image pulled once with one user's registry credentials (a
job's authFile) could be started by anyone else without credentials, since
the node already had it.

Against a real private registry (Debian's docker-registry with htpasswd
authentication, on loopback, stopped by PID): a job may use an image whose
repository needed credentials only if its own credentials can pull it; the
node asks the registry (a manifest inspect) even though it has the image
(jobs/node/images/). Naming the image by its local ID, which Docker
accepts, is refused too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from django.conf import settings as django_settings

from jobs.models import ExitType, ImagePull, State, Stream
from tests.helpers import BUSYBOX_IMAGE, config, lines, role, submit, wait_state
from tests.registry import registry_agent, running_registry

pytestmark = pytest.mark.services

USERNAME, PASSWORD = "team", "registry-password-1"
NODE, GPU_TYPE = "t-node-reg", "REGTEST"


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[str]:
    """A registry that wants a password, on 127.0.0.1:<free port>."""
    with running_registry(tmp_path_factory.mktemp("registry"), users={USERNAME: PASSWORD}) as address:
        yield address


@pytest.fixture(scope="module")
def private_image(registry) -> Iterator[str]:
    """The local busybox pushed as <registry>/private/busybox, then its tag
    removed: the node gets it back only by a pull with credentials."""
    api = docker.from_env().api
    repository = f"{registry}/private/busybox"
    api.tag(BUSYBOX_IMAGE, repository, "latest")
    try:
        events = list(api.push(repository, tag="latest", stream=True, decode=True,
                               auth_config={"username": USERNAME, "password": PASSWORD}))
        assert not [e for e in events if e.get("error")], events
        api.remove_image(f"{repository}:latest")
        yield f"{repository}:latest"
    finally:
        image = api.inspect_image(BUSYBOX_IMAGE)
        for name in [*image.get("RepoTags", []), *image.get("RepoDigests", [])]:
            if name.startswith(registry + "/"):
                try:
                    api.remove_image(name)
                except docker.errors.NotFound:
                    pass  # went with the tag removed before it


@pytest.fixture(scope="module")
def registry_node(cluster, registry) -> Iterator[str]:
    with registry_agent(cluster, registry, NODE, gpus=2, gpu_type=GPU_TYPE) as name:
        yield name


@pytest.fixture(autouse=True)
def _registry_allowed(settings, registry) -> None:
    settings.REGISTRY_ALLOWED = [registry]  # submission runs in this process


def auth_file(user, name: str, registry: str, password: str) -> str:
    path = Path(django_settings.STORAGE_LOCAL_ROOT) / user.username / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{registry}\n{USERNAME}\n{password}\n")
    return name


def run(user, name: str, image: str, **top) -> object:
    cfg = config(name, role(command=f"echo {name} ran", gpus=1), image=image, gpuType=GPU_TYPE, **top)
    return wait_state(submit(user, cfg), State.SUCCEEDED, State.FAILED, timeout=90)


def test_it_starts_a_private_image_only_for_jobs_whose_credentials_can_pull_it(
        alice, bob, registry, private_image, registry_node):
    api = docker.from_env().api
    owner = run(alice, "owner", private_image, authFile=auth_file(alice, "registry-auth", registry, PASSWORD))
    assert owner.state == State.SUCCEEDED, owner.exit_reason
    assert lines(owner) == ["owner ran"]
    assert private_image in api.inspect_image(private_image)["RepoTags"]  # the node has it now

    stranger = run(bob, "stranger", private_image)
    assert stranger.state == State.FAILED and stranger.exit_type == ExitType.IMAGE_PULL, stranger.exit_reason
    assert f"could not pull image {private_image}: " in stranger.exit_reason
    assert f"(the registry {registry} was asked without credentials: the job gives none;" in stranger.exit_reason
    assert "may use a private image only with credentials that can pull it" in stranger.exit_reason
    assert lines(stranger) == []

    guesser = run(bob, "guesser", private_image, authFile=auth_file(bob, "registry-auth", registry, "wrong-password"))
    assert guesser.exit_type == ExitType.IMAGE_PULL, guesser.exit_reason
    assert "asked with this job's credentials" in guesser.exit_reason and "wrong-password" not in guesser.exit_reason

    # By its local ID, Docker would start it without asking anyone.
    short_id = api.inspect_image(private_image)["Id"].removeprefix("sha256:")[:12]
    by_id = run(bob, "byid", short_id)
    assert by_id.exit_type == ExitType.IMAGE_PULL and "names a local image by its ID" in by_id.exit_reason

    again = run(alice, "again", private_image, authFile="registry-auth")
    assert again.state == State.SUCCEEDED, again.exit_reason


def test_it_keeps_public_images_free_of_registry_round_trips(alice, registry_node):
    # pai-local/... has no registry at all: asking one would fail the job.
    job = run(alice, "public", BUSYBOX_IMAGE)
    assert job.state == State.SUCCEEDED, job.exit_reason


def test_it_pulls_again_an_image_removed_after_the_node_saw_it(alice, registry, private_image, registry_node):
    # The node remembers that it has an image (jobs/node/images/) and does
    # not look again at each launch; removed behind its back, the image is
    # found missing when the container is created, and pulled again.
    api = docker.from_env().api
    for name in ("pulled", "seen"):  # the second launch finds it on the node
        job = run(alice, name, private_image, authFile=auth_file(alice, "registry-auth", registry, PASSWORD))
        assert job.state == State.SUCCEEDED, job.exit_reason
    api.remove_image(private_image)

    second = run(alice, "removed", private_image, authFile="registry-auth")
    assert second.state == State.SUCCEEDED, second.exit_reason
    assert lines(second) == ["removed ran"]
    assert private_image in api.inspect_image(private_image)["RepoTags"]


def test_it_checks_a_pulled_image_whose_record_was_lost(alice, bob, registry, private_image, registry_node):
    """Finding 34: which images needed credentials was known only from a
    file below the agent's VAR_DIR. An agent installed afresh, a VAR_DIR
    cleaned, an agent of another host on the same engine, or an image pulled
    by a version before the record: the engine still had the image, and any
    job started it without credentials."""
    owner = run(alice, "recorded", private_image, authFile=auth_file(alice, "registry-auth", registry, PASSWORD))
    assert owner.state == State.SUCCEEDED, owner.exit_reason
    for record in (Path(django_settings.VAR_DIR) / "private-images").iterdir():
        record.unlink()  # the record lost; the image stays on the engine

    stranger = run(bob, "unrecorded", private_image)
    assert stranger.state == State.FAILED and stranger.exit_type == ExitType.IMAGE_PULL, stranger.exit_reason
    assert f"(the registry {registry} was asked without credentials" in stranger.exit_reason
    assert lines(stranger) == []

    again = run(alice, "still", private_image, authFile="registry-auth")
    assert again.state == State.SUCCEEDED, again.exit_reason


def platform_log(job) -> list[str]:
    """The task's platform notes without their times."""
    return [line.partition("Z ")[2] for line in lines(job, Stream.PLATFORM)]


def test_it_refuses_a_private_image_in_the_same_words_whether_the_node_has_it_or_not(
        alice, bob, registry, private_image, registry_node):
    """Finding 35: the refusal said "This node has the image from a pull
    with other credentials", a pull's refusal said otherwise: jobs are
    private to their owners, yet any user could learn which private images
    (repository and tag) other users' jobs had pulled onto a node."""
    api = docker.from_env().api
    try:
        api.remove_image(private_image)
    except docker.errors.NotFound:
        pass
    absent = run(bob, "probe-absent", private_image)
    owner = run(alice, "pulls", private_image, authFile=auth_file(alice, "registry-auth", registry, PASSWORD))
    assert owner.state == State.SUCCEEDED, owner.exit_reason
    present = run(bob, "probe-present", private_image)
    assert absent.exit_type == present.exit_type == ExitType.IMAGE_PULL, (absent.exit_reason, present.exit_reason)
    assert absent.exit_reason == present.exit_reason
    assert platform_log(absent) == platform_log(present)
    assert (ImagePull.objects.get(attempt__job=absent).error == ImagePull.objects.get(attempt__job=present).error
            == absent.exit_reason.removeprefix("task main-0 failed: "))

    wrong = auth_file(bob, "wrong-auth", registry, "wrong-password")
    wrong_present = run(bob, "wrong-present", private_image, authFile=wrong)
    api.remove_image(private_image)
    wrong_absent = run(bob, "wrong-absent", private_image, authFile=wrong)
    assert wrong_absent.exit_type == wrong_present.exit_type == ExitType.IMAGE_PULL, wrong_absent.exit_reason
    assert wrong_absent.exit_reason == wrong_present.exit_reason
