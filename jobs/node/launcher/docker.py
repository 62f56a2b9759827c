"""The Docker implementation of the engine interface (jobs/node/launcher):
the only module of the project that imports `docker`.

It takes and returns the interface's plain dataclasses, so nothing above it
knows the SDK. The low-level API is used on the hot path (create, start,
logs) because the high-level objects inspect the container again after every
call.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import logging
import os
import re
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

import docker
import docker.auth
import docker.errors
import docker.utils
import requests.exceptions
import urllib3.exceptions
from docker.types import DeviceRequest, EndpointConfig, IPAMConfig, IPAMPool, LogConfig

from jobs.images import reference_key
from jobs.node.launcher import (
    ContainerSpec, ContainerState, EngineInfo, ImageMissing, LaunchError, LogStream, PullInterrupted, PullProgress,
    PullWatcher, RegistryAuth, RegistryHostUnknown, RegistryUnreachable, firewall,
)
from jobs.node.launcher import ENGINE_MARKER_NAME, LABEL_ENGINE_MARKER
from jobs.node.launcher.docker_logs import SocketLogStream, logs_request
from jobs.node.launcher import ContainerUsage, cgroups

log = logging.getLogger(__name__)

PROLOGUE = (Path(__file__).with_name("prologue.sh")).read_text()
# Docker's own name for its default bridge network.
DEFAULT_NETWORK = "bridge"
# How long a short command in a task's container (the sshd probe, a
# terminal's hang-up) may run before the agent stops waiting for it.
EXEC_STATUS_SECONDS = 10.0


def _docker_time(value: str | None) -> datetime | None:
    if not value or value.startswith("0001-"):
        return None
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?", value)
    if not match:
        return None
    base = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    micros = int((match.group(2) or "0")[:6].ljust(6, "0"))
    return base.replace(microsecond=micros)


def _scrub(message: str, auth: RegistryAuth | None) -> str:
    if auth:
        for secret in (auth.password, *auth.hidden):
            if secret:
                message = message.replace(secret, "********")
    return message


# What the engine says when it got no answer from a registry, as opposed to
# a refusal ("no basic auth credentials", "unauthorized", "manifest unknown",
# "denied", "blob unknown"): it could not connect, the connection broke (a
# reset, or a body cut short: "unexpected EOF"), its 25 s deadline passed,
# or the registry (or a proxy before it) answered 5xx.
_UNREACHABLE = re.compile(
    r"connection refused|connection reset|unexpected EOF|broken pipe|no route to host|network is unreachable"
    r"|i/o timeout"
    r"|context deadline exceeded|Client\.Timeout exceeded|TLS handshake timeout|server misbehaving"
    r"|temporary failure in name resolution|unexpected HTTP status: 5\d\d", re.IGNORECASE)
# What the engine (Go's resolver) says when the DNS answered that the
# registry's name does not exist, as opposed to giving no answer ("server
# misbehaving", "temporary failure in name resolution", "i/o timeout" above).
_NO_SUCH_HOST = re.compile(r"no such host", re.IGNORECASE)


def registry_unreachable(message: str) -> bool:
    """Does the engine's `message` say that the registry gave no answer?"""
    return bool(_UNREACHABLE.search(message)) and not registry_host_unknown(message)


def registry_host_unknown(message: str) -> bool:
    """Does the engine's `message` say that the registry's name does not exist?"""
    return bool(_NO_SUCH_HOST.search(message))


def _pull_failure(message: str) -> LaunchError:
    """A pull's failure as the engine told it in its events: PullInterrupted
    if the registry dropped it (after the engine's own retries of a layer),
    to be tried again later; else a refusal or a missing image, final."""
    if registry_host_unknown(message):
        return RegistryHostUnknown(message)
    if registry_unreachable(message):
        return PullInterrupted(message)
    return LaunchError("IMAGE_PULL", message)


def _registry_answer(message: str, status: int | None) -> LaunchError:
    """The engine's error answer to a request for the registry (a check, a
    pull before it began): RegistryUnreachable if the registry gave none."""
    if registry_host_unknown(message):
        return RegistryHostUnknown(message)
    if status is not None and status >= 500 and registry_unreachable(message):
        return RegistryUnreachable(message)
    return LaunchError("IMAGE_PULL", message)


class DockerEngine:
    """One Docker engine, reached at `base_url`; implements launcher.Engine."""

    def __init__(self, base_url: str, *, timeout: int = 60) -> None:
        self.base_url = base_url
        self._local = threading.local()
        self._timeout = timeout
        # Isolated networks (the shared one-task network) known to exist, so
        # a launch there costs no look-up; a failed create forgets its network
        # (removed behind our back?) and the next launch looks again.
        self._networks_known: set[str] = set()
        # Usage sampling: each container's cgroup and init process, found
        # once (None: not on this machine, ask the stats endpoint instead).
        self.cgroup_root = cgroups.CGROUP_ROOT
        self._usage_sources: dict[str, tuple[str, int] | None] = {}
        self._creators_lock = threading.Lock()
        self._creator_pool: ThreadPoolExecutor | None = None
        self._data_root: str | None = None  # see data_root(); "" once known to be out of sight

    @property
    def api(self) -> docker.APIClient:
        # One client per thread: requests' connection pools are not meant
        # to be shared by hundreds of threads each holding a log stream.
        client = getattr(self._local, "api", None)
        if client is None:
            client = docker.APIClient(base_url=self.base_url, timeout=self._timeout, version="auto")
            # requests reads the proxy, netrc and CA-bundle variables of the
            # environment again on every call: 0.15 of the 0.6 ms of CPU an
            # image inspect took here (timed in a loop). An engine is never
            # reached through an HTTP proxy; only an https:// one keeps them,
            # for a CA bundle given in REQUESTS_CA_BUNDLE.
            client.trust_env = self.base_url.startswith("https://")
            self._local.api = client
        return client

    def close_thread_client(self) -> None:
        client = getattr(self._local, "api", None)
        if client is not None:
            client.close()
            self._local.api = None

    def info(self) -> EngineInfo:
        data = self.api.info()
        return EngineInfo(id=data.get("ID", ""), name=data.get("Name", ""), cpus=int(data.get("NCPU", 1)),
                          memory_bytes=int(data.get("MemTotal", 0)))

    def engine_marker(self) -> str:
        """A volume is kept with the engine's data and survives restarts;
        creating one that exists returns it unchanged (its first labels), so
        agents starting together all read the first one's UUID."""
        try:
            labels = self.api.inspect_volume(ENGINE_MARKER_NAME).get("Labels") or {}
        except docker.errors.NotFound:
            made = self.api.create_volume(ENGINE_MARKER_NAME, labels={LABEL_ENGINE_MARKER: uuid.uuid4().hex})
            labels = made.get("Labels") or {}
        marker = labels.get(LABEL_ENGINE_MARKER, "")
        if not marker:
            raise RuntimeError(f"the volume {ENGINE_MARKER_NAME} has no label {LABEL_ENGINE_MARKER}: remove it "
                               f"(docker volume rm {ENGINE_MARKER_NAME}) and start the agent again")
        return marker

    # ---------------------------------------------------------------- images

    def has_image(self, image: str) -> bool:
        """Present under that name; Docker also finds an image by a prefix
        of its ID, which we refuse (see the interface)."""
        try:
            found = self.api.inspect_image(image)
        except docker.errors.ImageNotFound:
            return False
        wanted = reference_key(image)
        names = [*(found.get("RepoTags") or []), *(found.get("RepoDigests") or [])]
        if any(reference_key(name) == wanted for name in names):
            return True
        raise LaunchError("IMAGE_PULL", f"the image {image} names a local image by its ID; use its name "
                                        "(repository:tag), so its registry can tell whether this job may use it")

    def has_registry_digest(self, image: str) -> bool:
        try:
            found = self.api.inspect_image(image)
        except docker.errors.ImageNotFound:
            return False
        repository = reference_key(image)[0]
        return any(reference_key(name)[0] == repository for name in found.get("RepoDigests") or [])

    def check_image_access(self, image: str, auth: RegistryAuth | None) -> None:
        try:
            self.api.inspect_distribution(image, auth_config=_auth_config(auth))
        except docker.errors.APIError as exc:
            raise _registry_answer(_scrub(f"{exc.explanation or exc}", auth), exc.status_code) from None
        except requests.exceptions.RequestException as exc:  # the engine itself did not answer in time
            raise RegistryUnreachable(f"the registry could not be asked: {exc.__class__.__name__}") from None

    def ensure_image(self, image: str, auth: RegistryAuth | None = None, *,
                     progress: PullWatcher | None = None, stall_seconds: float | None = None,
                     max_mb: int | None = None, max_seconds: float | None = None,
                     max_unpacked_mb: int | None = None, min_free_mb: int | None = None) -> bool:
        """Pull `image` unless present; True if it was pulled."""
        if self.has_image(image):
            return False
        tally = PullTally()
        deadline = time.monotonic() + max_seconds if max_seconds else None
        root = self.data_root() if min_free_mb else None
        _room_left(image, root, min_free_mb)
        try:
            with contextlib.closing(self._pull_events(image, auth, stall_seconds)) as events:
                for event in events:
                    if isinstance(event, dict) and event.get("error"):
                        raise _pull_failure(_scrub(f"could not pull image {image}: {event['error']}", auth))
                    _in_time(image, deadline, max_seconds)
                    # Extraction sends news too (per 1% of the compressed
                    # layer read), so a bomb's unpacking is watched as it goes.
                    _room_left(image, root, min_free_mb)
                    if isinstance(event, dict) and tally.add(event):
                        _within(image, tally.progress(), max_mb)
                        if progress is not None:
                            progress(tally.progress())
        except docker.errors.APIError as exc:
            message = _scrub(f"could not pull image {image}: {exc.explanation or exc}", auth)
            raise _registry_answer(message, exc.status_code) from None
        except requests.exceptions.RequestException as exc:
            if _timed_out(exc):
                raise LaunchError("IMAGE_PULL", (
                    f"could not pull image {image}: the registry sent nothing for {stall_seconds:g} s "
                    "(IMAGE_PULL_STALL_SECONDS); the pull was given up")) from None
            raise LaunchError("IMAGE_PULL", f"could not pull image {image}: {exc.__class__.__name__}") from None
        if not self.has_image(image):
            raise LaunchError("IMAGE_PULL", f"could not pull image {image}: the registry sent nothing")
        self._unpacked_within(image, max_unpacked_mb)
        return True

    def data_root(self) -> str | None:
        """The folder the engine keeps images in (DockerRootDir), when this
        process sees it: the engine is reached on a unix socket, so runs on
        this machine, and the folder exists here. None otherwise (a remote
        engine): its free space cannot be watched from here. Asked once."""
        if self._data_root is None:
            root = ""
            if self.base_url.startswith("unix://"):
                root = str(self.api.info().get("DockerRootDir") or "")
            self._data_root = root if root and os.path.isdir(root) else ""
        return self._data_root or None

    def _unpacked_within(self, image: str, max_mb: int | None) -> None:
        """Refuse, and remove, a pulled image whose unpacked size (the
        engine's Size: all its layers as on the disk, those it shares with
        other images included) passes `max_mb`. The compressed limit
        (_within) cannot see a layer that expands enormously (a gzip bomb):
        the engine tells only compressed sizes while it pulls."""
        if not max_mb:
            return
        try:
            size = int(self.api.inspect_image(image).get("Size") or 0)
        except docker.errors.ImageNotFound:
            # The same pull, joined by another launch on this engine, ended
            # for both; that launch's check removed it first.
            raise LaunchError("IMAGE_PULL", f"could not pull image {image}: it was removed from the node as its "
                                            "pull ended") from None
        if size <= max_mb * 1_000_000:
            return
        self._drop_image(image)
        raise LaunchError("IMAGE_PULL", (
            f"could not pull image {image}: it unpacks to {size // 1_000_000} MB, more than {max_mb} MB "
            "(IMAGE_MAX_UNPACKED_MB)"))

    def _drop_image(self, image: str) -> bool:
        """Remove the name `image` from the engine, and with it the layers
        no other image holds, so a refused image does not keep the disk;
        False if the engine refused. It refuses while a container uses the
        image (a launch that found it present in the moment before this
        check, or an agent of the engine with a higher limit): the image
        then stays, and a launch that finds it present uses it, as it would
        any image on the node. Never forced: that would only untag it and
        leave its layers behind, unnamed. Not told to the user either way:
        whose container uses it is other users' business (finding 35)."""
        try:
            self.api.remove_image(image)
        except docker.errors.NotFound:
            return True  # removed meanwhile, by another launch's check of the same pull
        except docker.errors.APIError as exc:
            log.warning("the refused image %s could not be removed: %s", image, exc.explanation or exc)
            return False
        return True

    def _pull_events(self, image: str, auth: RegistryAuth | None, stall_seconds: float | None) -> Iterator[dict]:
        """The engine's pull events, read with at most `stall_seconds` (None:
        no limit) between two. The SDK's own pull reads without a timeout, and
        the engine has none for a layer's body: a registry that stops sending
        mid-download held the pull, and the launch that waits for it, for
        good. Closing the connection, as at the end here, makes the engine
        give up its pull too (unless another client waits for the same one)."""
        # As the SDK's pull sends it: a digest goes as the "tag".
        repository, tag = _split_image(image)
        repository, named_tag = docker.utils.parse_repository_tag(repository)
        params = {"fromImage": repository, "tag": tag or named_tag or "latest"}
        headers = {"X-Registry-Auth": docker.auth.encode_header(_auth_config(auth))}
        response = self.api.post(self.api._url("/images/create"), params=params, headers=headers, stream=True,
                                 timeout=(self._timeout, stall_seconds))
        try:
            self.api._raise_for_status(response)
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)
        finally:
            response.close()

    # -------------------------------------------------------------- networks

    def ensure_network(self, name: str, *, labels: dict[str, str], subnet: str = "", isolated: bool = False) -> None:
        """Create a bridge network unless it exists. `isolated` turns off
        traffic between its containers (the shared one-task-job network)."""
        if name in self._networks_known:
            return
        if self._network_exists(name):
            if isolated:
                self._networks_known.add(name)
            return
        ipam = None
        if subnet:
            gateway = str(next(ipaddress.ip_network(subnet).hosts()))
            ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=subnet, gateway=gateway)])
        # Our bridges' names let the node's firewall match them all (firewall.py).
        options = {"com.docker.network.bridge.name": firewall.bridge_name(name)}
        if isolated:
            options["com.docker.network.bridge.enable_icc"] = "false"
        try:
            self.api.create_network(name, driver="bridge", ipam=ipam, labels=labels, options=options, check_duplicate=True)
        except docker.errors.APIError as exc:
            # Another agent on this engine may be creating it this very moment
            # (Docker then says the pool overlaps before the name exists).
            for _ in range(25):
                if self._network_exists(name):
                    return
                time.sleep(0.2)
            raise LaunchError("PLATFORM", f"could not create network {name}: {exc.explanation or exc}") from None

    def _network_exists(self, name: str) -> bool:
        return any(n["Name"] == name for n in self.api.networks(names=[name]))

    def isolating_default_network(self) -> str:
        # An engine started as scripts/lib.sh starts it (--bridge pai-default
        # --icc=false). Worth a look-up per launch: Docker gives containers
        # on its default bridge no embedded DNS, whose set-up (a re-exec of
        # dockerd and eleven iptables calls in the container's namespace)
        # is 50-80 ms of every start on a network of ours.
        # Listed, not inspected: a network's inspect lists every container
        # on it (a node's thousand tasks), the list since API 1.28 none.
        try:
            found = self.api.networks(filters={"name": [DEFAULT_NETWORK], "type": ["builtin"]})
        except docker.errors.APIError as exc:
            raise LaunchError("PLATFORM", f"could not look up the network {DEFAULT_NETWORK}: "
                                          f"{exc.explanation or exc}") from None
        # The name filter matches a part of the name; none is dockerd --bridge=none.
        options = next((network.get("Options") or {} for network in found if network.get("Name") == DEFAULT_NETWORK), {})
        isolating = (options.get("com.docker.network.bridge.enable_icc") == "false"
                     and firewall.is_task_bridge(options.get("com.docker.network.bridge.name", "")))
        return DEFAULT_NETWORK if isolating else ""

    def remove_network(self, name: str) -> bool:
        self._networks_known.discard(name)
        try:
            self.api.remove_network(name)
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError:
            return False  # still has containers attached
        return True

    def protect_node(self, owner: str) -> None:
        try:
            firewall.install(owner)
        except firewall.FirewallError as exc:
            raise RuntimeError(f"could not install the task firewall (iptables, as root, on the engine's host): {exc}") from None

    def unprotect_node(self, owner: str) -> None:
        firewall.remove(owner)

    def networks(self, labels: dict[str, str]) -> list[tuple[str, dict[str, str], int]]:
        """(name, labels, attached containers) of our networks."""
        found = []
        for summary in self.api.networks(filters={"label": [f"{k}={v}" for k, v in labels.items()]}):
            try:
                detail = self.api.inspect_network(summary["Id"])
            except docker.errors.NotFound:
                continue  # removed since listed: by a task's end, or another agent on this engine cleaning up
            found.append((detail["Name"], detail.get("Labels") or {}, len(detail.get("Containers") or {})))
        return found

    def disconnect(self, container_id: str, network: str) -> None:
        try:
            self.api.disconnect_container_from_network(container_id, network, force=True)
        except docker.errors.APIError:
            pass

    # ------------------------------------------------------------ containers

    def run(self, spec: ContainerSpec, *, alongside: Callable[[], None] | None = None) -> str:
        """Create and start the task's container; adopt it if it exists."""
        if alongside is None:
            container_id = self._create(spec)
        else:
            # Docker's create (the container's layer, 40-100 ms) keeps a
            # thread of ours waiting: that is when `alongside` runs.
            creating = self._creators().submit(self._create, spec)
            try:
                alongside()
            except BaseException:
                self._discard(creating)
                raise
            container_id = creating.result()
        self._start(container_id)
        return container_id

    def _creators(self) -> ThreadPoolExecutor:
        with self._creators_lock:
            if self._creator_pool is None:
                # More than a node agent's launch threads (runner.LAUNCH_THREADS):
                # a create never waits for another's. Threads are made as needed.
                self._creator_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="container-create")
            return self._creator_pool

    def _discard(self, creating: Future[str]) -> None:
        """A container whose launch stopped before its start: not left behind.
        Quiet: the caller raises the reason the launch stopped."""
        if creating.exception() is not None:
            return  # nothing was made
        try:
            self.remove(creating.result())
        except Exception:  # the next launch's create adopts or replaces it (_adopt)
            log.warning("a container created for a launch that stopped could not be removed", exc_info=True)

    def _create(self, spec: ContainerSpec, *, adopt: bool = True) -> str:
        port_bindings = {f"{p}/tcp": (spec.port_addresses.get(p, spec.bind_address), p) for p in spec.ports}
        device_requests = (
            [DeviceRequest(driver="nvidia", device_ids=spec.gpu_device_ids, capabilities=[["gpu"]])]
            if spec.gpu_device_ids else None
        )
        binds = {folder: {"bind": target, "mode": "ro"}
                 for folder, target in ((spec.code_dir, "/pai/code"), (spec.data_dir, "/pai/data")) if folder} or None
        host_config = self.api.create_host_config(
            nano_cpus=int(spec.cpus * 1e9), mem_limit=spec.memory_mb * 1024 * 1024,
            memswap_limit=spec.memory_mb * 1024 * 1024, shm_size=spec.shm_mb * 1024 * 1024 if spec.shm_mb else None,
            port_bindings=port_bindings, device_requests=device_requests, binds=binds, init=True,
            extra_hosts=spec.extra_hosts or None, network_mode=spec.network, privileged=False,
            pids_limit=spec.pids_limit, log_config=LogConfig(type="json-file", config={"max-size": "200m", "max-file": "2"}),
            cap_drop=["ALL"], cap_add=list(spec.capabilities), security_opt=["no-new-privileges:true"],
        )
        # Docker's default bridge takes no aliases; networks of ours do.
        aliases = None if spec.network == DEFAULT_NETWORK else [spec.hostname]
        endpoint = EndpointConfig(version=self.api._version, ipv4_address=spec.ip or None, aliases=aliases)
        networking = self.api.create_networking_config({spec.network: endpoint})
        try:
            created = self.api.create_container(
                spec.image, command=["/bin/sh", "-c", PROLOGUE, "pai-task", spec.command], hostname=spec.hostname,
                environment=spec.env, labels=spec.labels, ports=[(p, "tcp") for p in spec.ports],
                host_config=host_config, networking_config=networking, name=spec.name, detach=True,
            )
            container_id = created["Id"]
        except docker.errors.ImageNotFound:
            raise ImageMissing(spec.image) from None
        except docker.errors.APIError as exc:
            if exc.status_code != 409 or not adopt:
                self._networks_known.discard(spec.network)
                raise LaunchError("PLATFORM", f"could not create the container: {exc.explanation or exc}") from None
            container_id = self._adopt(spec)
            if container_id is None:  # made for another network: removed, made again (files and all)
                return self._create(spec, adopt=False)
        if spec.files:
            self.api.put_archive(container_id, "/", _tar(spec.files))
        return container_id

    def _adopt(self, spec: ContainerSpec) -> str | None:
        """The container of this name a launch before this one made (the
        agent crashed, or that launch stopped before the start and could
        not remove it). One made for another network (a default bridge that
        has since stopped isolating) is removed, never started: None."""
        found = self.api.inspect_container(spec.name)
        if (found.get("HostConfig") or {}).get("NetworkMode") == spec.network:
            return found["Id"]
        self.remove(found["Id"])
        return None

    def _start(self, container_id: str) -> None:
        try:
            self.api.start(container_id)
        except docker.errors.APIError as exc:
            state = self.state(container_id)
            if state is None or not (state.running or state.finished_at):
                self.remove(container_id)
                raise LaunchError("PLATFORM", f"could not start the container: {exc.explanation or exc}") from None

    def state(self, container_id: str) -> ContainerState | None:
        try:
            data = self.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return None
        status = data["State"]
        return ContainerState(
            id=data["Id"], running=bool(status.get("Running")),
            exit_code=None if status.get("Running") else status.get("ExitCode"),
            oom_killed=bool(status.get("OOMKilled")), error=status.get("Error") or "",
            started_at=_docker_time(status.get("StartedAt")), finished_at=_docker_time(status.get("FinishedAt")),
            labels=data["Config"].get("Labels") or {},
        )

    def wait(self, container_id: str) -> ContainerState | None:
        try:
            self.api.wait(container_id, timeout=None)
        except docker.errors.NotFound:
            return None
        except requests.exceptions.RequestException:
            pass  # connection dropped; the state tells us where we are
        return self.state(container_id)

    def signal(self, container_id: str, signal: str = "SIGTERM") -> None:
        try:
            self.api.kill(container_id, signal=signal)
        except docker.errors.APIError:
            pass  # already stopped or gone: nothing left to signal

    def remove(self, container_id: str) -> None:
        try:
            # With its anonymous volumes (an image's VOLUME): else what the
            # task wrote there stays on the node's disk for good, uncounted.
            self.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise

    def containers(self, labels: dict[str, str]) -> list[ContainerState]:
        summaries = self.api.containers(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})
        states = [self.state(s["Id"]) for s in summaries]
        return [s for s in states if s is not None]

    def usage(self, container_ids: list[str]) -> dict[str, ContainerUsage]:
        """Counters of each container: from its cgroup files when the engine
        runs on this machine (about 0.1 ms each), else from the stats
        endpoint (about a second each on Docker 20.10)."""
        for gone in set(self._usage_sources) - set(container_ids):
            del self._usage_sources[gone]
        found = {}
        for container_id in container_ids:
            try:
                reading = self._usage_of(container_id)
            except (OSError, ValueError, KeyError, docker.errors.APIError, requests.exceptions.RequestException):
                self._usage_sources.pop(container_id, None)  # stopped or gone: look again next time
                continue
            if reading is not None:
                found[container_id] = reading
        return found

    def _usage_of(self, container_id: str) -> ContainerUsage | None:
        if container_id not in self._usage_sources:
            data = self.api.inspect_container(container_id)
            if not data["State"].get("Running"):
                return None
            full_id, parent = data["Id"], data["HostConfig"].get("CgroupParent") or "docker"
            group = cgroups.find_group(self.cgroup_root, [f"{parent}/{full_id}", f"system.slice/docker-{full_id}.scope"])
            self._usage_sources[container_id] = (group, int(data["State"].get("Pid") or 0)) if group else None
        source = self._usage_sources[container_id]
        if source is not None:
            return cgroups.read_usage(self.cgroup_root, *source)
        return _usage_from_stats(self.api.stats(container_id, stream=False, one_shot=True))

    def open_logs(self, container_id: str, *, since_ns: int = 0, follow: bool = True) -> LogStream:
        """Both streams of the container's log, followed on a socket of
        their own, read by the node's one log thread (docker_logs.py). The
        SDK would give each stream a blocking iterator, and so a thread."""
        request = logs_request(api_version=self.api._version, container_id=container_id, since_ns=since_ns,
                               follow=follow)
        sock = self._raw_connection()
        if sock is None:
            return self._relayed_logs(container_id, since_ns, follow)
        try:
            sock.sendall(request)
        except OSError:
            sock.close()
            raise
        return SocketLogStream(sock)

    def _raw_connection(self) -> socket.socket | None:
        """A plain connection to the engine (unix socket or TCP without TLS);
        None for the ones only the SDK speaks (TLS, ssh)."""
        scheme, _, rest = self.base_url.partition("://")
        if scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: object = "/" + rest.lstrip("/")
        elif scheme in ("tcp", "http") and not self.api.base_url.startswith("https"):
            host, _, port = rest.rstrip("/").rpartition(":")
            sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM)
            address = (host.strip("[]"), int(port or 2375))
        else:
            return None
        sock.settimeout(self._timeout)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock

    def _relayed_logs(self, container_id: str, since_ns: int, follow: bool) -> LogStream:
        """For TLS and ssh engines: the SDK reads the response in a thread of
        its own and relays it, as a plain HTTP body, into a socket pair."""
        since = since_ns // 1_000_000_000 if since_ns else None
        response = self.api._get(self.api._url("/containers/{0}/logs", container_id), stream=True, params={
            "follow": int(follow), "stdout": 1, "stderr": 1, "timestamps": 1, **({"since": since} if since else {})})
        self.api._raise_for_status(response)
        ours, theirs = socket.socketpair()

        def relay() -> None:
            try:
                theirs.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
                for chunk in response.iter_content(chunk_size=None):
                    theirs.sendall(chunk)
            except (OSError, requests.exceptions.RequestException):
                pass  # the reader closed its end, or the engine dropped the connection: the stream ends
            finally:
                theirs.close()
                response.close()

        threading.Thread(target=relay, name=f"logs-{container_id[:12]}", daemon=True).start()
        return SocketLogStream(ours)

    def exec_status(self, container_id: str, command: list[str]) -> int | None:
        """Exit code of a short command run in the container (None: could not
        run, or still running after EXEC_STATUS_SECONDS).

        Detached, its output never read: it runs the image's own /bin/sh,
        which is the user's, and what that prints must not pile up in the
        agent (attached, the SDK keeps all of it), nor a trickle of it hold
        the agent's thread for good."""
        try:
            exec_id = self.api.exec_create(container_id, command, stdout=False, stderr=False)["Id"]
            self.api.exec_start(exec_id, detach=True)
            ends = time.monotonic() + EXEC_STATUS_SECONDS
            while True:
                state = self.api.exec_inspect(exec_id)
                if not state.get("Running") and state.get("ExitCode") is not None:
                    return state["ExitCode"]
                if time.monotonic() >= ends:
                    return None
                time.sleep(0.02)
        except docker.errors.APIError:
            return None

    def archive(self, container_id: str, path: str) -> Iterator[bytes] | None:
        """A tar stream of `path` in the container (works once it stopped)."""
        try:
            stream, _stat = self.api.get_archive(container_id, path)
        except docker.errors.NotFound:
            return None
        return stream

    def open_terminal(self, container_id: str, *, command: list[str], env: list[str] | None = None) -> tuple[str, socket.socket]:
        """An interactive exec with a TTY: (exec id, a socket the caller owns).

        The SDK hands back the hijacked HTTP connection still tied to its
        response objects; we keep a duplicate and close the original, so
        closing ours really ends the connection (the engine then ends the
        shell) and nothing the SDK garbage-collects later can close it."""
        exec_id = self.api.exec_create(container_id, command, stdin=True, tty=True, environment=env)["Id"]
        hijacked = self.api.exec_start(exec_id, tty=True, socket=True)
        raw = getattr(hijacked, "_sock", hijacked)
        own = raw.dup()
        raw.close()
        hijacked.close()
        return exec_id, own

    def resize_terminal(self, exec_id: str, *, rows: int, cols: int) -> None:
        try:
            self.api.exec_resize(exec_id, height=rows, width=cols)
        except (docker.errors.APIError, requests.exceptions.RequestException):
            pass  # the shell is gone or the engine unreachable: the session ends on its own


def _usage_from_stats(stats: dict) -> ContainerUsage | None:
    """The counters in a stats endpoint answer (cgroup v1 or v2 keys)."""
    cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    memory = stats.get("memory_stats") or {}
    if "total_usage" not in cpu or "usage" not in memory:
        return None  # not running
    detail = memory.get("stats") or {}
    cache = detail.get("total_inactive_file", detail.get("inactive_file", 0))
    networks = (stats.get("networks") or {}).values()
    block = (stats.get("blkio_stats") or {}).get("io_service_bytes_recursive") or []
    return ContainerUsage(
        cpu_ns=int(cpu["total_usage"]), memory_bytes=max(0, int(memory["usage"]) - int(cache)),
        network_rx_bytes=sum(int(n.get("rx_bytes", 0)) for n in networks),
        network_tx_bytes=sum(int(n.get("tx_bytes", 0)) for n in networks),
        block_read_bytes=sum(int(b.get("value", 0)) for b in block if str(b.get("op", "")).lower() == "read"),
        block_write_bytes=sum(int(b.get("value", 0)) for b in block if str(b.get("op", "")).lower() == "write"),
    )


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        folders = sorted({str(p) for name in files for p in PurePosixPath(name).parents} - {"."})
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755  # an existing folder takes this mode too
            archive.addfile(info)
        for name, (content, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), mode
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _within(image: str, progress: PullProgress, max_mb: int | None) -> None:
    """Give the pull up once the layers it downloads are known to add up to
    more than `max_mb` (compressed, as the registry sends them; layers the
    engine has already do not count). The engine learns a layer's size as
    its download starts: a few layers at once begin before this trips."""
    if max_mb and progress.bytes_total > max_mb * 1_000_000:
        raise LaunchError("IMAGE_PULL", (
            f"could not pull image {image}: its layers are larger than {max_mb} MB (IMAGE_PULL_MAX_MB), "
            f"{progress.bytes_total // 1_000_000} MB known so far; the pull was given up"))


def _room_left(image: str, root: str | None, min_free_mb: int | None) -> None:
    """Give the pull up once the engine's disk (`root`, None: out of sight)
    has less than `min_free_mb` free: an image's unpacked size is known
    only once it is pulled (_unpacked_within), too late for a gzip bomb
    that fills the disk as it unpacks. Free to an unprivileged user, as
    `df` counts it: the root reserve is the system's, not the tasks'."""
    if not root or not min_free_mb:
        return
    disk = os.statvfs(root)
    free = disk.f_bavail * disk.f_frsize
    if free < min_free_mb * 1_000_000:
        raise LaunchError("IMAGE_PULL", (
            f"could not pull image {image}: the node's disk for images has less than {min_free_mb} MB free "
            f"(IMAGE_PULL_MIN_FREE_MB), {free // 1_000_000} MB; the pull was given up"))


def _in_time(image: str, deadline: float | None, max_seconds: float | None) -> None:
    """Give the pull up past its deadline. Checked at each piece of news: a
    registry that trickles keeps news coming (so the stall limit never
    trips) and could make a pull last for ever; one that sends nothing is
    the stall limit's."""
    if deadline is not None and time.monotonic() > deadline:
        raise LaunchError("IMAGE_PULL", (
            f"could not pull image {image}: it took longer than {max_seconds:g} s (IMAGE_PULL_MAX_SECONDS); "
            "the pull was given up"))


def _timed_out(exc: requests.exceptions.RequestException) -> bool:
    """A read that waited past its timeout: before the answer's headers
    (ReadTimeout) or within its body (requests wraps urllib3's error)."""
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args)


def _auth_config(auth: RegistryAuth | None) -> dict[str, str]:
    """The job's credentials, or explicitly none: with None the SDK would
    send whatever `docker login` stored on the node."""
    if auth is None:
        return {}
    return {"username": auth.username, "password": auth.password, "serveraddress": auth.registry}


class PullTally:
    """Adds up a pull's JSON events into a PullProgress. Each layer has its
    own events, keyed by its short ID: "Pulling fs layer"/"Waiting" name it,
    "Downloading" carries progressDetail current/total (bytes of the
    compressed layer), "Download complete" ends its download, "Extracting"
    follows, and "Pull complete" or "Already exists" means the engine has
    it. Events without a layer ID ("Pulling from ...", "Digest: ...") and
    those for the tag itself are not layers."""

    LAYER_NAMED = frozenset({"Pulling fs layer", "Waiting", "Downloading", "Verifying Checksum",
                             "Download complete", "Extracting", "Pull complete", "Already exists", "Retrying"})
    DOWNLOADED = frozenset({"Verifying Checksum", "Download complete", "Extracting", "Pull complete"})
    HAVE = frozenset({"Pull complete", "Already exists"})

    def __init__(self) -> None:
        self._current: dict[str, int] = {}
        self._total: dict[str, int] = {}
        self._done: set[str] = set()

    def add(self, event: dict) -> bool:
        """Take one event; True if it was about a layer."""
        layer, status = event.get("id"), str(event.get("status") or "")
        if not layer or status.split(" in ")[0] not in self.LAYER_NAMED:
            return False  # "Retrying in 5 seconds" keeps its layer's place
        detail = event.get("progressDetail") or {}
        self._current.setdefault(layer, 0)
        if status == "Downloading" and isinstance(detail.get("total"), int):
            self._total[layer] = detail["total"]
            self._current[layer] = int(detail.get("current") or 0)
        elif status in self.DOWNLOADED and layer in self._total:
            self._current[layer] = self._total[layer]
        if status in self.HAVE:
            self._done.add(layer)
        return True

    def progress(self) -> PullProgress:
        unsized = [layer for layer in self._current if layer not in self._total and layer not in self._done]
        return PullProgress(layers_done=len(self._done), layers_total=len(self._current),
                            bytes_done=sum(self._current.values()), bytes_total=sum(self._total.values()),
                            sizes_pending=len(unsized))


def _split_image(image: str) -> tuple[str, str]:
    """("repo", "tag") for pull; digests stay in the repository part."""
    if "@" in image:
        return image, ""
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = image.rsplit(":", 1)
        return repository, tag
    return image, "latest"
