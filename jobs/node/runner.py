"""Launching and stopping one task attempt on a node: stage its code, make
sure of its image and network, start its container, hand it to a watcher.

A launch request is claimed in the node agent's RQ worker and carried out
on one of a few launch threads, so the worker takes the next request (or a
scheduling pass) at once and the engine starts several containers at a time
(names are the attempts' own; networks and staged folders are made safely
by concurrent launches). Everything after the start is a TaskWatcher's
(watcher.py), run by the node's log follower (follower.py).
"""

from __future__ import annotations

import calendar
import functools
import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import close_old_connections, connection

from jobs import environment, keys, services, storage
from jobs.models import ExitType, Job, SshKey, TaskAttempt
from jobs.node import launcher
from jobs.node.context import NodeContext
from jobs.node.images import ImageGate, LaunchSetAside, PullSlots, RepositoryRecord, resolve_host
from jobs.node.launch_queue import LaunchQueue
from jobs.node.staging import CodeStager, owner_reader, stage_folder
from jobs.services import db_clock
from jobs.services.access import ensure_job_key_pair
from jobs.spec import JobSpec
from jobs.spec.v2 import plugin_ssh_keys
from jobs.spec.v2_text import resolve_secrets

log = logging.getLogger(__name__)


class LaunchTiming:
    """Wall-clock moments of one launch, for bench/submit_to_running.py's
    breakdown: with PAI_BENCH_TIMING_FILE set, each launch appends one JSON
    line to that file. Without it (always, outside a bench) nothing is kept."""

    FILE = os.environ.get("PAI_BENCH_TIMING_FILE", "")

    def __init__(self, attempt_id: int) -> None:
        self.marks: dict[str, float | int] = {"attempt": attempt_id, "dequeued": time.time()} if self.FILE else {}
        if self.FILE:
            from rq import get_current_job  # the launch request's own moments

            job = get_current_job()
            if job is not None and job.func_name == "jobs.tasks.launch_task" and job.enqueued_at:  # UTC, naive or not
                moment = job.enqueued_at
                self.marks["enqueued"] = calendar.timegm(moment.utctimetuple()) + moment.microsecond / 1e6
            else:  # taken by this agent's own scheduling pass: no request went through Redis
                self.marks["enqueued"] = self.marks["dequeued"]

    def mark(self, name: str) -> None:
        if self.marks:
            self.marks[name] = time.time()

    def count(self, name: str, value: int) -> None:
        """A position in the launch order (LaunchQueue), not a moment."""
        if self.marks:
            self.marks[name] = value

    def write(self) -> None:
        if self.marks:
            with open(self.FILE, "a") as out:
                out.write(json.dumps(self.marks) + "\n")


class DefaultNetworkChanged(Exception):
    """The engine's default network stopped isolating its containers since
    the answer a launch chose its network by."""


class DefaultNetwork:
    """May one-task jobs go on the engine's default network? Its last
    answer to isolating_default_network() is kept for the next launch,
    which asks again while its container is created (a look-up of 2-14 ms
    taken off the launch's path) and does not start it on a default network
    that no longer isolates (the engine was restarted without --icc=false)."""

    def __init__(self, engine: launcher.Engine) -> None:
        self.engine = engine
        self._answer: str | None = None  # not asked yet

    def choose(self) -> tuple[str, bool]:
        """The default network if it isolates, else ""; and whether that
        is a kept answer, for `check` before the container starts."""
        if self._answer is None:
            self._answer = self.engine.isolating_default_network()
            return self._answer, False
        return self._answer, True

    def check(self, chosen: str) -> None:
        """Ask again. `chosen`: the default network a task was put on by a
        kept answer ("" when it went on ours, which is safe either way)."""
        self._answer = self.engine.isolating_default_network()
        if chosen and self._answer != chosen:
            raise DefaultNetworkChanged(chosen)


def _on_default_network_terms(ctx: LaunchContext) -> bool:
    """Whether the task's network is chosen by the engine's answer about
    its default bridge (a one-task job, SINGLE_TASK_NETWORK=isolated), not
    the job's own network."""
    return not ctx.attempt.ip and settings.SINGLE_TASK_NETWORK == "isolated"


def shared_network_name() -> str:
    return f"{settings.PAI_INSTANCE}-shared"


@dataclass
class LaunchContext:
    attempt: TaskAttempt
    job: Job
    spec: JobSpec
    me: environment.PeerTask
    peers: list[environment.PeerTask]


def _peer(attempt: TaskAttempt) -> environment.PeerTask:
    return environment.PeerTask(
        role=attempt.task.role, index=attempt.task.index, node_address=attempt.host_ip,
        engine_id=attempt.node.engine_identity if attempt.node else "", ip=attempt.ip,
        ports={label: list(ports) for label, ports in attempt.ports.items()}, gpus=tuple(attempt.gpus),
    )


def load_context(attempt_id: int) -> LaunchContext:
    attempt = TaskAttempt.objects.select_related("task", "job", "job__owner", "node", "job_attempt").get(pk=attempt_id)
    me = _peer(attempt)
    if attempt.job.total_tasks == 1:  # its only peer is itself: no second query on the launch's path
        peers = [me]
    else:
        peers = [_peer(a) for a in TaskAttempt.objects.filter(job_attempt=attempt.job_attempt).select_related("task", "node")]
    return LaunchContext(attempt=attempt, job=attempt.job, spec=attempt.job.spec, me=me, peers=peers)


def task_command(ctx: LaunchContext) -> str:
    """The role's command with protocol v2's secrets put in: only here, on
    the way into the container, never in anything stored or shown."""
    command = ctx.spec.role(ctx.me.role).command
    if not ctx.job.secrets_sealed:
        return command
    return resolve_secrets(command, keys.open_secrets(ctx.job.secrets_sealed))


def config_registry_auth(ctx: LaunchContext) -> launcher.RegistryAuth | None:
    """Credentials a v2 config gives for the task's image: its role's own,
    or the job's (the password a secret; the others may hold secrets too)."""
    _image, auth = ctx.spec.role_image(ctx.me.role)
    if not auth or ctx.spec.auth_file:
        return None
    secrets = keys.open_secrets(ctx.job.secrets_sealed)
    registry, username, password = (resolve_secrets(auth.get(key, ""), secrets)
                                    for key in ("registry", "username", "password"))
    # A username or address may hold a secret, whole or in part: every
    # secret of the job is kept out of the pull's messages, longest first
    # so that one inside another is not half shown.
    hidden = tuple(sorted({str(value) for value in secrets.values() if value}, key=len, reverse=True))
    return launcher.RegistryAuth(registry=registry, username=username, password=password, hidden=hidden)


def authorized_keys(job: Job) -> str:
    """The job's own key, the owner's Profile keys, and keys the job's v2
    ssh runtime plugin names (`userssh`)."""
    user_keys = SshKey.objects.filter(user=job.owner).values_list("public_key", flat=True)
    return "\n".join([job.ssh_public_key, *user_keys, *plugin_ssh_keys(job.spec.extras)])


def container_labels(ctx: LaunchContext, node_name: str) -> dict[str, str]:
    return {
        launcher.LABEL_INSTANCE: settings.PAI_INSTANCE,
        launcher.LABEL_NODE: node_name,
        launcher.LABEL_JOB: str(ctx.job.pk),
        launcher.LABEL_JOB_ATTEMPT: f"{ctx.job.pk}-{ctx.attempt.number}",
        launcher.LABEL_TASK_ATTEMPT: str(ctx.attempt.pk),
        launcher.LABEL_TASK: f"{ctx.me.role}-{ctx.me.index}",
        launcher.LABEL_OWNER: ctx.job.owner.username,
    }


PEER_SSH_DIR = "pai/ssh"


def peer_ssh_files(ctx: LaunchContext) -> dict[str, tuple[bytes, int]]:
    """The job's key and an ssh config naming every task, so tasks can
    `ssh <role>-<index>` to each other (MPI style). Copied into the container
    before it starts, never through its environment; the prologue adds the
    config to root's, so the image's own ~/.ssh stays as it is. Only these
    names skip host-key checks (the peers' host keys are made at start)."""
    blocks = []
    for peer in ctx.peers:
        port = (peer.ports.get(environment.SSH_PORT_LABEL) or [None])[0]
        if port:
            blocks.append(
                f"Host {peer.role}-{peer.index}\n  Port {port}\n  User root\n  IdentityFile /{PEER_SSH_DIR}/job_key\n"
                "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
            )
    return {
        f"{PEER_SSH_DIR}/job_key": (keys.open_private_key(ctx.job.ssh_private_key).encode(), 0o600),
        f"{PEER_SSH_DIR}/peers.conf": ("".join(blocks).encode(), 0o644),
    }


def _bind_address(address: str) -> str:
    """Where the node publishes task ports: its address, a host name as the
    address it resolves to. Never every interface: on the portal's machine
    that would serve a job's port at the portal's own host names too (its
    session cookie goes to any port there: review finding 1)."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        pass
    else:
        return address
    try:
        return sorted(resolve_host(address), key=lambda ip: ":" in ip)[0]  # IPv4 first, as docker -p prefers
    except (OSError, IndexError):
        raise launcher.LaunchError(ExitType.PLATFORM, f"the node's address {address} does not resolve on the node, "
                                                      "so its task ports cannot be published") from None


def web_port_addresses(ports: dict[str, list[int]]) -> dict[int, str]:
    """Web-labelled ports go on the node's loopback, for the portal's
    authenticated proxy only; the others on the node's address."""
    web = set(settings.WEB_PORT_LABELS)
    return {p: settings.NODE_WEB_PORT_ADDRESS for label, numbers in ports.items() if label in web for p in numbers}


# Launches a node makes at once (more only queue up in the engine); one
# owner's at most one less, so that another user's launch always finds a
# thread soon, however long one user's stagings last (LaunchQueue).
LAUNCH_THREADS = 5
LAUNCHES_PER_OWNER = LAUNCH_THREADS - 1


class Runner:
    """The per-node launcher; the node agent's RQ tasks call it."""

    def __init__(self, context: NodeContext) -> None:
        self.context = context
        self.engine = context.engine
        self.writer = context.writer
        self._code = CodeStager()
        engine_id = context.node.engine_id
        self._images = ImageGate(context.engine, RepositoryRecord.for_engine(engine_id),
                                 public=RepositoryRecord.for_engine(engine_id, "public-images"),
                                 slots=PullSlots(settings.IMAGE_PULLS_PER_USER), relaunch=self._relaunch)
        self._lock = threading.Lock()
        self._launching: set[int] = set()  # claimed, not yet handed to a watcher
        self._stop_asked: set[int] = set()  # of those, the ones to stop once started
        self._owners: dict[int, int | None] = {}  # of those, whose they are: their turn in the line
        self._launches: LaunchQueue[tuple[int, LaunchTiming]] = LaunchQueue(per_owner=LAUNCHES_PER_OWNER)
        self._network_locks = [threading.Lock() for _ in range(16)]
        self._default_network = DefaultNetwork(context.engine)
        for number in range(LAUNCH_THREADS):
            threading.Thread(target=self._launch_loop, name=f"launch-{number}", daemon=True).start()

    # ------------------------------------------------------------- launching

    def launch(self, attempt_id: int, owner_id: int | None = None) -> None:
        """Claim the launch (in the RQ worker) and hand it to a launch thread.
        `owner_id`: the job owner's, as the launch request says it, so that
        launches are taken in turn by owner (LaunchQueue) without a query;
        None (a request sent before requests said it) waits in a line of its own."""
        timing = LaunchTiming(attempt_id)
        if not services.attempt_claim_launch(attempt_id):
            return
        timing.mark("claimed")
        # Until its watcher is registered, reconciliation leaves it alone.
        with self._lock:
            self._launching.add(attempt_id)
            self._owners[attempt_id] = owner_id
        timing.count("taken_before", self._launches.put(owner_id, (attempt_id, timing)))

    def _relaunch(self, attempt_id: int) -> None:
        """An attempt set aside (ImageGate: its owner's pulls under way, its
        own check or pull, its registry unreachable) goes back in line, its
        owner's; it is still claimed and launching."""
        timing = LaunchTiming(attempt_id)
        # Read without self._lock, which stop() holds when it calls this: one
        # look-up in a dict only changed under that lock is safe without it.
        owner_id = self._owners.get(attempt_id)
        timing.count("taken_before", self._launches.put(owner_id, (attempt_id, timing)))

    def is_launching(self, attempt_id: int) -> bool:
        with self._lock:
            return attempt_id in self._launching

    def wait_for_launches(self, timeout: float) -> bool:
        """Let the launches under way finish (the agent is stopping)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._launching:
                    return True
            time.sleep(0.05)
        return False

    def _launch_loop(self) -> None:
        while True:
            (attempt_id, timing), owner_id, position = self._launches.get()
            timing.count("position", position)
            set_aside = False
            try:
                close_old_connections()
                self._launch_and_watch(attempt_id, timing)
            except LaunchSetAside as exc:
                set_aside = True  # still launching: ImageGate hands it back
                if exc.note:
                    self.writer.note(attempt_id, exc.note)
            except Exception:
                log.exception("launching task attempt %s failed", attempt_id)
                connection.close()
            finally:
                if not set_aside:
                    with self._lock:
                        self._launching.discard(attempt_id)
                        self._stop_asked.discard(attempt_id)
                        self._owners.pop(attempt_id, None)
                    self._images.finished(attempt_id)
                    timing.write()
                self._launches.done(owner_id)  # its thread is free, set aside or not

    def _stop_was_asked(self, attempt_id: int) -> bool:
        with self._lock:
            return attempt_id in self._stop_asked

    def _unless_stopped(self, attempt_id: int) -> None:
        if self._stop_was_asked(attempt_id):
            raise launcher.LaunchStopped()

    def _launch_and_watch(self, attempt_id: int, timing: LaunchTiming) -> None:
        try:
            container_id = self._launch(attempt_id, timing)
        except launcher.LaunchStopped:
            # Stopped before its container was made (while its image was
            # pulled, or before): it ends stopped now, its command never run.
            self.writer.note(attempt_id, "stopped before its container was made")
            self._notes_written(attempt_id)
            services.attempt_record_exit(attempt_id, services.ContainerExit(None))
            return
        except LaunchSetAside:
            raise
        except launcher.LaunchError as exc:
            self.writer.note(attempt_id, exc.message)
            self._notes_written(attempt_id)
            services.attempt_record_exit(attempt_id, services.ContainerExit(None, exit_type=exc.kind, error=exc.message))
            return
        except Exception as exc:  # our own failure: record it as such, never as the user's
            log.exception("launching task attempt %s failed", attempt_id)
            message = f"{exc.__class__.__name__}: {exc}"
            self._notes_written(attempt_id)
            services.attempt_record_exit(attempt_id, services.ContainerExit(None, exit_type=ExitType.PLATFORM, error=message))
            return
        timing.mark("run")
        # The engine's own StartedAt (not "now"): a short task may have ended
        # already, and its FinishedAt must not come before its start. On
        # the cluster's clock, as the FinishedAt will be (watcher.py).
        state = self.engine.state(container_id)
        started = db_clock.from_local(state.started_at) if state else None
        if not services.attempt_mark_running(attempt_id, container_id=container_id, started_at=started):
            # Given up meanwhile (its node was declared lost): do not leave it running.
            self.engine.remove(container_id)
            self._notes_written(attempt_id)
            return
        timing.mark("recorded")
        self.context.watchers.watch(attempt_id, container_id)
        with self._lock:
            stop = attempt_id in self._stop_asked
            self._launching.discard(attempt_id)
        watcher = self.context.watchers.get(attempt_id)
        if stop and watcher is not None:
            watcher.request_stop()

    def _notes_written(self, attempt_id: int) -> None:
        """A launch that ends here has no watcher to finish its log: make its
        notes durable (a page shows them beside the exit recorded next, never
        after it) and let the writer forget the task."""
        self.writer.barrier()
        self.writer.forget(attempt_id)

    def _launch(self, attempt_id: int, timing: LaunchTiming) -> str:
        ctx = load_context(attempt_id)
        ensure_job_key_pair(ctx.job)  # before the task's authorized keys and peer key are written
        node = self.context.node
        # A role's own image is protocol v2's, which has no authFile.
        image, _auth = ctx.spec.role_image(ctx.me.role)
        auth = config_registry_auth(ctx) or self._registry_auth(ctx)

        def ensure_image(aside: bool = True) -> None:
            self._images.ensure(image, auth, allowed=settings.REGISTRY_ALLOWED,
                                note=lambda text: self.writer.note(attempt_id, text), attempt_id=attempt_id,
                                stopped=lambda: self._stop_was_asked(attempt_id), owner=ctx.job.owner_id, aside=aside)

        self._unless_stopped(attempt_id)  # stopped while it waited for a launch thread
        ensure_image()
        code_dir = self._stage_code(ctx) if ctx.spec.code_dir else ""
        data_dir = self._stage_data(ctx) if ctx.spec.data_dir else ""
        self._unless_stopped(attempt_id)  # stopped while its folders were copied
        network, kept_answer = self._network(ctx)
        env = environment.task_environment(
            spec=ctx.spec, user_name=ctx.job.owner.username, default_fs_uri=settings.PAI_DEFAULT_FS_URI,
            me=ctx.me, peers=ctx.peers, attempt_number=ctx.attempt.number, authorized_keys=authorized_keys(ctx.job),
        )

        spec = launcher.ContainerSpec(
            name=f"{settings.PAI_INSTANCE}-task-{attempt_id}", image=image,
            command=task_command(ctx), env=env, labels=container_labels(ctx, node.name),
            hostname=f"{ctx.me.role}-{ctx.me.index}".replace("~", "-"),
            cpus=min(float(ctx.attempt.cpus), float(self.context.engine_cpus)), memory_mb=ctx.attempt.memory_mb,
            shm_mb=ctx.attempt.shm_mb, ports=sorted(p for ports in ctx.me.ports.values() for p in ports),
            bind_address=_bind_address(node.address), port_addresses=web_port_addresses(ctx.me.ports),
            network=network, ip=ctx.attempt.ip,
            extra_hosts=environment.extra_hosts(me=ctx.me, peers=ctx.peers),
            gpu_device_ids=[] if node.gpus_simulated else [str(i) for i in ctx.attempt.gpus], code_dir=code_dir,
            data_dir=data_dir,
            files=peer_ssh_files(ctx) if len(ctx.peers) > 1 else {},
        )
        timing.mark("prepared")
        # Rare (an image removed behind the node's back): waited for on the launch thread.
        return self._create_and_start(ctx, spec, kept_answer=kept_answer, ensure_image=lambda: ensure_image(aside=False))

    def _create_and_start(self, ctx: LaunchContext, spec: launcher.ContainerSpec, *, kept_answer: bool,
                          ensure_image: Callable[[], None]) -> str:
        """The container, created and started. While Docker creates it,
        outputDir is made and, if its network was chosen on a kept answer,
        the engine is asked again about its default bridge. Once each: an
        image removed since this node saw it is made sure of again, and a
        default bridge that stopped isolating sends the task to our network."""
        image_again = network_again = False
        while True:
            # The default bridge this try puts the task on by a kept answer ("": ours, safe either way).
            chosen = spec.network if spec.network != shared_network_name() else ""
            try:
                return self.engine.run(spec, alongside=functools.partial(self._before_start, ctx,
                                                                         check=kept_answer, chosen=chosen))
            except launcher.ImageMissing:
                if image_again:
                    raise
                image_again = True
                self._images.forget(spec.image)
                ensure_image()
                # The answer this try had may be minutes old after a pull: ask again.
                kept_answer = kept_answer or _on_default_network_terms(ctx)
            except DefaultNetworkChanged:
                if network_again:
                    raise
                network_again = True
                network, kept_answer = self._network(ctx)  # by the engine's answer just now
                spec = replace(spec, network=network)

    def _before_start(self, ctx: LaunchContext, *, check: bool, chosen: str) -> None:
        if check:
            self._default_network.check(chosen)
        self._make_output_dir(ctx)

    def _registry_auth(self, ctx: LaunchContext) -> launcher.RegistryAuth | None:
        """The credentials in the job's authFile, read as its owner. Only
        then is the owner's reader made: whether they are an admin is two
        queries (their permissions, their groups')."""
        if not ctx.spec.auth_file:
            return None
        try:
            data = storage.read_small_file(ctx.spec.auth_file, max_bytes=64 * 1024, reader=owner_reader(ctx.job))
            registry, username, password = storage.parse_auth_file(data)
        except storage.StorageError as exc:
            raise launcher.LaunchError(ExitType.IMAGE_PULL, f"could not read authFile: {exc}") from None
        return launcher.RegistryAuth(registry=registry, username=username, password=password)

    def _network(self, ctx: LaunchContext) -> tuple[str, bool]:
        """The task's network, and whether it was chosen on the engine's
        kept answer about its default network (to be checked again before
        the container starts)."""
        labels = {launcher.LABEL_INSTANCE: settings.PAI_INSTANCE}
        if not ctx.attempt.ip:
            # A one-task job has no peers: it runs where containers cannot
            # reach each other (settings.SINGLE_TASK_NETWORK).
            kept = False
            if _on_default_network_terms(ctx):
                default, kept = self._default_network.choose()
                if default:
                    return default, kept
            name = shared_network_name()
            with self._network_lock(name):
                self.engine.ensure_network(name, labels=labels, isolated=True)
            return name, kept
        name = ctx.attempt.job_attempt.network_name
        labels[launcher.LABEL_JOB_ATTEMPT] = f"{ctx.job.pk}-{ctx.attempt.number}"
        with self._network_lock(name):
            self.engine.ensure_network(name, labels=labels, subnet=ctx.attempt.job_attempt.subnet)
        return name, False

    def _network_lock(self, name: str) -> threading.Lock:
        """One launch at a time makes a given network: the tasks of one job
        start on several launch threads, and the engine refuses a second
        create of a network whose first is still under way ("pool overlaps")."""
        return self._network_locks[hash(name) % len(self._network_locks)]

    def _stage_code(self, ctx: LaunchContext) -> str:
        folder = stage_folder(self.context.node.name, ctx.job.pk, ctx.attempt.number)
        code, fetched_bytes = self._code.stage(folder, ctx.spec.code_dir, reader=owner_reader(ctx.job))
        if fetched_bytes is not None:
            self.writer.note(ctx.attempt.pk, f"staged codeDir {ctx.spec.code_dir} ({fetched_bytes} bytes)")
        return code

    def _stage_data(self, ctx: LaunchContext) -> str:
        folder = stage_folder(self.context.node.name, ctx.job.pk, ctx.attempt.number)
        data, said = self._code.stage_data(folder, ctx.spec.data_dir, reader=owner_reader(ctx.job))
        if said:
            self.writer.note(ctx.attempt.pk, said)
        return data

    def _make_output_dir(self, ctx: LaunchContext) -> None:
        """outputDir, made before the task's code runs (it may write to
        PAI_OUTPUT_DIR); submission only checked that it can be. Should
        storage refuse now, the task still starts, with a note: the upload of
        its /pai/output makes the folder when it ends, or says why not."""
        try:
            storage.ensure_output_dir(uri=ctx.spec.output_dir, reader=owner_reader(ctx.job))
        except storage.StorageError as exc:
            self.writer.note(ctx.attempt.pk, f"could not make outputDir {ctx.spec.output_dir}: {exc}")

    # -------------------------------------------------------------- stopping

    def stop(self, attempt_id: int) -> None:
        attempt = TaskAttempt.objects.filter(pk=attempt_id).first()
        if attempt is None or not attempt.is_active:
            return
        watcher = self.context.watchers.get(attempt_id)
        if watcher is not None:
            watcher.request_stop()
        elif attempt.container_id:
            self.engine.signal(attempt.container_id, "SIGTERM")
            self.context.watchers.watch(attempt_id, attempt.container_id)
        else:
            with self._lock:
                if attempt_id in self._launching:
                    self._stop_asked.add(attempt_id)  # stopped as soon as it has started
                    if self._images.withdraw(attempt_id):
                        self._relaunch(attempt_id)  # set aside: in line again, it ends stopped at once
                    return
            watcher = self.context.watchers.get(attempt_id)  # its launch ended meanwhile
            if watcher is not None:
                watcher.request_stop()
            else:
                services.attempt_record_exit(attempt_id, services.ContainerExit(None))
