"""Finding 15: an image name like `127.0.0.1:6379/x` made the node's Docker
engine call a service on the node. Registry hosts on loopback, link-local
and (unless an admin allows them in REGISTRY_ALLOWED) private addresses are
refused at submission with a message naming the image field; the node checks
the address a registry's name resolves to again before it pulls."""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import pytest
import yaml
from django.test import Client

from jobs import services
from jobs.images import registry_of, registry_refusal
from jobs.models import ExitType, Job, State
from jobs.environment import PeerTask
from jobs.node.images import ImageGate, RepositoryRecord, node_registry_refusal
from jobs.node.launcher import LaunchError, RegistryAuth, RegistryHostUnknown, RegistryUnreachable
from jobs.node.runner import LaunchContext, config_registry_auth
from jobs.services import tokens
from jobs.spec import SpecError
from tests.cluster import free_port
from tests.helpers import wait_state


def _config(name: str, image: str, gpu_type: str = "NOT-ON-ANY-NODE") -> str:
    # Accepted jobs wait for a GPU type no node has: if the test cluster
    # runs, no agent resolves or contacts these registries.
    return json.dumps({"jobName": name, "image": image, "gpuType": gpu_type, "taskRoles": [{
        "name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 1, "command": "true"}]})


@pytest.mark.parametrize("image, words", [
    ("127.0.0.1:6379/x", "loopback"), ("localhost:5000/x", "localhost"), ("[::1]:5000/x:1", "loopback"),
    ("169.254.169.254/latest", "link-local"), ("10.1.2.3:5000/team/model:1", "private"),
    ("192.168.0.7/x", "private"), ("0.0.0.0:2375/x", "loopback"),
])
def test_it_refuses_registries_on_the_node_metadata_and_private_addresses(alice, image, words):
    with pytest.raises(SpecError) as caught:
        services.job_submit(owner=alice, config=_config("reg", image))
    problem = caught.value.problems[0]
    assert problem.path == "image" and words in problem.message
    assert not Job.objects.filter(owner=alice).exists()


def test_it_accepts_public_names_and_what_the_admin_allows(alice, settings):
    for index, image in enumerate(["busybox", "pai-local/busybox:latest", "ghcr.io/org/image:1",
                                   "registry.example.com:5000/team/x"]):
        services.job_submit(owner=alice, config=_config(f"ok{index}", image))
    settings.REGISTRY_ALLOWED = ["10.0.0.0/8", "127.0.0.1:5000"]
    services.job_submit(owner=alice, config=_config("private-ok", "10.1.2.3:5000/team/model:1"))
    services.job_submit(owner=alice, config=_config("loop-ok", "127.0.0.1:5000/x"))
    with pytest.raises(SpecError):  # only that port was opened
        services.job_submit(owner=alice, config=_config("loop-other", "127.0.0.1:6379/x"))


def _two_images(name: str, other_image: str) -> str:
    return yaml.safe_dump({
        "protocolVersion": 2, "name": name, "type": "job", "extras": {"gpuType": "NOT-ON-ANY-NODE"},
        "prerequisites": [{"name": "a", "type": "dockerimage", "uri": "pai-local/busybox:latest"},
                          {"name": "b", "type": "dockerimage", "uri": other_image,
                           "auth": {"username": "robot", "password": "<% $secrets.pw %>", "registryuri": "r"}}],
        "secrets": {"pw": "registry-pass-7"},
        "taskRoles": {role: {"dockerImage": ref, "resourcePerInstance": {"cpu": 1, "memoryMB": 256, "gpu": 1},
                             "commands": ["true"]} for role, ref in (("main", "a"), ("side", "b"), ("more", "b"))},
    }, sort_keys=False)


def test_it_refuses_a_task_roles_own_image_on_the_node_naming_that_roles_field(alice):
    with pytest.raises(SpecError) as caught:
        services.job_submit(owner=alice, config=_two_images("roleimg", "127.0.0.1:6379/x"))
    [problem] = caught.value.problems  # once per image, at the first role that names it
    assert problem.path == "taskRoles.side.dockerImage" and "loopback" in problem.message
    with pytest.raises(SpecError) as caught:  # the first role's image is the job's
        services.job_submit(owner=alice, config=_two_images("roleimg", "busybox").replace(
            "pai-local/busybox:latest", "169.254.169.254/x"))
    assert [p.path for p in caught.value.problems] == ["image"]
    assert not Job.objects.filter(owner=alice).exists()
    services.job_submit(owner=alice, config=_two_images("roleimg-ok", "registry.example.com/team/x:1"))


def test_the_node_gives_a_registry_login_only_to_the_task_role_whose_image_it_is(alice):
    job = services.job_submit(owner=alice, config=_two_images("roleauth", "registry.example.com/team/x:1"))

    def auth(role: str) -> RegistryAuth | None:
        me = PeerTask(role=role, index=0, node_address="127.0.0.1", engine_id="", ip="")
        return config_registry_auth(LaunchContext(attempt=None, job=job, spec=job.spec, me=me, peers=[me]))

    assert auth("main") is None  # its image is public: the other role's login is for another registry
    assert auth("side") == auth("more") == RegistryAuth(registry="r", username="robot", password="registry-pass-7")


def test_it_checks_resolved_addresses_as_the_node_does():
    assert "loopback" in registry_refusal("registry.example.com", resolved=["127.0.0.1"])
    assert "link-local" in registry_refusal("metadata.internal", resolved=["169.254.169.254"])
    assert registry_refusal("registry.example.com", resolved=["93.184.216.34"]) is None
    assert registry_of("library/busybox") == "docker.io"
    # Not public, though no "private" either: shared address space (a cloud's
    # metadata at 100.100.100.200) and NAT64 forms of private addresses.
    for address in ("100.100.100.200", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:5"):
        assert "not public" in registry_refusal("registry.example.com", resolved=[address]), address


def test_a_first_part_with_capitals_names_a_registry_as_docker_takes_it(alice):
    # Docker's rule: a repository name is lower case, so "LOCALHOST/x" and
    # "Redis/x" name hosts. Taken for Docker Hub, they skipped every check
    # and the node's engine called the node itself (LOCALHOST) or an
    # internal host.
    assert registry_of("LOCALHOST/x") == "LOCALHOST" and registry_of("Redis/x:1") == "Redis"
    assert registry_of("library/busybox") == registry_of("busybox") == "docker.io"
    with pytest.raises(SpecError) as caught:
        services.job_submit(owner=alice, config=_config("caps", "LOCALHOST/x"))
    assert caught.value.problems[0].path == "image" and "localhost" in caught.value.problems[0].message
    assert "loopback" in node_registry_refusal("Redis/x", allowed=[], resolve=lambda host: ["127.0.0.1"])


def test_it_answers_the_rest_api_with_a_400_and_refuses_strangers(alice):
    key = tokens.token_create(user=alice, lifetime=timedelta(hours=1)).key
    path = f"/api/v1/user/{alice.username}/jobs"
    answer = Client().post(path, data=_config("api", "127.0.0.1:6379/x"), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 400 and "image" in answer.content.decode()
    assert Client().post(path, data=_config("anon", "busybox"), content_type="application/json").status_code == 401


# ------------------------------------------------------ the node's check

def _resolver(addresses: list[str]):
    asked: list[str] = []

    def resolve(host: str) -> list[str]:
        asked.append(host)
        return addresses

    return resolve, asked


def _never(host: str) -> list[str]:
    raise AssertionError(f"{host} was resolved")


def test_it_refuses_on_the_node_a_registry_name_that_resolves_to_the_node_metadata_or_a_private_address():
    for addresses, words in ((["127.0.0.1"], "loopback"), (["93.184.216.34", "169.254.169.254"], "link-local"),
                             (["10.1.2.3"], "private"), (["::1"], "loopback")):
        resolve, asked = _resolver(addresses)
        refusal = node_registry_refusal("registry.example.com:5000/team/x:1", allowed=[], resolve=resolve)
        assert refusal and words in refusal, (addresses, refusal)
        assert asked == ["registry.example.com"]
    resolve, _asked = _resolver(["10.1.2.3"])
    assert node_registry_refusal("registry.example.com/x", allowed=["10.0.0.0/8"], resolve=resolve) is None
    resolve, _asked = _resolver(["93.184.216.34"])
    assert node_registry_refusal("registry.example.com/x", allowed=[], resolve=resolve) is None


def test_it_resolves_only_names_and_refuses_names_that_do_not_resolve():
    assert node_registry_refusal("busybox", allowed=[], resolve=_never) is None  # Docker Hub
    assert node_registry_refusal("pai-local/busybox:latest", allowed=[], resolve=_never) is None
    assert "loopback" in node_registry_refusal("127.0.0.1:6379/x", allowed=[], resolve=_never)
    assert node_registry_refusal("127.0.0.1:5000/x", allowed=["127.0.0.1:5000"], resolve=_never) is None

    def fails(host: str) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    refusal = node_registry_refusal("nowhere.example:5000/x", allowed=[], resolve=fails)
    assert refusal.startswith("the registry nowhere.example:5000 does not resolve on the node: its DNS says there is "
                              "no such name ([Errno -2] Name or service not known); check the registry"), refusal


# A name that does not resolve reads the same whoever resolves it: the node
# for a registry of the image's name, the engine for Docker Hub. A DNS that
# says there is no such name fails at once (a typo, most likely: asking
# again gets the same answer); one that gives no answer is waited for as a
# registry that cannot be reached (finding 46).

def test_a_registry_name_the_nodes_dns_cannot_answer_for_now_is_waited_for_not_refused():
    def no_answer(host: str) -> list[str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    with pytest.raises(RegistryUnreachable) as caught:
        node_registry_refusal("registry.example.com/x", allowed=[], resolve=no_answer)
    assert caught.value.message == ('the registry host "registry.example.com" could not be resolved now '
                                    "([Errno -3] Temporary failure in name resolution)")


def test_the_engines_dns_answers_for_docker_hub_are_told_apart_as_the_nodes_own():
    from jobs.node.launcher.docker import registry_host_unknown, registry_unreachable

    # The engine's own words (Go's resolver) for a name that does not exist...
    gone = 'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on 10.0.0.53:53: no such host'
    assert registry_host_unknown(gone) and not registry_unreachable(gone)
    # ... and for a DNS that gave no answer.
    for message in ('Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on 10.0.0.53:53: '
                    "server misbehaving",
                    'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on 10.0.0.53:53: '
                    "read udp 10.0.0.7:41234->10.0.0.53:53: i/o timeout",
                    'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: Temporary failure '
                    "in name resolution"):
        assert registry_unreachable(message) and not registry_host_unknown(message), message


class _NoSuchHostEngine:
    """The engine as ImageGate sees it when its DNS says Docker Hub's name
    does not exist: DockerEngine raises RegistryHostUnknown for its "no such host"."""

    def has_image(self, image: str) -> bool:
        return False

    def check_image_access(self, image, auth) -> None:
        raise RegistryHostUnknown('Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: '
                                  "no such host")

    def ensure_image(self, image, auth=None, **limits) -> bool:
        raise AssertionError("pulled from a registry whose name does not resolve")


def test_docker_hubs_name_that_does_not_resolve_fails_at_once_naming_the_image(tmp_path):
    gate = ImageGate(_NoSuchHostEngine(), RepositoryRecord(tmp_path / "private"))  # type: ignore[arg-type]
    notes: list[str] = []
    with pytest.raises(LaunchError) as caught:
        gate.ensure("busybox:1.36", None, allowed=[], note=notes.append)
    assert not isinstance(caught.value, RegistryUnreachable)  # not waited for
    assert caught.value.message.startswith(
        "could not pull image busybox:1.36: the registry docker.io does not resolve on the node: its DNS says there "
        "is no such name ("), caught.value.message
    assert caught.value.message.endswith("no such host); the node's DNS is wrong: tell its admin")


@pytest.mark.services
def test_it_refuses_on_the_node_what_submission_let_through(alice, cluster, settings):
    # Submission allowed it (say the admin's list changed since); the node's
    # own REGISTRY_ALLOWED does not, so the agent refuses before any pull.
    image = f"localhost:{free_port()}/team/x:1"
    settings.REGISTRY_ALLOWED = [image.partition("/")[0]]
    cluster.start_agent("t-node-regcheck", ports=cluster.port_range(5), gpus=1, gpu_type="REGCHECK")
    try:
        job = wait_state(services.job_submit(owner=alice, config=_config("nodecheck", image, "REGCHECK")),
                         State.FAILED, State.SUCCEEDED)
        assert job.exit_type == ExitType.IMAGE_PULL
        assert f'could not pull image {image}: the registry "{image.partition("/")[0]}" is the node itself' in job.exit_reason
    finally:
        cluster.agent("t-node-regcheck").stop()
