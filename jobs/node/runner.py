"""Launching and stopping one task attempt on a node: stage its code, make
sure of its image and network, start its container, hand it to a watcher.

Launching happens in the node agent's RQ worker (one at a time, so a node
never races itself for a name or a network); everything after the start runs
in a TaskWatcher thread (watcher.py), so no RQ job lasts longer than a launch.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

from django.conf import settings

from jobs import environment, keys, services, storage
from jobs.models import ExitType, Job, SshKey, TaskAttempt
from jobs.node import launcher
from jobs.node.context import NodeContext
from jobs.node.images import ImageGate, PrivateImages
from jobs.node.staging import CodeStager, owner_reader, stage_folder
from jobs.spec import JobSpec
from jobs.spec.v2 import plugin_ssh_keys
from jobs.spec.v2_text import resolve_secrets

log = logging.getLogger(__name__)


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
        engine_id=attempt.node.engine_id if attempt.node else "", ip=attempt.ip,
        ports={label: list(ports) for label, ports in attempt.ports.items()}, gpus=tuple(attempt.gpus),
    )


def load_context(attempt_id: int) -> LaunchContext:
    attempt = TaskAttempt.objects.select_related("task", "job", "job__owner", "node", "job_attempt").get(pk=attempt_id)
    peers = [_peer(a) for a in TaskAttempt.objects.filter(job_attempt=attempt.job_attempt).select_related("task", "node")]
    return LaunchContext(attempt=attempt, job=attempt.job, spec=attempt.job.spec, me=_peer(attempt), peers=peers)


def task_command(ctx: LaunchContext) -> str:
    """The role's command with protocol v2's secrets put in: only here, on
    the way into the container, never in anything stored or shown."""
    command = ctx.spec.role(ctx.me.role).command
    if not ctx.job.secrets_sealed:
        return command
    return resolve_secrets(command, keys.open_secrets(ctx.job.secrets_sealed))


def config_registry_auth(ctx: LaunchContext) -> launcher.RegistryAuth | None:
    """Credentials a v2 config gives for the task's image: its role's own,
    or the job's (the password a secret)."""
    _image, auth = ctx.spec.role_image(ctx.me.role)
    if not auth or ctx.spec.auth_file:
        return None
    password = resolve_secrets(auth.get("password", ""), keys.open_secrets(ctx.job.secrets_sealed))
    return launcher.RegistryAuth(registry=auth.get("registry", ""), username=auth.get("username", ""), password=password)


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
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return "0.0.0.0"  # a host name: publish on every interface of the node
    return address


def web_port_addresses(ports: dict[str, list[int]]) -> dict[int, str]:
    """Web-labelled ports go on the node's loopback, for the portal's
    authenticated proxy only; the others on the node's address."""
    web = set(settings.WEB_PORT_LABELS)
    return {p: settings.NODE_WEB_PORT_ADDRESS for label, numbers in ports.items() if label in web for p in numbers}


class Runner:
    """The per-node launcher; the node agent's RQ tasks call it."""

    def __init__(self, context: NodeContext) -> None:
        self.context = context
        self.engine = context.engine
        self.writer = context.writer
        self._code = CodeStager()
        self._images = ImageGate(context.engine, PrivateImages.for_engine(context.node.engine_id))
        self.launching: int | None = None

    # ------------------------------------------------------------- launching

    def launch(self, attempt_id: int) -> None:
        if not services.attempt_claim_launch(attempt_id):
            return
        # While set, reconciliation leaves this attempt alone: it is ours
        # until its watcher is registered.
        self.launching = attempt_id
        try:
            self._launch_and_watch(attempt_id)
        finally:
            self.launching = None

    def _launch_and_watch(self, attempt_id: int) -> None:
        try:
            container_id = self._launch(attempt_id)
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
        state = self.engine.state(container_id)
        started = state.started_at if state else None
        if not services.attempt_mark_running(attempt_id, container_id=container_id, started_at=started):
            # Given up meanwhile (its node was declared lost): do not leave it running.
            self.engine.remove(container_id)
            self._notes_written(attempt_id)
            return
        self.context.watchers.watch(attempt_id, container_id)

    def _notes_written(self, attempt_id: int) -> None:
        """A launch that ends here has no watcher to finish its log: make its
        notes durable (a page shows them beside the exit recorded next, never
        after it) and let the writer forget the task."""
        self.writer.barrier()
        self.writer.forget(attempt_id)

    def _launch(self, attempt_id: int) -> str:
        ctx = load_context(attempt_id)
        node = self.context.node
        # A role's own image is protocol v2's, which has no authFile.
        image, _auth = ctx.spec.role_image(ctx.me.role)
        auth = config_registry_auth(ctx) or self._registry_auth(ctx.spec, reader=owner_reader(ctx.job))
        self._images.ensure(image, auth, allowed=settings.REGISTRY_ALLOWED,
                            note=lambda text: self.writer.note(attempt_id, text))
        code_dir = self._stage_code(ctx) if ctx.spec.code_dir else ""
        network = self._network(ctx)
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
            files=peer_ssh_files(ctx) if len(ctx.peers) > 1 else {},
        )
        return self.engine.run(spec)

    def _registry_auth(self, spec: JobSpec, *, reader: storage.Reader) -> launcher.RegistryAuth | None:
        if not spec.auth_file:
            return None
        try:
            data = storage.read_small_file(spec.auth_file, max_bytes=64 * 1024, reader=reader)
            registry, username, password = storage.parse_auth_file(data)
        except storage.StorageError as exc:
            raise launcher.LaunchError(ExitType.IMAGE_PULL, f"could not read authFile: {exc}") from None
        return launcher.RegistryAuth(registry=registry, username=username, password=password)

    def _network(self, ctx: LaunchContext) -> str:
        labels = {launcher.LABEL_INSTANCE: settings.PAI_INSTANCE}
        if not ctx.attempt.ip:
            # A one-task job has no peers: one shared network where containers
            # cannot reach each other (never Docker's default bridge, where
            # every job reached every other). Costs ~30 ms per start.
            name = shared_network_name()
            self.engine.ensure_network(name, labels=labels, isolated=True)
            return name
        name = ctx.attempt.job_attempt.network_name
        labels[launcher.LABEL_JOB_ATTEMPT] = f"{ctx.job.pk}-{ctx.attempt.number}"
        self.engine.ensure_network(name, labels=labels, subnet=ctx.attempt.job_attempt.subnet)
        return name

    def _stage_code(self, ctx: LaunchContext) -> str:
        folder = stage_folder(self.context.node.name, ctx.job.pk, ctx.attempt.number)
        code, fetched_bytes = self._code.stage(folder, ctx.spec.code_dir, reader=owner_reader(ctx.job))
        if fetched_bytes is not None:
            self.writer.note(ctx.attempt.pk, f"staged codeDir {ctx.spec.code_dir} ({fetched_bytes} bytes)")
        return code

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
        elif attempt_id != self.launching:
            services.attempt_record_exit(attempt_id, services.ContainerExit(None))
