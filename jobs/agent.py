"""The node agent: one process per node, started by `manage.py node_agent`.

It registers the node, beats, consumes the node's own RQ queue (launch and
stop requests) and the shared scheduler queue, watches every container of
the node in a thread, and reconciles the database with the Docker engine at
start and periodically, using the labels on the containers.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone
from rq import SimpleWorker

from jobs import launcher, queues, services
from jobs.logs import LogWriter
from jobs.models import ACTIVE_TASK_STATES, FINAL_TASK_STATES, Job, JobAttempt, Node, State, TaskAttempt, TaskState
from jobs.runner import Runner, TaskWatcher, stage_root

log = logging.getLogger(__name__)

_current: NodeAgent | None = None


def current() -> NodeAgent:
    """The agent of this process; RQ tasks for a node run only inside one."""
    if _current is None:
        raise RuntimeError("node tasks run inside `manage.py node_agent`")
    return _current


class AgentConflict(Exception):
    pass


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NodeAgent:
    def __init__(self, info: services.NodeInfo, engine: launcher.Engine, engine_cpus: int) -> None:
        self.info = info
        self.engine = engine
        self.engine_cpus = engine_cpus
        self.node: Node
        self.writer = LogWriter()
        self.watchers: dict[int, TaskWatcher] = {}
        self.runner = Runner(self)
        self._stopping = threading.Event()
        self._lock_key = f"{settings.PAI_INSTANCE}:node-agent:{info.name}"
        self._token = f"{socket.gethostname()}:{os.getpid()}"

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        global _current
        self._take_node_lock()
        self.node = services.node_register(self.info)
        _current = self
        self.writer.start()
        self.reconcile(fresh_start=True)
        for target, name in ((self._heartbeat_loop, "heartbeat"), (self._reconcile_loop, "reconcile")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def work(self) -> None:
        """Serve the node's queue until SIGTERM/SIGINT (RQ's warm shutdown)."""
        names = [queues.node_queue_name(self.node.name), queues.scheduler_queue_name()]
        worker = SimpleWorker(names, connection=queues.connection(), name=f"{self.node.name}.{os.getpid()}")
        worker.work(with_scheduler=False, logging_level="WARNING")

    def shutdown(self) -> None:
        """Stop our threads; containers keep running and are adopted on
        restart, but no new task is placed here while we are away."""
        self._stopping.set()
        self.writer.stop()
        services.node_leave(self.node.pk, os.getpid())
        queues.connection().delete(self._lock_key)

    def _take_node_lock(self) -> None:
        # Two agents for one node would both launch and both follow logs.
        # A holder on this host whose process is gone (killed) is taken over.
        redis = queues.connection()
        ttl = int(max(5, settings.NODE_LOST_AFTER_SECONDS))
        if redis.set(self._lock_key, self._token, nx=True, ex=ttl):
            return
        holder = (redis.get(self._lock_key) or b"").decode()
        host, _, pid = holder.rpartition(":")
        if host == socket.gethostname() and pid.isdigit() and not _process_alive(int(pid)):
            redis.set(self._lock_key, self._token, ex=ttl)
            return
        raise AgentConflict(f"another agent serves node {self.info.name} ({holder or '?'}); "
                            f"stop it first, or wait {ttl} s if it died")

    def _heartbeat_loop(self) -> None:
        redis = queues.connection()
        ttl = int(max(5, settings.NODE_LOST_AFTER_SECONDS))
        while not self._stopping.wait(settings.NODE_HEARTBEAT_SECONDS):
            try:
                close_old_connections()
                if not services.node_heartbeat(self.node.pk):
                    self.node = services.node_register(self.info)
                redis.set(self._lock_key, self._token, ex=ttl)
                services.nodes_mark_lost()
            except Exception:
                log.exception("heartbeat failed")
                connection.close()

    def _reconcile_loop(self) -> None:
        while not self._stopping.wait(settings.RECONCILE_SECONDS):
            try:
                close_old_connections()
                self.reconcile()
            except Exception:
                log.exception("reconcile failed")
                connection.close()

    # -------------------------------------------------------------- watching

    def watch(self, attempt_id: int, container_id: str) -> None:
        if attempt_id in self.watchers:
            return
        watcher = TaskWatcher(self, attempt_id, container_id)
        self.watchers[attempt_id] = watcher
        watcher.start()

    # ----------------------------------------------------------- reconciling

    def reconcile(self, *, fresh_start: bool = False) -> None:
        """Bring the database and the engine into agreement for this node."""
        containers = self.engine.containers({launcher.LABEL_INSTANCE: settings.PAI_INSTANCE,
                                             launcher.LABEL_NODE: self.node.name})
        seen = self._adopt_containers(containers)
        self._relaunch_missing(seen, fresh_start=fresh_start)
        if Job.objects.filter(state=State.WAITING).exists():
            queues.request_schedule()
        self._clean_networks()
        self._clean_stage_dirs()

    def _adopt_containers(self, containers: list[launcher.ContainerState]) -> set[int]:
        by_attempt = {int(c.labels[launcher.LABEL_TASK_ATTEMPT]): c for c in containers
                      if c.labels.get(launcher.LABEL_TASK_ATTEMPT, "").isdigit()}
        attempts = {a.pk: a for a in TaskAttempt.objects.filter(pk__in=by_attempt)}
        for attempt_id, container in by_attempt.items():
            attempt = attempts.get(attempt_id)
            if attempt_id in self.watchers or attempt_id == self.runner.launching:
                continue
            if attempt is None or (attempt.state in FINAL_TASK_STATES and not attempt.kept_for_debug):
                self.engine.remove(container.id)  # an orphan: its task is over
                continue
            if attempt.state in FINAL_TASK_STATES:
                continue  # kept for debugging
            if attempt.state == TaskState.ASSIGNED:
                services.attempt_claim_launch(attempt_id)
            if attempt.state in (TaskState.ASSIGNED, TaskState.LAUNCHING):
                services.attempt_mark_running(attempt_id, container_id=container.id, started_at=container.started_at)
            self.watch(attempt_id, container.id)
        return set(by_attempt)

    def _relaunch_missing(self, seen: set[int], *, fresh_start: bool) -> None:
        """Active tasks of this node with no container: launch requests lost
        with Redis are sent again; launches cut off by a crash are retried."""
        now = timezone.now()
        active = TaskAttempt.objects.filter(node_id=self.node.pk, state__in=ACTIVE_TASK_STATES).exclude(pk__in=seen)
        for attempt in active:
            if attempt.pk in self.watchers or attempt.pk == self.runner.launching:
                continue
            if attempt.state == TaskState.ASSIGNED and now - attempt.assigned_at > timedelta(seconds=2):
                queues.enqueue_launch_if_lost(self.node.name, attempt.pk)
            elif attempt.state == TaskState.LAUNCHING and (
                fresh_start or (attempt.launched_at and now - attempt.launched_at > timedelta(minutes=30))
            ):
                if services.attempt_unclaim(attempt.pk):
                    queues.enqueue_launch(self.node.name, attempt.pk)
            elif attempt.state == TaskState.RUNNING:
                services.attempt_record_exit(attempt.pk, services.ContainerExit(
                    None, exit_type="PLATFORM", error="the container disappeared (removed outside the portal?)"))

    def _clean_networks(self) -> None:
        for name, labels, attached in self.engine.networks({launcher.LABEL_INSTANCE: settings.PAI_INSTANCE}):
            tag = labels.get(launcher.LABEL_JOB_ATTEMPT)
            if not tag or attached:
                continue
            job_id, _, number = tag.partition("-")
            live = JobAttempt.objects.filter(job_id=job_id, number=number, state=State.RUNNING).exists()
            if not live:
                self.engine.remove_network(name)

    def _clean_stage_dirs(self) -> None:
        root = stage_root(self.node.name)
        if not root.is_dir():
            return
        for folder in root.iterdir():
            job_id, _, number = folder.name.removeprefix("job-").partition("-")
            if not (job_id.isdigit() and number.isdigit()):
                continue
            busy = TaskAttempt.objects.filter(job_id=job_id, number=number, node_id=self.node.pk,
                                              state__in=ACTIVE_TASK_STATES).exists()
            if not busy:
                shutil.rmtree(folder, ignore_errors=True)
