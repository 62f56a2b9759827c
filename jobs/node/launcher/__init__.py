"""The engine interface: what the node agent and the browser terminal ask of
a container engine, in plain dataclasses, and the registry that finds the
engine for a URL.

`docker.py` is the Docker implementation, and the only module of the project
that imports the Docker SDK. Another backend (Kubernetes, Slurm ...) is one
module that implements `Engine` and calls `register_engine` for its URL
schemes; nothing above this package changes. Nothing here imports Django.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

# Labels on everything we create; `instance` keeps portals that share an
# engine (a test run beside a live portal) out of each other's way.
LABEL_INSTANCE = "pai.instance"
LABEL_NODE = "pai.node"
LABEL_JOB = "pai.job"
LABEL_JOB_ATTEMPT = "pai.job-attempt"
LABEL_TASK_ATTEMPT = "pai.task-attempt"
LABEL_TASK = "pai.task"
LABEL_OWNER = "pai.user"
# The engine's own identity (see Engine.engine_marker): a volume of this
# name, labelled with a random UUID, made by the first agent on the engine.
ENGINE_MARKER_NAME = "pai-engine-marker"
LABEL_ENGINE_MARKER = "pai.engine-marker"


class LaunchError(Exception):
    """A task could not start. `kind` is an ExitType name: IMAGE_PULL or PLATFORM."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class LaunchStopped(Exception):
    """The task was stopped before its container was made (while it waited
    for a launch thread, its image's pull or its folders): the launch ends
    there, and the task ends stopped, its command never run."""


class RegistryUnreachable(LaunchError):
    """The registry could not be asked (connection refused or reset, a
    timeout, a 5xx answer): no answer about the image, unlike a refusal,
    and maybe a passing one (Engine.check_image_access)."""

    def __init__(self, message: str) -> None:
        super().__init__("IMAGE_PULL", message)


class RegistryHostUnknown(LaunchError):
    """The engine's DNS says the registry's host name does not exist (Go's
    "no such host"): a typo in the image's name, most likely; not waited
    for, unlike a DNS that gives no answer (RegistryUnreachable)."""

    def __init__(self, message: str) -> None:
        super().__init__("IMAGE_PULL", message)


class PullInterrupted(RegistryUnreachable):
    """The registry dropped a pull under way (a connection reset, a
    timeout, a body cut short: Engine.ensure_image), as opposed to refusing
    it or not having the image: waited for as a registry that cannot be
    reached is (finding 46)."""


class ImageMissing(LaunchError):
    """The engine has no image of that name (Engine.run): removed since the
    node last saw it. The caller may make sure of it again and retry."""

    def __init__(self, image: str) -> None:
        super().__init__("IMAGE_PULL", f"the image {image} is not on the node")
        self.image = image


# Capabilities a task keeps: Docker's default set less NET_RAW (raw sockets:
# spoofing, ARP tricks on the bridge), MKNOD, SETFCAP, SETPCAP and
# AUDIT_WRITE. Root in a task can still install packages, chown files and
# run sshd (SETUID, SETGID and SYS_CHROOT for its privilege separation).
TASK_CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SYS_CHROOT", "NET_BIND_SERVICE",
)


@dataclass(frozen=True)
class RegistryAuth:
    registry: str
    username: str
    password: str
    # A job's secrets (a username or registry address can hold one, whole or
    # in part), kept out of messages like the password; not part of what
    # the credentials are, so not compared.
    hidden: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class PullProgress:
    """How far an image pull has come: layers the engine named so far and
    those it has (pulled, or already on the engine), and the bytes
    downloaded of the layers whose size it told (compressed, as sent). The
    engine tells a layer's size when it starts downloading it, a few at a
    time: `sizes_pending` layers are still to come on top of `bytes_total`."""

    layers_done: int = 0
    layers_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    sizes_pending: int = 0


PullWatcher = Callable[[PullProgress], None]


@dataclass(frozen=True)
class EngineInfo:
    id: str
    name: str
    cpus: int
    memory_bytes: int


@dataclass
class ContainerSpec:
    name: str
    image: str
    command: str
    env: dict[str, str]
    labels: dict[str, str]
    hostname: str
    cpus: float
    memory_mb: int
    shm_mb: int
    ports: list[int]
    bind_address: str
    network: str
    # Ports published elsewhere than bind_address: web ports, on the node's
    # loopback only, for the portal's proxy (SECURITY.md, "Web ports").
    port_addresses: dict[int, str] = field(default_factory=dict)
    ip: str = ""
    extra_hosts: dict[str, str] = field(default_factory=dict)
    gpu_device_ids: list[str] = field(default_factory=list)
    code_dir: str = ""  # host folder mounted read-only at /pai/code
    data_dir: str = ""  # host folder mounted read-only at /pai/data (a copy of dataDir)
    pids_limit: int = 4096
    # Files copied in before the start: {"pai/ssh/peers.conf": (content, mode)}.
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    # Every other capability is dropped; no process gains privileges through
    # setuid binaries or file capabilities (no-new-privileges).
    capabilities: tuple[str, ...] = TASK_CAPABILITIES


@dataclass(frozen=True)
class ContainerState:
    id: str
    running: bool
    exit_code: int | None
    oom_killed: bool
    error: str
    started_at: datetime | None
    finished_at: datetime | None
    labels: dict[str, str]


@dataclass(frozen=True)
class ContainerUsage:
    """A container's resource counters at one moment, as the kernel keeps
    them: CPU time and I/O only grow, so rates come from two readings."""

    cpu_ns: int  # CPU time used since the container started
    memory_bytes: int  # in use, less the page cache the kernel may reclaim (as `docker stats`)
    network_rx_bytes: int
    network_tx_bytes: int
    block_read_bytes: int
    block_write_bytes: int


class LogStream(Protocol):
    """One container's followed logs (both streams), read without blocking."""

    ended: bool  # no more entries will come (the container stopped, or the connection broke)

    def fileno(self) -> int:
        """What to select on: readable when `read` has something (or the end)."""

    def read(self) -> list[tuple[int, int, bytes]]:
        """(stream: 1 stdout / 2 stderr, timestamp in ns since the epoch,
        payload) of each entry that arrived, in order; never blocks. A long
        line may come as several entries; only the last ends in a newline."""

    def close(self) -> None: ...


class Engine(Protocol):
    """One container engine. Safe to share between threads: the node agent
    calls it from its worker, its reconcile loop and its task helpers at once."""

    def info(self) -> EngineInfo:
        """The engine's id (the same for every node agent on this engine),
        name, CPUs and memory. Raises if the engine cannot be reached."""

    def engine_marker(self) -> str:
        """This engine's own identity, which decides whether two nodes share
        an engine (and so a job network's addresses): a random UUID kept in
        the engine itself, made by the first agent that asks, the same for
        every agent on this engine. Unlike `info().id` (from the host's
        /etc/docker/key.json) it does not collide between cloned machines,
        unless the engine's data itself was copied. Raises if the engine
        cannot be reached."""

    def close_thread_client(self) -> None:
        """Drop what the calling thread holds open (a thread about to end
        calls it); the next call from this thread opens a new one."""

    # ---------------------------------------------------------------- images

    def has_image(self, image: str) -> bool:
        """Is `image` present on the engine under that very name, so a launch
        needs no pull? A name that only matches a local image's ID (`3f57d9`)
        raises LaunchError("IMAGE_PULL"): it would reach an image without the
        registry's say, whoever pulled it."""

    def has_registry_digest(self, image: str) -> bool:
        """Did `image` (present) come from a registry, by a pull or a push:
        does the engine hold a digest of it for its repository? An image
        built or loaded on the node has none."""

    def check_image_access(self, image: str, auth: RegistryAuth | None) -> None:
        """Ask the image's registry, without pulling, whether `auth` (None:
        no credentials) may pull `image`; raises LaunchError("IMAGE_PULL")
        with the registry's answer if not, RegistryUnreachable if there was
        none, RegistryHostUnknown if the registry's name does not resolve."""

    def ensure_image(self, image: str, auth: RegistryAuth | None = None, *,
                     progress: PullWatcher | None = None, stall_seconds: float | None = None,
                     max_mb: int | None = None, max_seconds: float | None = None,
                     max_unpacked_mb: int | None = None, min_free_mb: int | None = None) -> bool:
        """Pull `image` unless present; True if it was pulled. Raises
        LaunchError("IMAGE_PULL") with a message fit for the user, which
        never holds the registry password. `progress` is called, in the
        caller's thread, at each piece of news from the pull (often: it
        should be cheap or throttle itself). A pull with no news for
        `stall_seconds` (None: no limit) is given up, an IMAGE_PULL; so is
        one whose new layers are known to pass `max_mb` (compressed), and
        one still under way after `max_seconds`. A pulled image that unpacks
        to more than `max_unpacked_mb` (the engine's size of it, known only
        once pulled) is an IMAGE_PULL too, and removed from the engine
        unless a container uses it. Where the engine's disk can be seen
        from here, a pull is given up (or not begun) once it has less than
        `min_free_mb` free. One the registry dropped
        (the engine says its connection was reset or timed out) raises
        PullInterrupted, after the engine's own retries of a layer."""

    # -------------------------------------------------------------- networks

    def ensure_network(self, name: str, *, labels: dict[str, str], subnet: str = "", isolated: bool = False) -> None:
        """Create a network unless it exists (another agent on the engine may
        be creating it at the same moment: that is success). `subnet` fixes
        its addresses; `isolated` stops traffic between its containers.
        Raises LaunchError("PLATFORM")."""

    def isolating_default_network(self) -> str:
        """The engine's default network if it isolates its containers as the
        shared one-task network does (traffic between them off, and a bridge
        the node's firewall matches), else "". Asked at every launch (while
        the container is created, and before it starts), so an engine
        restarted without that set-up is noticed at its next task."""

    def remove_network(self, name: str) -> bool:
        """Remove a network; True if it is gone, False if containers still use it."""

    def protect_node(self, owner: str) -> None:
        """Keep task containers away from the node itself (every port but
        published task ports) and from cloud metadata addresses, until
        `unprotect_node(owner)`; `owner` names the caller's copy of the
        rules. Raises if it cannot (the agent must not start then)."""

    def unprotect_node(self, owner: str) -> None:
        """Remove the copy of the rules `owner` installed."""

    def networks(self, labels: dict[str, str]) -> list[tuple[str, dict[str, str], int]]:
        """(name, labels, number of attached containers) of every network
        carrying all of `labels`."""

    def disconnect(self, container_id: str, network: str) -> None:
        """Take a container off a network; quiet if it is not on it."""

    # ------------------------------------------------------------ containers

    def run(self, spec: ContainerSpec, *, alongside: Callable[[], None] | None = None) -> str:
        """Create and start a task's container and return its id. A container
        of that name that exists already is adopted (a launch retried after a
        crash). The container runs the prologue, then `spec.command`.
        Raises ImageMissing when the engine has no `spec.image`, else
        LaunchError("PLATFORM"); a container that could not start is removed
        first. `alongside` is run in the calling thread while the container
        is created, and always before it starts: what must hold before the
        task's code runs but not before its container exists. If it raises,
        the container is removed and its exception raised."""

    def state(self, container_id: str) -> ContainerState | None:
        """The container's state now; None if it does not exist."""

    def wait(self, container_id: str) -> ContainerState | None:
        """Block until the container stops, then its state; None if it does
        not exist (any more)."""

    def signal(self, container_id: str, signal: str = "SIGTERM") -> None:
        """Send a signal by name; quiet if the container has stopped or is gone."""

    def remove(self, container_id: str) -> None:
        """Remove the container, running or not; quiet if it is gone."""

    def containers(self, labels: dict[str, str]) -> list[ContainerState]:
        """Every container, running or stopped, carrying all of `labels`."""

    def usage(self, container_ids: list[str]) -> dict[str, ContainerUsage]:
        """The counters of each running container of `container_ids` (one
        cheap read each, no stream); those that cannot be read are left out."""

    def open_logs(self, container_id: str, *, since_ns: int = 0, follow: bool = True) -> LogStream:
        """Both of the container's log streams, from `since_ns` (entries at
        or after it, possibly some before: the caller skips what it stored),
        until the container stops or the connection breaks (`follow`), or
        until the end of what is stored now. Returns at once; the node's one
        log thread reads it when it is readable. A container that does not
        exist gives a stream that ends with nothing."""

    def exec_status(self, container_id: str, command: list[str]) -> int | None:
        """Exit code of a short command run in the running container; None
        if it could not be run."""

    def archive(self, container_id: str, path: str) -> Iterator[bytes] | None:
        """A tar stream of `path` in the container (works once it stopped);
        None if there is no such path or container."""

    # -------------------------------------------------------------- terminal

    def open_terminal(
        self, container_id: str, *, command: list[str], env: list[str] | None = None
    ) -> tuple[str, socket.socket]:
        """Start `command` with a TTY in the container: (exec id, a socket
        the caller owns). Closing the socket ends the session."""

    def resize_terminal(self, exec_id: str, *, rows: int, cols: int) -> None:
        """Tell a terminal its new size; quiet if the session is gone."""


# ------------------------------------------------------------------ registry

_FACTORIES: dict[str, Callable[[str], Engine]] = {}


def register_engine(scheme: str, factory: Callable[[str], Engine]) -> None:
    """Engines for URLs `scheme://...` are made by `factory(url)`."""
    _FACTORIES[scheme] = factory


def engine_for(url: str) -> Engine:
    """The engine at `url` (settings.DOCKER_HOST, a node's docker_host)."""
    scheme, found, _rest = url.partition("://")
    factory = _FACTORIES.get(scheme) if found else None
    if factory is None:
        known = ", ".join(f"{s}://" for s in sorted(_FACTORIES))
        raise ValueError(f"no engine for {url!r}: known schemes are {known}")
    return factory(url)


def _docker(url: str) -> Engine:
    # Imported on first use, so that reading this interface (or running
    # another backend) does not load the Docker SDK.
    from jobs.node.launcher.docker import DockerEngine

    return DockerEngine(url)


for _scheme in ("unix", "tcp", "http", "https", "ssh", "npipe"):
    register_engine(_scheme, _docker)
