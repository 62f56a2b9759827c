"""Finding 46: a registry that cannot be reached failed the jobs that asked it.

Since finding 34 the node asks the registry before it starts an image that
no record says anyone may pull (the first launch after an upgrade, or after
a record was lost), and since finding 35 before every pull. A registry that
was down, timing out or answering 5xx at that moment failed the job at once,
like a refusal. Now a launch whose registry cannot be reached waits, off the
launch threads, and asks again with backoff for IMAGE_PULL_REGISTRY_WAIT_SECONDS,
the job page saying so; then it fails naming the limit. A refusal (401, 403,
404 for this job's credentials) still fails at once, and nothing is started
from the node's cache while the registry cannot be asked.

Against real registries (Debian's docker-registry on loopback, one open,
one with htpasswd), stopped by PID and started again on the same port.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from django.conf import settings as django_settings

from jobs.models import ExitType, ImagePull, Job, State, Stream, TaskAttempt, TaskState
from tests.cluster import wait_for
from tests.helpers import BUSYBOX_IMAGE, config, lines, login, role, submit, wait_state
from tests.registry import DroppingProxy, down, dropping_proxy, forget, registry_agent, running_registry

pytestmark = pytest.mark.services

USERNAME, PASSWORD = "team", "registry-password-2"
NODE, GPU_TYPE = "t-node-outage", "OUTAGE"
WAIT_SECONDS = 15


@pytest.fixture(scope="module")
def open_registry(tmp_path_factory) -> Iterator[str]:
    with running_registry(tmp_path_factory.mktemp("open-registry")) as address:
        yield address


@pytest.fixture(scope="module")
def private_registry(tmp_path_factory) -> Iterator[str]:
    with running_registry(tmp_path_factory.mktemp("private-registry"), users={USERNAME: PASSWORD}) as address:
        yield address


def pushed(repository: str, auth: dict[str, str] | None = None) -> str:
    """The local busybox pushed as `repository`:latest and pulled back, so
    that the engine has it with a digest of that registry, as after a pull."""
    api = docker.from_env().api
    api.tag(BUSYBOX_IMAGE, repository, "latest")
    events = list(api.push(repository, tag="latest", stream=True, decode=True, auth_config=auth))
    assert not [e for e in events if e.get("error")], events
    api.pull(repository, tag="latest", auth_config=auth)
    assert api.inspect_image(f"{repository}:latest")["RepoDigests"]
    return f"{repository}:latest"


@pytest.fixture(scope="module")
def _images_removed(docker_engine, open_registry, private_registry) -> Iterator[None]:
    """The images the tests push, removed after them (only with Docker:
    the first test needs none)."""
    yield
    api = docker.from_env().api
    for registry in (open_registry, private_registry):
        for image in api.images(name=f"{registry}/*/*"):
            for name in image.get("RepoTags") or []:
                try:
                    api.remove_image(name)
                except docker.errors.NotFound:
                    pass


@pytest.fixture(scope="module")
def dropped_image(open_registry, _images_removed) -> Iterator[tuple[str, str]]:
    """outage/dropped:latest in the open registry only (busybox and a layer
    of its own, so no image of the engine has its config), and the digest
    of its config, the blob the engine fetches first in a pull."""
    image = f"{open_registry}/outage/dropped:latest"
    subprocess.run(["docker", "build", "-q", "-t", image, "-"], input=f"FROM {BUSYBOX_IMAGE}\nRUN echo {uuid.uuid4()} > /own\n",
                   text=True, check=True, capture_output=True, timeout=300)
    api = docker.from_env().api
    digest = api.inspect_image(image)["Id"]
    events = list(api.push(image, stream=True, decode=True))
    assert not [e for e in events if e.get("error")], events
    forget(image)
    yield image, digest


@pytest.fixture(scope="module")
def dropping(open_registry, dropped_image) -> Iterator[DroppingProxy]:
    """A proxy to the open registry that cuts its image's config mid-answer while asked to."""
    with dropping_proxy(open_registry, dropped_image[1]) as proxy:
        try:
            yield proxy
        finally:  # what the engine pulled through it
            api = docker.from_env().api
            for found in api.images(name=f"{proxy.address}/*/*"):
                for name in found.get("RepoTags") or []:
                    forget(name)


@pytest.fixture(scope="module")
def outage_node(cluster, _images_removed, open_registry, private_registry, dropping) -> Iterator[str]:
    with registry_agent(cluster, open_registry, NODE, gpus=4, gpu_type=GPU_TYPE, env={
            "REGISTRY_ALLOWED": f"{open_registry},{private_registry},{dropping.address}",
            "IMAGE_PULL_REGISTRY_WAIT_SECONDS": str(WAIT_SECONDS)}) as name:
        yield name


@pytest.fixture(autouse=True)
def _registry_allowed(settings, open_registry, private_registry) -> None:
    settings.REGISTRY_ALLOWED = [open_registry, private_registry]  # submission runs in this process


def run(user, name: str, image: str, **top) -> Job:
    return submit(user, config(name, role(command=f"echo {name} ran", gpus=1), image=image, gpuType=GPU_TYPE, **top))


def waiting_for_the_registry(job: Job) -> ImagePull:
    def waiting() -> bool:
        ended = Job.objects.filter(pk=job.pk, state__in=[State.FAILED, State.SUCCEEDED]).first()
        assert ended is None, f"ended {ended.state}: {ended.exit_reason}"
        return ImagePull.objects.filter(attempt__job=job, state="WAITING").exists()

    wait_for(waiting, timeout=30, interval=0.1, what="the task to wait for its registry")
    return ImagePull.objects.get(attempt__job=job)


def auth_file(user, registry: str, password: str) -> str:
    path = Path(django_settings.STORAGE_LOCAL_ROOT) / user.username / "outage-auth"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{registry}\n{USERNAME}\n{password}\n")
    return "outage-auth"


def test_it_tells_a_registry_it_cannot_reach_from_a_refusal():
    from jobs.node.launcher.docker import registry_unreachable

    # The engine's own words, as it said them here (Docker 20.10).
    for message in ('Get "http://127.0.0.1:5911/v2/": dial tcp 127.0.0.1:5911: connect: connection refused',
                    'Get "http://127.0.0.1:5911/v2/": context deadline exceeded',
                    'Get "http://127.0.0.1:5911/v2/": net/http: request canceled (Client.Timeout exceeded '
                    'while awaiting headers)',
                    "received unexpected HTTP status: 503 Service Unavailable",
                    "received unexpected HTTP status: 502 Bad Gateway",
                    # A pull the registry dropped half-way (a reset, a body cut short).
                    "error pulling image configuration: read tcp 127.0.0.1:40312->127.0.0.1:5911: read: "
                    "connection reset by peer", "unexpected EOF"):
        assert registry_unreachable(message), message
    for message in ('Head "http://127.0.0.1:5911/v2/x/busybox/manifests/latest": no basic auth credentials',
                    "unauthorized: authentication required", "manifest unknown: manifest unknown",
                    "blob unknown: blob unknown to registry",
                    "denied: requested access to the resource is denied",
                    "pull access denied for x, repository does not exist or may require 'docker login'"):
        assert not registry_unreachable(message), message


def test_a_launch_waits_for_a_registry_that_is_down_and_goes_on_when_it_is_back(
        alice, cluster, open_registry, outage_node):
    image = pushed(f"{open_registry}/outage/first")  # on the engine, and no record knows it (finding 34)
    with down(open_registry):
        job = run(alice, "first", image)
        pull = waiting_for_the_registry(job)
        assert "could not be reached" in pull.error and "connection refused" in pull.error, pull.error
        page = login(cluster.base_url, alice).get(f"{cluster.base_url}/jobs/{job.pk}/live/")
        assert "Waiting for the registry" in page.text and 'data-pull-state="WAITING"' in page.text
        time.sleep(3)  # it goes on waiting, and nothing of it has started
        attempt = TaskAttempt.objects.get(job=job)
        assert attempt.state == TaskState.LAUNCHING and attempt.container_id == ""
    job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=WAIT_SECONDS + 30)
    assert job.state == State.SUCCEEDED, job.exit_reason
    assert lines(job) == ["first ran"]


def test_a_launch_fails_naming_the_limit_when_the_registry_stays_down(alice, open_registry, outage_node):
    image = pushed(f"{open_registry}/outage/stays")
    with down(open_registry):
        started = time.monotonic()
        job = run(alice, "stays", image)
        waiting_for_the_registry(job)
        job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=WAIT_SECONDS + 40)
        waited = time.monotonic() - started
    assert job.state == State.FAILED and job.exit_type == ExitType.IMAGE_PULL, job.exit_reason
    assert f"could not pull image {image}: the registry {open_registry} could not be reached" in job.exit_reason
    assert f"for {WAIT_SECONDS} s (IMAGE_PULL_REGISTRY_WAIT_SECONDS)" in job.exit_reason, job.exit_reason
    assert waited >= WAIT_SECONDS
    assert ImagePull.objects.get(attempt__job=job).state == ImagePull.State.FAILED
    assert lines(job) == []


def test_nothing_is_started_from_the_cache_while_the_registry_cannot_be_asked(
        alice, bob, private_registry, outage_node):
    image = pushed(f"{private_registry}/outage/private", {"username": USERNAME, "password": PASSWORD})
    # No record says it is private (finding 34): the engine has it, nothing more.
    with down(private_registry):
        stranger = run(bob, "stranger", image)
        owner = run(alice, "owner", image, authFile=auth_file(alice, private_registry, PASSWORD))
        waiting_for_the_registry(stranger)
        waiting_for_the_registry(owner)  # credentials that could pull it once are not enough while it cannot ask
        time.sleep(3)
        assert not TaskAttempt.objects.filter(job__in=[stranger, owner]).exclude(container_id="").exists()
    stranger = wait_state(stranger, State.SUCCEEDED, State.FAILED, timeout=WAIT_SECONDS + 30)
    assert stranger.state == State.FAILED and stranger.exit_type == ExitType.IMAGE_PULL, stranger.exit_reason
    assert f"(the registry {private_registry} was asked without credentials" in stranger.exit_reason
    assert lines(stranger) == []
    owner = wait_state(owner, State.SUCCEEDED, State.FAILED, timeout=WAIT_SECONDS + 30)
    assert owner.state == State.SUCCEEDED, owner.exit_reason

    # A refusal, with the registry up, fails at once: no waiting.
    started = time.monotonic()
    refused = wait_state(run(bob, "refused", image), State.SUCCEEDED, State.FAILED, timeout=WAIT_SECONDS)
    assert refused.exit_type == ExitType.IMAGE_PULL and time.monotonic() - started < WAIT_SECONDS
    assert not ImagePull.objects.filter(attempt__job=refused, state=ImagePull.State.WAITING).exists()


def test_a_pull_the_registry_drops_half_way_is_pulled_again_within_the_wait(
        alice, settings, dropped_image, dropping, outage_node):
    # Through the proxy: the registry answers the manifest, then breaks off
    # the image's config after a few bytes, which the engine does not try
    # again. As for a registry that cannot be reached before the pull, the
    # launch waits, saying so, and pulls again; not a failed task.
    settings.REGISTRY_ALLOWED = [*settings.REGISTRY_ALLOWED, dropping.address]
    image = f"{dropping.address}/{dropped_image[0].split('/', 1)[1]}"  # the same, through the proxy
    dropping.dropping.set()
    try:
        job = run(alice, "dropped", image)
        pull = waiting_for_the_registry(job)
    finally:
        dropping.dropping.clear()
    assert dropping.cuts >= 1
    assert pull.error.startswith(f"the registry {dropping.address} broke off the pull: "), pull.error
    assert "connection reset" in pull.error or "unexpected EOF" in pull.error, pull.error
    assert "(IMAGE_PULL_REGISTRY_WAIT_SECONDS)" in pull.error
    job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=WAIT_SECONDS + 30)
    assert job.state == State.SUCCEEDED, job.exit_reason
    assert lines(job) == ["dropped ran"]
    notes = lines(job, Stream.PLATFORM)
    assert any("waiting for the registry: the registry" in note and "broke off the pull" in note for note in notes), notes
