"""One task attempt on a node: stage code, launch the container, stream its
logs into the database, record its exit, clean up.

Launching happens in the node agent's RQ worker (one at a time, so a node
never races itself for a name or a network); everything after the start runs
in a TaskWatcher thread, so no RQ job lasts longer than a launch.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection

from jobs import environment, launcher, services, storage
from jobs.logs import LineAssembler, LogWriter, write_note
from jobs.models import ACTIVE_TASK_STATES, ExitType, Job, SshKey, Stream, TaskAttempt, TaskState
from jobs.spec import JobSpec

if TYPE_CHECKING:
    from jobs.agent import NodeAgent

log = logging.getLogger(__name__)

MB = 1024 * 1024


def shared_network_name() -> str:
    return f"{settings.PAI_INSTANCE}-shared"


def stage_root(node_name: str) -> Path:
    return settings.STAGE_DIR / settings.PAI_INSTANCE / node_name


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
    return LaunchContext(attempt=attempt, job=attempt.job, spec=services.spec_of(attempt.job), me=_peer(attempt), peers=peers)


def authorized_keys(job: Job) -> str:
    user_keys = SshKey.objects.filter(user=job.owner).values_list("public_key", flat=True)
    return "\n".join([job.ssh_public_key, *user_keys])


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
        f"{PEER_SSH_DIR}/job_key": (ctx.job.ssh_private_key.encode(), 0o600),
        f"{PEER_SSH_DIR}/peers.conf": ("".join(blocks).encode(), 0o644),
    }


def _bind_address(address: str) -> str:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return "0.0.0.0"  # a host name: publish on every interface of the node
    return address


class Runner:
    """The per-node launcher; owned by the NodeAgent."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent
        self.engine = agent.engine
        self._stage_locks: dict[str, threading.Lock] = {}
        self._stage_guard = threading.Lock()
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
            write_note(attempt_id, exc.message)
            services.attempt_record_exit(attempt_id, services.ContainerExit(None, exit_type=exc.kind, error=exc.message))
            return
        except Exception as exc:  # our own failure: record it as such, never as the user's
            log.exception("launching task attempt %s failed", attempt_id)
            message = f"{exc.__class__.__name__}: {exc}"
            services.attempt_record_exit(attempt_id, services.ContainerExit(None, exit_type=ExitType.PLATFORM, error=message))
            return
        state = self.engine.state(container_id)
        started = state.started_at if state else None
        if not services.attempt_mark_running(attempt_id, container_id=container_id, started_at=started):
            # Given up meanwhile (its node was declared lost): do not leave it running.
            self.engine.remove(container_id)
            return
        self.agent.watch(attempt_id, container_id)

    def _launch(self, attempt_id: int) -> str:
        ctx = load_context(attempt_id)
        node = self.agent.node
        auth = self._registry_auth(ctx.spec)
        if not self.engine.has_image(ctx.spec.image):
            write_note(attempt_id, f"pulling image {ctx.spec.image}")
            self.engine.ensure_image(ctx.spec.image, auth)
            write_note(attempt_id, f"pulled image {ctx.spec.image}")
        code_dir = self._stage_code(ctx) if ctx.spec.code_dir else ""
        network = self._network(ctx)
        env = environment.task_environment(
            spec=ctx.spec, user_name=ctx.job.owner.username, default_fs_uri=settings.PAI_DEFAULT_FS_URI,
            me=ctx.me, peers=ctx.peers, attempt_number=ctx.attempt.number, authorized_keys=authorized_keys(ctx.job),
        )

        spec = launcher.ContainerSpec(
            name=f"{settings.PAI_INSTANCE}-task-{attempt_id}", image=ctx.spec.image,
            command=ctx.spec.role(ctx.me.role).command, env=env, labels=container_labels(ctx, node.name),
            hostname=f"{ctx.me.role}-{ctx.me.index}".replace("~", "-"),
            cpus=min(float(ctx.attempt.cpus), float(self.agent.engine_cpus)), memory_mb=ctx.attempt.memory_mb,
            shm_mb=ctx.attempt.shm_mb, ports=sorted(p for ports in ctx.me.ports.values() for p in ports),
            bind_address=_bind_address(node.address), network=network, ip=ctx.attempt.ip,
            extra_hosts=environment.extra_hosts(me=ctx.me, peers=ctx.peers),
            gpu_device_ids=[] if node.gpus_simulated else [str(i) for i in ctx.attempt.gpus], code_dir=code_dir,
            files=peer_ssh_files(ctx) if len(ctx.peers) > 1 else {},
        )
        return self.engine.run(spec)

    def _registry_auth(self, spec: JobSpec) -> launcher.RegistryAuth | None:
        if not spec.auth_file:
            return None
        try:
            data = storage.read_small_file(spec.auth_file, max_bytes=64 * 1024)
            registry, username, password = storage.parse_auth_file(data)
        except storage.StorageError as exc:
            raise launcher.LaunchError(ExitType.IMAGE_PULL, f"could not read authFile: {exc}") from None
        return launcher.RegistryAuth(registry=registry, username=username, password=password)

    def _network(self, ctx: LaunchContext) -> str:
        labels = {launcher.LABEL_INSTANCE: settings.PAI_INSTANCE}
        if not ctx.attempt.ip:
            # A one-task job has no peers. Docker's default bridge starts a
            # container ~70 ms faster than a network of ours; the isolated
            # shared network (no traffic between containers) is opt-in.
            if settings.SINGLE_TASK_NETWORK == "bridge":
                return "bridge"
            name = shared_network_name()
            self.engine.ensure_network(name, labels=labels, isolated=True)
            return name
        name = ctx.attempt.job_attempt.network_name
        labels[launcher.LABEL_JOB_ATTEMPT] = f"{ctx.job.pk}-{ctx.attempt.number}"
        self.engine.ensure_network(name, labels=labels, subnet=ctx.attempt.job_attempt.subnet)
        return name

    def _stage_code(self, ctx: LaunchContext) -> str:
        """Fetch codeDir once per job attempt and node; later tasks reuse it."""
        folder = stage_root(self.agent.node.name) / f"job-{ctx.job.pk}-{ctx.attempt.number}"
        with self._stage_guard:
            lock = self._stage_locks.setdefault(str(folder), threading.Lock())
        with lock:
            code = folder / "code"
            if (folder / ".complete").exists():
                return str(code)
            partial = folder / "code.partial"
            shutil.rmtree(partial, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            try:
                size = storage.stage_tree(ctx.spec.code_dir, partial, max_bytes=settings.CODE_DIR_MAX_MB * MB)
            except storage.StorageError as exc:
                shutil.rmtree(partial, ignore_errors=True)
                raise launcher.LaunchError(ExitType.PLATFORM, f"could not fetch codeDir {ctx.spec.code_dir}: {exc}") from None
            shutil.rmtree(code, ignore_errors=True)
            partial.rename(code)
            (folder / ".complete").touch()
            write_note(ctx.attempt.pk, f"staged codeDir {ctx.spec.code_dir} ({size} bytes)")
            return str(code)

    # -------------------------------------------------------------- stopping

    def stop(self, attempt_id: int) -> None:
        attempt = TaskAttempt.objects.filter(pk=attempt_id).first()
        if attempt is None or not attempt.is_active:
            return
        watcher = self.agent.watchers.get(attempt_id)
        if watcher is not None:
            watcher.request_stop()
        elif attempt.container_id:
            self.engine.signal(attempt.container_id, "SIGTERM")
            self.agent.watch(attempt_id, attempt.container_id)
        elif attempt_id != self.launching:
            services.attempt_record_exit(attempt_id, services.ContainerExit(None))


class TaskWatcher(threading.Thread):
    """Follows one container: its two log streams, its exit, its clean-up."""

    def __init__(self, agent: NodeAgent, attempt_id: int, container_id: str) -> None:
        super().__init__(name=f"task-{attempt_id}", daemon=True)
        self.agent = agent
        self.engine = agent.engine
        self.writer: LogWriter = agent.writer
        self.attempt_id = attempt_id
        self.container_id = container_id
        self._stop_requests = 0
        self._kill_timer: threading.Timer | None = None

    def run(self) -> None:
        try:
            self._probe_ssh()
            stderr = threading.Thread(target=self._follow_safely, args=(Stream.STDERR,), daemon=True)
            stderr.start()
            self._follow_safely(Stream.STDOUT)
            stderr.join()
            self._finish()
        except Exception:
            log.exception("watching task attempt %s failed", self.attempt_id)
        finally:
            if self._kill_timer:
                self._kill_timer.cancel()
            self.agent.watchers.pop(self.attempt_id, None)
            self.engine.close_thread_client()
            connection.close()

    def request_stop(self) -> None:
        """SIGTERM now, SIGKILL after the grace period; a second request kills at once."""
        self._stop_requests += 1
        if self._stop_requests > 1:
            self.engine.signal(self.container_id, "SIGKILL")
            return
        self.engine.signal(self.container_id, "SIGTERM")
        self._kill_timer = threading.Timer(settings.STOP_GRACE_SECONDS, self.engine.signal, (self.container_id, "SIGKILL"))
        self._kill_timer.daemon = True
        self._kill_timer.start()

    def _probe_ssh(self) -> None:
        attempt = TaskAttempt.objects.filter(pk=self.attempt_id).only("ssh_available", "state").first()
        if attempt is None or attempt.ssh_available is not None:
            return
        code = self.engine.exec_status(self.container_id, ["/bin/sh", "-c", "test -x /usr/sbin/sshd"])
        if code is not None:
            TaskAttempt.objects.filter(pk=self.attempt_id).update(ssh_available=code == 0)

    def _follow_safely(self, stream: int) -> None:
        try:
            self._follow(stream)
        except Exception:
            log.exception("following %s of task attempt %s failed", Stream(stream).label, self.attempt_id)
        finally:
            self.engine.close_thread_client()
            connection.close()

    def _follow(self, stream: int) -> None:
        cursor = self.writer.open(self.attempt_id, stream)
        if cursor.truncated:
            return
        position = (cursor.last_ts_ns, cursor.count_at_ts)
        while True:
            assembler = LineAssembler(last_ts_ns=position[0], count_at_ts=position[1],
                                      max_line_chars=settings.LOG_MAX_LINE_CHARS)
            for ts_ns, payload in self.engine.follow_logs(self.container_id, stream, since_ns=position[0]):
                if assembler.already_stored(ts_ns):
                    continue
                lines = assembler.feed(ts_ns, payload)
                if lines:
                    self.writer.add(self.attempt_id, stream, lines, assembler.cursor)
                    if self.writer.truncated(self.attempt_id, stream):
                        return
            state = self.engine.state(self.container_id)
            if state is None or not state.running:
                self.writer.add(self.attempt_id, stream, assembler.finish(), assembler.cursor)
                return
            # The stream broke while the container runs (engine restart):
            # follow again from the last complete line.
            position = assembler.cursor

    def _finish(self) -> None:
        state = self.engine.wait(self.container_id)
        self.writer.barrier()
        attempt = TaskAttempt.objects.select_related("job", "job_attempt", "task").get(pk=self.attempt_id)
        if state is None:
            result = services.ContainerExit(None, exit_type=ExitType.PLATFORM, error="the container disappeared")
        else:
            result = services.ContainerExit(state.exit_code, oom_killed=state.oom_killed, error=state.error,
                                            finished_at=state.finished_at)
            if attempt.job.upload_outputs:
                self._upload_outputs(attempt)
        services.attempt_record_exit(self.attempt_id, result)
        attempt.refresh_from_db()
        keep = (state is not None and attempt.state == TaskState.FAILED
                and services.spec_of(attempt.job).is_debug and attempt.exit_type in (ExitType.USER_EXIT, ExitType.OOM))
        network = attempt.job_attempt.network_name if attempt.ip else ""
        if keep:
            services.attempt_keep_for_debug(self.attempt_id)
            write_note(self.attempt_id, f"jobEnvs.isDebug is true: container {self.container_id[:12]} is kept on node "
                                        f"{self.agent.node.name} for debugging")
            if network:
                self.engine.disconnect(self.container_id, network)
        else:
            self.engine.remove(self.container_id)
        if network and not self._network_still_needed(attempt):
            self.engine.remove_network(network)
        self.writer.forget(self.attempt_id)

    def _network_still_needed(self, attempt: TaskAttempt) -> bool:
        """Other tasks of the job attempt on this engine may not have started
        yet (a created container does not hold the network): keep it for them.
        Reconciliation removes what is left once the attempt is over."""
        return TaskAttempt.objects.filter(
            job_attempt_id=attempt.job_attempt_id, state__in=ACTIVE_TASK_STATES,
            node__engine_id=self.agent.node.engine_id,
        ).exists()

    def _upload_outputs(self, attempt: TaskAttempt) -> None:
        """Copy what the task left in /pai/output to outputDir."""
        spec = services.spec_of(attempt.job)
        target = spec.output_dir if spec.total_tasks == 1 else f"{spec.output_dir.rstrip('/')}/{attempt.task.role}-{attempt.task.index}"
        stream = self.engine.archive(self.container_id, "/pai/output")
        if stream is None:
            return
        with tempfile.TemporaryDirectory(dir=settings.VAR_DIR / "tmp") as tmp:
            try:
                with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as archive:
                    archive.extractall(tmp, filter="data")
                folder = Path(tmp) / "output"
                if not folder.is_dir() or not any(folder.iterdir()):
                    return
                size = storage.upload_tree(folder, target)
                write_note(self.attempt_id, f"uploaded /pai/output ({size} bytes) to {target}")
            except (storage.StorageError, tarfile.TarError, OSError) as exc:
                write_note(self.attempt_id, f"could not upload /pai/output to {target}: {exc}")


class _ChunkReader:
    """A file-like reader over an iterator of byte chunks (for tarfile)."""

    def __init__(self, chunks) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            try:
                self._buffer += next(self._chunks)
            except StopIteration:
                break
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data
