"""The node agent: one process per node, started by `manage.py node_agent`.

It registers the node, beats, consumes the node's own RQ queue (launch and
stop requests), the shared scheduler queue and the shared notify queue (job
state notifications; its heartbeat moves due retries onto it), follows
every container of the node (all their logs on one thread, follower.py), and reconciles the database with
the Docker engine at start and periodically, using the labels on the
containers.

It is the only module that knows NodeAgent: the runner and the watchers get
a NodeContext (node, engine, log writer, the watchers registry) instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import F
from rq import SimpleWorker
from rq.exceptions import StopRequested

from jobs import queues, services
from jobs.models import ACTIVE_TASK_STATES, FINAL_TASK_STATES, Job, JobAttempt, Node, State, TaskAttempt, TaskState
from jobs.node import launcher
from jobs.node.context import NodeContext, Watchers
from jobs.node.follower import LogFollower
from jobs.node.holders import holder_is_gone, this_process
from jobs.node.logwriter import LogWriter
from jobs.node.notifier import NotificationSender
from jobs.node.runner import Runner
from jobs.node.staging import expire_kept_outputs, stage_root
from jobs.node.usage import UsageSampler
from jobs.services import db_clock, notifications
from jobs.node.watcher import TaskWatcher
from jobs.node.webforward import WebForwarder

log = logging.getLogger(__name__)

_current: NodeAgent | None = None


def _job_attempt_of(text: str) -> tuple[int, int] | None:
    """(job id, attempt number) from "<job id>-<number>", as the runner
    labels a job's network and names its stage folder; None for anything else."""
    job_id, _, number = text.partition("-")
    return (int(job_id), int(number)) if job_id.isdigit() and number.isdigit() else None


def _never_started(container: launcher.ContainerState) -> bool:
    return not container.running and container.started_at is None and container.finished_at is None


def current() -> NodeAgent:
    """The agent of this process; RQ tasks for a node run only inside one."""
    if _current is None:
        raise RuntimeError("node tasks run inside `manage.py node_agent`")
    return _current


def send_notification(send: Callable[..., Any], *args: Any, owner: int | None) -> None:
    """Run a notification's delivery on the agent's notification threads, so
    the worker that launches and stops tasks never waits on a receiver, and
    one owner's deliveries take one thread at a time; inline outside an agent."""
    if _current is None:
        send(*args)
    else:
        _current.notifier.submit(send, *args, owner=owner)


def launch_here() -> services.LaunchHere | None:
    """This process's node and its runner's way to take a launch, for a
    scheduling pass run here (services.schedule_pass); None outside an agent."""
    if _current is None:
        return None
    return services.LaunchHere(node_name=_current.node.name, launch=_current.runner.launch)


class AgentConflict(Exception):
    pass


class _Worker(SimpleWorker):
    """RQ's in-process worker, with Django's care of connections around each
    job as around a web request: a database connection that went bad (the
    server restarted) is replaced before the next job instead of failing it
    and every job after it."""

    def execute_job(self, job, queue):  # noqa: ANN001 (RQ's signature)
        close_old_connections()
        try:
            return super().execute_job(job, queue)
        finally:
            close_old_connections()


class NodeAgent:
    def __init__(self, info: services.NodeInfo, engine: launcher.Engine, engine_cpus: int) -> None:
        self.info = info
        self.engine = engine
        self.engine_cpus = engine_cpus
        self.writer = LogWriter()
        self.follower = LogFollower(room=self.writer.has_room)  # reads no more than the writer may hold
        self.notifier = NotificationSender(settings.NOTIFY_THREADS)
        self.watchers = Watchers(self._make_watcher)
        self.context: NodeContext  # made once the node is registered
        self.runner: Runner
        self._registered = False  # context and runner are made
        self._stopping = threading.Event()
        self._stop_asked = False
        self._worker: SimpleWorker | None = None
        self._lock_key = f"{settings.PAI_INSTANCE}:node-agent:{info.name}"
        self._token = this_process()
        self._engine_warnings: set[str] = set()  # logged already

    @property
    def node(self) -> Node:
        return self.context.node

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        # From registration on, the scheduler places tasks here. A SIGTERM
        # before RQ's worker takes the signal over (in work()) would end us
        # without leaving the node (shutdown()), and tasks would go to a node
        # nobody serves until it is declared lost: note it and stop instead.
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop_signal, self._stop_before_serving)
        # Bound first: a port in use stops us before anything is registered.
        self.web_forward = WebForwarder(node_name=self.info.name, address=self.info.address,
                                        port=settings.NODE_WEB_FORWARD_PORT,
                                        task_ports=range(self.info.port_start, self.info.port_end + 1))
        self._take_node_lock()
        self._protect_node()
        try:
            self._register_and_serve()
        except BaseException:
            # Registered but not serving: the scheduler would place tasks on
            # a node whose agent is gone until it is declared lost, and our
            # firewall rules would stay until another agent starts here.
            try:
                self.shutdown()
            except Exception:
                log.exception("could not undo the agent's start")
            raise

    def _register_and_serve(self) -> None:
        global _current
        node = services.node_register(self.info)
        self.context = NodeContext(node=node, engine=self.engine, engine_cpus=self.engine_cpus, writer=self.writer,
                                   watchers=self.watchers, follower=self.follower)
        self.runner = Runner(self.context)
        self._registered = True
        _current = self
        self.writer.start()
        self.follower.start()
        self.web_forward.start()
        self.reconcile(fresh_start=True)
        # Ready now if it was lost and nothing given up runs here any more
        # (the reconciliation stopped it), not a heartbeat later.
        services.node_heartbeat(node.pk, back_ready=self._runs_no_orphan)
        for target, name in ((self._heartbeat_loop, "heartbeat"), (self._reconcile_loop, "reconcile")):
            threading.Thread(target=target, name=name, daemon=True).start()
        # CPU, memory and GPU use of the node's running tasks (usage.py).
        threading.Thread(target=UsageSampler(self.context).run, args=(self._stopping,), name="usage",
                         daemon=True).start()

    def work(self) -> None:
        """Serve the node's queue until SIGTERM/SIGINT (RQ's warm shutdown)."""
        # In this order: launches and stops first, then passes, then
        # notifications (webhooks and e-mail, jobs/services/notifications.py),
        # which the worker only hands to the notification threads (notifier.py).
        names = [queues.node_queue_name(self.node.name), queues.scheduler_queue_name(), queues.notify_queue_name()]
        try:
            self._worker = _Worker(names, connection=queues.connection(), name=f"{self.node.name}.{os.getpid()}")
            if not self._stop_asked:
                self._worker.work(with_scheduler=False, logging_level="WARNING")
        except StopRequested:
            pass  # asked while the worker was setting up, before its own handlers

    def _stop_before_serving(self, signum: int, frame: FrameType | None) -> None:
        self._stop_asked = True
        if self._worker is not None:
            self._worker.request_stop(signum, frame)  # raises StopRequested unless it is busy

    def shutdown(self) -> None:
        """Stop our threads; containers keep running and are adopted on
        restart, but no new task is placed here while we are away. Also
        undoes a start that failed half-way (start())."""
        self._stopping.set()
        self.notifier.stop()
        self.web_forward.stop()
        if self._registered:
            self.runner.wait_for_launches(timeout=30)
        self.follower.stop()
        self.writer.stop()
        if self._registered:
            services.node_leave(self.node.pk, os.getpid())
        queues.connection().delete(self._lock_key)
        # Tasks left running are adopted by the next agent, which installs
        # its own rules before it drops ours: until then they stay.
        try:
            ours = self.engine.containers({launcher.LABEL_INSTANCE: settings.PAI_INSTANCE,
                                           launcher.LABEL_NODE: self.info.name})
            if not any(container.running for container in ours):
                self.engine.unprotect_node(self._token)
        except Exception:
            log.exception("could not tell whether tasks still run: the task firewall stays")

    def _protect_node(self) -> None:
        # Before the node is registered: no task may start unprotected.
        try:
            self.engine.protect_node(self._token)
        except Exception:
            queues.connection().delete(self._lock_key)
            raise

    def _take_node_lock(self) -> None:
        # Two agents for one node would both launch and both follow logs.
        # A holder on this host whose process is gone (killed) is taken over.
        redis = queues.connection()
        ttl = int(max(5, settings.NODE_LOST_AFTER_SECONDS))
        if redis.set(self._lock_key, self._token, nx=True, ex=ttl):
            return
        holder = (redis.get(self._lock_key) or b"").decode()
        if holder_is_gone(holder):
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
                if not services.node_heartbeat(self.node.pk, back_ready=self._runs_no_orphan):
                    self.context.node = services.node_register(self.info)
                redis.set(self._lock_key, self._token, ex=ttl)
                services.nodes_mark_lost()
                self._repair_lost_wakeup()
                queues.enqueue_due_notifications()
                notifications.deliveries_repair()  # deliveries a dead worker left behind
            except Exception:
                log.exception("heartbeat failed")
                connection.close()

    def _runs_no_orphan(self) -> bool:
        """Back from being lost (cut off, not down): whether no container of
        a task given up meanwhile still runs here. Reconciliation stops them
        (_adopt_containers); until then the node stays lost."""
        containers = self.engine.containers({launcher.LABEL_INSTANCE: settings.PAI_INSTANCE,
                                             launcher.LABEL_NODE: self.node.name})
        running = {int(c.labels[launcher.LABEL_TASK_ATTEMPT]) for c in containers
                   if c.running and c.labels.get(launcher.LABEL_TASK_ATTEMPT, "").isdigit()}
        active = TaskAttempt.objects.filter(pk__in=running, state__in=ACTIVE_TASK_STATES).count()
        return active == len(running)

    def _repair_lost_wakeup(self) -> None:
        """No waiting job depends on one wake-up message: when jobs wait and
        no pass has started for SCHEDULE_REPAIR_SECONDS, ask again. A lost
        wake-up is so repaired within that time plus one heartbeat."""
        if queues.pass_overdue(settings.SCHEDULE_REPAIR_SECONDS) and Job.objects.filter(state=State.WAITING).exists():
            queues.repair_schedule_request()

    def _reconcile_loop(self) -> None:
        while not self._stopping.wait(settings.RECONCILE_SECONDS):
            try:
                close_old_connections()
                self.reconcile()
                self._warn_engine_conflicts()
            except Exception:
                log.exception("reconcile failed")
                connection.close()

    def _warn_engine_conflicts(self) -> None:
        """Say once in this agent's log when another node's engine identity
        clashes with ours (services.nodes.engine_identity_conflicts): a clone
        that joins later is reported on both machines, not only on its own."""
        for warning in services.nodes.engine_conflicts_of(self.node.name):
            if warning not in self._engine_warnings:
                self._engine_warnings.add(warning)
                log.warning("%s", warning)

    # -------------------------------------------------------------- watching

    def _make_watcher(self, attempt_id: int, container_id: str) -> TaskWatcher:
        return TaskWatcher(self.context, attempt_id, container_id)

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
        expire_kept_outputs()  # on time, not only when this node next stages or uploads

    def _adopt_containers(self, containers: list[launcher.ContainerState]) -> set[int]:
        by_attempt = {int(c.labels[launcher.LABEL_TASK_ATTEMPT]): c for c in containers
                      if c.labels.get(launcher.LABEL_TASK_ATTEMPT, "").isdigit()}
        attempts = {a.pk: a for a in TaskAttempt.objects.filter(pk__in=by_attempt)}
        seen = set(by_attempt)
        for attempt_id, container in by_attempt.items():
            attempt = attempts.get(attempt_id)
            orphan = attempt is None or (attempt.state in FINAL_TASK_STATES and not attempt.kept_for_debug)
            if self.runner.is_launching(attempt_id):
                continue
            watcher = self.watchers.get(attempt_id)
            if watcher is not None:
                # Still running though its task is over: given up while this
                # node was cut off (declared lost, the job retried elsewhere).
                # Stop it; its watcher removes it and reports an exit that
                # changes nothing (the attempt has ended already).
                if orphan and container.running:
                    watcher.request_stop()
                elif attempt is not None:
                    self._stop_if_asked(attempt, container)
                continue
            if orphan:
                self.engine.remove(container.id)  # an orphan: its task is over
                continue
            if attempt.state in FINAL_TASK_STATES:
                continue  # kept for debugging
            if _never_started(container):
                # An agent died between its create and its start: a created
                # container says exit code 0 though its command never ran.
                # Removed and left unseen, so the launch is made again.
                self.engine.remove(container.id)
                seen.discard(attempt_id)
                continue
            if attempt.state == TaskState.ASSIGNED:
                services.attempt_claim_launch(attempt_id)
            if attempt.state in (TaskState.ASSIGNED, TaskState.LAUNCHING):
                services.attempt_mark_running(attempt_id, container_id=container.id,
                                              started_at=db_clock.from_local(container.started_at))
            self.watchers.watch(attempt_id, container.id)
            self._stop_if_asked(attempt, container)
        return seen

    def _stop_if_asked(self, attempt: TaskAttempt, container: launcher.ContainerState) -> None:
        """Stop a running task whose stop the database holds (the job stopped
        or ended, a drain) if its request never reached this agent's watcher:
        Redis lost it, the agent that took it died, or that agent's SIGKILL
        after the grace period went with it (a restart). A program that
        ignores SIGTERM would otherwise run on and keep its job STOPPING, or
        an ended job's GPUs, for good. A request still queued for this agent
        must not count as a second one when it comes, which kills at once."""
        watcher = self.watchers.get(attempt.pk)
        if attempt.stop_reason and container.running and watcher is not None:
            watcher.ensure_stopping()

    def _relaunch_missing(self, seen: set[int], *, fresh_start: bool) -> None:
        """Active tasks of this node with no container: launch requests lost
        with Redis are sent again; launches cut off by a crash are retried."""
        now = db_clock.now()  # as the pass that assigned them and the agent that launched them
        active = (TaskAttempt.objects.filter(node_id=self.node.pk, state__in=ACTIVE_TASK_STATES).exclude(pk__in=seen)
                  .annotate(job_owner_id=F("job__owner_id")))  # the request says whose (LaunchQueue)
        for attempt in active:
            if self.watchers.is_watching(attempt.pk) or self.runner.is_launching(attempt.pk):
                continue
            if attempt.state == TaskState.ASSIGNED and now - attempt.assigned_at > timedelta(seconds=2):
                queues.enqueue_launch_if_lost(self.node.name, attempt.pk, attempt.job_owner_id)
            elif attempt.state == TaskState.LAUNCHING and (
                fresh_start or (attempt.launched_at and now - attempt.launched_at > timedelta(minutes=30))
            ):
                if services.attempt_unclaim(attempt.pk):
                    queues.enqueue_launch(self.node.name, attempt.pk, attempt.job_owner_id)
            elif attempt.state == TaskState.RUNNING:
                services.attempt_record_exit(attempt.pk, services.ContainerExit(
                    None, exit_type="PLATFORM", error="the container disappeared (removed outside the portal?)"))

    def _clean_networks(self) -> None:
        for name, labels, attached in self.engine.networks({launcher.LABEL_INSTANCE: settings.PAI_INSTANCE}):
            attempt = _job_attempt_of(labels.get(launcher.LABEL_JOB_ATTEMPT, ""))
            if attempt is None or attached:
                continue  # not a job's network (or a label we did not write): leave it alone
            job_id, number = attempt
            live = JobAttempt.objects.filter(job_id=job_id, number=number, state=State.RUNNING).exists()
            if not live:
                self.engine.remove_network(name)

    def _clean_stage_dirs(self) -> None:
        root = stage_root(self.node.name)
        if not root.is_dir():
            return
        for folder in root.iterdir():
            attempt = _job_attempt_of(folder.name.removeprefix("job-"))
            if attempt is None:
                continue
            job_id, number = attempt
            busy = TaskAttempt.objects.filter(job_id=job_id, number=number, node_id=self.node.pk,
                                              state__in=ACTIVE_TASK_STATES).exists()
            if not busy:
                shutil.rmtree(folder, ignore_errors=True)
