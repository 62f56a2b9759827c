"""Nodes joining, beating, and being given up for lost; which engine each
runs on; cordoned, drained and returned to service by admins."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from jobs import queues
from jobs.models import ACTIVE_TASK_STATES, ExitType, Node, PortAllocation, TaskAttempt, User, VirtualCluster
from jobs.services.lifecycle import ContainerExit, attempt_record_exit
from jobs.services.db_clock import database_now


@dataclass(frozen=True)
class NodeInfo:
    """What a node agent tells the portal about its machine."""

    name: str
    address: str
    docker_host: str
    engine_id: str  # docker info's ID: shown, compared, but it decides nothing (it collides on cloned machines)
    cpus: int
    memory_mb: int
    gpus: list[dict] = field(default_factory=list)
    gpus_simulated: bool = False
    port_start: int = 20000
    port_end: int = 20999
    agent_pid: int | None = None
    agent_host: str = ""
    engine_marker: str = ""  # the engine's own identity (launcher Engine.engine_marker)


def portal_host_names() -> list[str]:
    """The host names the portal answers to (ALLOWED_HOSTS, the hosts of
    CSRF_TRUSTED_ORIGINS), lower case, IPv6 without brackets; entries like
    ".example.org" (any subdomain) and "*" kept as they are."""
    names = list(settings.ALLOWED_HOSTS)
    names += [urlsplit(origin).hostname or "" for origin in settings.CSRF_TRUSTED_ORIGINS]
    return [name.lower().strip("[]") for name in names if name]


def node_address_clash(address: str) -> str | None:
    """Why `address` must not be where a node publishes task ports, or None.

    Browsers send cookies by host name, whatever the port: a task serving
    HTTP on one of the portal's own host names would receive the portal's
    session cookie from every user who opens it (review finding 1)."""
    host = address.lower().strip("[]")
    for name in portal_host_names():
        if name == "*":
            return None  # any host at all: see node_address_warning
        if host == name or (name.startswith(".") and (host == name[1:] or host.endswith(name))):
            return (f"{address} is one of the portal's own host names ({name} in PORTAL_ALLOWED_HOSTS or "
                    "PORTAL_CSRF_TRUSTED_ORIGINS): browsers would send the portal's session cookie to every "
                    "task port published there. Give the node another address (e.g. 127.0.0.2 on the portal's "
                    "own machine)")
    return None


def node_address_warning() -> str | None:
    """A warning when the portal's host names cannot be told apart from a
    node's (PORTAL_ALLOWED_HOSTS=*)."""
    if "*" in settings.ALLOWED_HOSTS:
        return ("PORTAL_ALLOWED_HOSTS is *: the node agent cannot check that task ports are published on an "
                "address other than the portal's own; if they share a host name, the portal's session cookie "
                "reaches every task port. List the portal's host names instead.")
    return None


def node_register(info: NodeInfo) -> Node:
    """Create or update the node row. A lost node stays lost: the agent's
    first reconciliation stops the containers of tasks given up while it
    was away, and then its heartbeat (node_heartbeat) makes the node ready;
    ready at once, a pass could hand out what those still held."""
    values = {
        "address": info.address, "docker_host": info.docker_host, "engine_id": info.engine_id,
        "cpus": info.cpus, "memory_mb": info.memory_mb, "gpus": info.gpus, "gpus_simulated": info.gpus_simulated,
        "port_start": info.port_start, "port_end": info.port_end, "agent_pid": info.agent_pid,
        "agent_host": info.agent_host, "last_heartbeat": database_now(), "engine_marker": info.engine_marker,
    }
    with transaction.atomic():
        lock_passes()  # no pass reads the ports between the node's move and theirs
        before = Node.objects.filter(name=info.name).values_list("address", flat=True).first()
        node, created = Node.objects.update_or_create(name=info.name, defaults=values)
        if before is not None and before != info.address:
            _move_ports(node, before)
    return node


def _move_ports(node: Node, old_address: str) -> None:
    """The node came back at a new address: what its tasks hold moves with
    it. Ports are booked by address (nodes on one machine share them), so
    left under the old one they were free again at the new one for the next
    pass (booked twice on one machine), still held at the old one for
    whoever came there next, and the job page named the old address. A port
    another node at the new address holds already stays where it was: the
    constraint allows it one holder there, and it is released with its task."""
    taken = PortAllocation.objects.filter(address=node.address).values_list("port", flat=True)
    PortAllocation.objects.filter(node=node, address=old_address).exclude(port__in=list(taken)).update(
        address=node.address)
    TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES, host_ip=old_address).update(
        host_ip=node.address)


def node_heartbeat(node_id: int, *, back_ready: Callable[[], bool] = lambda: True) -> bool:
    """False if the node row is gone (an admin deleted it). A lost node
    that beats again is ready once `back_ready()` agrees: a node that was
    cut off, not down, may still run the tasks given up meanwhile, and what
    they hold (GPUs, ports) must not be handed out until they are stopped.
    Stamped by the database's clock, as every heartbeat is judged by it."""
    now = database_now()
    if Node.objects.filter(pk=node_id, status=Node.Status.LOST).exists() and back_ready():
        Node.objects.filter(pk=node_id, status=Node.Status.LOST).update(status=Node.Status.READY)
    return Node.objects.filter(pk=node_id).update(last_heartbeat=now) == 1


def node_leave(node_id: int, agent_pid: int) -> None:
    """The node's agent is stopping: place no new tasks there until an agent
    registers it again. Its running tasks are left alone (a restarted agent
    adopts them), and the node is declared lost on the usual schedule if no
    agent comes back. Only the agent that owns the node may say so."""
    Node.objects.filter(pk=node_id, agent_pid=agent_pid).update(agent_pid=None)


def placement_cutoff(now: datetime | None = None) -> datetime:
    """Nodes heard from after this may get new tasks: a node that missed a
    few heartbeats gets no new work even before it is declared lost."""
    now = now or database_now()
    window = min(settings.NODE_LOST_AFTER_SECONDS, 3 * settings.NODE_HEARTBEAT_SECONDS + 1)
    return now - timedelta(seconds=window)


class _Watch:
    """How long this process has been watching heartbeats without a gap.

    Silence means a lost node only if someone was there to hear it: while
    the database was down (or this process stalled), no heartbeat could be
    written nor read, and the first check afterwards would otherwise find
    every node silent and fail every running task (seen after a PostgreSQL
    restart longer than NODE_LOST_AFTER_SECONDS). A gap between two checks
    of more than half that window starts the watch again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: datetime | None = None
        self._last: datetime | None = None
        self.last_look = -math.inf  # time.monotonic() of this process's last look, read or not

    def since(self, now: datetime) -> datetime:
        """Record a check at `now`; the start of the current unbroken watch."""
        gap = timedelta(seconds=settings.NODE_LOST_AFTER_SECONDS / 2)
        with self._lock:
            if self._since is None or self._last is None or now - self._last > gap or now < self._last:
                self._since = now
            self._last = now
            return self._since


_watch = _Watch()


def nodes_mark_lost_if_due() -> list[str]:
    """`nodes_mark_lost`, unless this process looked within the last
    NODE_HEARTBEAT_SECONDS. Scheduling passes call this: every agent's
    heartbeat looks anyway, and a look on each pass (a query the ORM built
    at every submission's pass) only repeated it."""
    if time.monotonic() - _watch.last_look < settings.NODE_HEARTBEAT_SECONDS:
        return []
    return nodes_mark_lost()


def nodes_mark_lost(now: datetime | None = None) -> list[str]:
    """Nodes whose heartbeat stopped are lost; their tasks end as failed
    with a platform reason (and their jobs retry if they may). Only silence
    this process watched for the whole window counts (_Watch). Judged by
    the database's clock, as heartbeats are stamped: this host's may be off."""
    _watch.last_look = time.monotonic()
    now = now or database_now()
    window = timedelta(seconds=settings.NODE_LOST_AFTER_SECONDS)
    cutoff = now - window
    stale = list(Node.objects.filter(status=Node.Status.READY).filter(
        Q(last_heartbeat__lt=cutoff) | Q(last_heartbeat__isnull=True)
    ))
    # Recorded only once that read succeeded: a check that could not look
    # (the database away) watched nothing.
    if _watch.since(now) > cutoff:
        return []
    lost: list[str] = []
    for node in stale:
        claimed = Node.objects.filter(pk=node.pk, last_heartbeat=node.last_heartbeat, status=node.status).update(
            status=Node.Status.LOST
        )
        if claimed == 1:
            lost.append(node.name)
    _fail_tasks_of_lost_nodes(cutoff)
    return lost


def _fail_tasks_of_lost_nodes(cutoff: datetime) -> None:
    """The active tasks of every lost node still silent end as failed. Looked
    for on each check, not only by the one that declares a node lost: one
    cut short after its claim (the database went away, the agent was
    killed) left the rest running for good, as a lost node is not declared
    lost again. A lost node beating again keeps its tasks (node_heartbeat)."""
    silent = Q(node__last_heartbeat__lt=cutoff) | Q(node__last_heartbeat__isnull=True)
    active = TaskAttempt.objects.filter(silent, node__status=Node.Status.LOST, state__in=ACTIVE_TASK_STATES)
    for attempt_id, name, last_heartbeat in list(active.values_list("pk", "node__name", "node__last_heartbeat")):
        since = last_heartbeat.isoformat(timespec="seconds") if last_heartbeat else "never"
        attempt_record_exit(attempt_id, ContainerExit(
            exit_code=None, exit_type=ExitType.NODE_LOST, error=f"node {name} was lost (no heartbeat since {since})",
        ))


# ------------------------------------------------------------ engine identity


def engine_identity_conflicts(nodes: list[Node] | None = None) -> list[str]:
    """Warnings, in words, about live nodes whose engine identities disagree:
    the same docker info ID with different markers (cloned machines share
    /etc/docker/key.json: harmless now, since the marker decides, but worth
    fixing), and one marker claimed from different addresses (the engine's
    data was copied, say a cloned disk image: those nodes would be handed
    each other's job-network addresses, which do not route between hosts)."""
    if nodes is None:
        nodes = list(Node.objects.filter(status=Node.Status.READY))
    now = database_now()
    live = [n for n in nodes if n.status == Node.Status.READY and n.heartbeat_fresh(now)]
    warnings: list[str] = []
    by_id: dict[str, list[Node]] = {}
    by_marker: dict[str, list[Node]] = {}
    for node in live:
        if node.engine_id:
            by_id.setdefault(node.engine_id, []).append(node)
        if node.engine_marker:
            by_marker.setdefault(node.engine_marker, []).append(node)
    for engine_id, group in sorted(by_id.items()):
        if len({n.engine_marker for n in group}) > 1:
            names = ", ".join(sorted(n.name for n in group))
            warnings.append(
                f"nodes {names} report one Docker engine ID ({engine_id[:14]}…) but are different engines (their "
                f"engine markers differ): their machines share /etc/docker/key.json (cloned?). They are treated as "
                f"separate engines; give each its own key (stop dockerd, remove /etc/docker/key.json, start it).")
    for marker, group in sorted(by_marker.items()):
        if len({n.address for n in group}) > 1:
            names = ", ".join(f"{n.name} ({n.address})" for n in sorted(group, key=lambda n: n.name))
            warnings.append(
                f"nodes {names} claim one engine marker ({marker[:8]}…) from different addresses: if they are on "
                f"different machines, the engine's data was copied, and their tasks are handed job-network "
                f"addresses that do not route. On the copy, stop the agent, run `docker volume rm "
                f"pai-engine-marker` and start the agent again.")
    return warnings


def engine_conflicts_of(node_name: str) -> list[str]:
    """The warnings that name `node_name`, for its agent's log: read from the
    few nodes that share its docker ID or marker, so an agent may ask often."""
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        return []
    same = Q(engine_id=node.engine_id) if node.engine_id else Q(pk=node.pk)
    if node.engine_marker:
        same |= Q(engine_marker=node.engine_marker)
    near = list(Node.objects.filter(same, status=Node.Status.READY))
    named = re.compile(rf"(?<![\w.-]){re.escape(node_name)}(?![\w.-])")
    return [w for w in engine_identity_conflicts(near) if named.search(w)]


# ---------------------------------------------------- cordon, drain, uncordon


class NodeStateError(Exception):
    """The node is not in a state that allows the action."""


def node_display_state(node: Node, active_tasks: int) -> str:
    """READY, CORDONED, DRAINING or DRAINED, as the Nodes page and the API
    show it (LOST and a missing heartbeat are shown beside it)."""
    if node.drain_mode:
        return "DRAINING" if active_tasks else "DRAINED"
    return "READY" if node.schedulable else "CORDONED"


def lock_passes() -> None:
    """Wait for any scheduling pass to end, on PostgreSQL (on SQLite the
    transaction's BEGIN took the database's write lock already). The "no
    key" lock keeps passes apart as well, but not the foreign-key check of
    a job stored in "default" meanwhile: FOR UPDATE held every such
    submission until the pass ended."""
    list(VirtualCluster.objects.select_for_update(no_key=True).filter(name=VirtualCluster.DEFAULT))


def node_cordon(*, node: Node, by: User) -> Node:
    """Place no new task on the node (as `kubectl cordon`); its tasks go on.
    Cordoning a draining node changes nothing."""
    with transaction.atomic():
        lock_passes()  # see node_drain
        Node.objects.filter(pk=node.pk, schedulable=True).update(
            schedulable=False, cordoned_at=timezone.now(), cordoned_by=by.username)
    return Node.objects.get(pk=node.pk)


def node_drain(*, node: Node, by: User, mode: str) -> Node:
    """Cordon the node and empty it (as `kubectl drain`). `mode` "stop": its
    active tasks are stopped now, each ending FAILED with the reason "node
    drained", which counts toward its job's retryCount like a node loss, so
    a job with retries left runs again elsewhere; "wait": its tasks run to
    their end. Either way the node shows DRAINING until no task is left,
    then DRAINED. Draining again may change the mode (wait, then stop)."""
    if mode not in (Node.DrainMode.STOP, Node.DrainMode.WAIT):
        raise NodeStateError(f"mode must be 'stop' or 'wait', not {mode!r}")
    now = timezone.now()
    with transaction.atomic():
        # After any pass under way: one that read the node still schedulable
        # would place tasks there once the stops below had looked (PostgreSQL).
        lock_passes()
        Node.objects.filter(pk=node.pk, schedulable=True).update(schedulable=False, cordoned_at=now,
                                                                 cordoned_by=by.username)
        Node.objects.filter(pk=node.pk).update(drain_mode=mode)
    if mode == Node.DrainMode.STOP:
        _stop_node_tasks(node)
    return Node.objects.get(pk=node.pk)


def _stop_node_tasks(node: Node) -> None:
    """Every active task of the node is stopped by its agent, as a user's
    stop is, and ends FAILED as "node drained" (the stop reason decides,
    lifecycle._classify). Even one not yet launched goes through the agent,
    whose stop request overtakes the launch: deciding it here could race
    the agent's claim of it. A node whose agent is gone ends its tasks as
    lost instead, on the usual schedule."""
    active = TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES)
    active.filter(stop_reason="").update(stop_reason=ExitType.NODE_DRAINED)
    # Not those a user is stopping already: a second stop request kills at once.
    stops = list(active.filter(stop_reason=ExitType.NODE_DRAINED).values_list("node_name", "pk"))
    transaction.on_commit(lambda: [queues.enqueue_stop(name, pk) for name, pk in stops], robust=True)


def node_active_tasks(nodes: list[Node]) -> dict[Node, int]:
    """How many active tasks each of `nodes` holds, for those holding some."""
    counts = dict(TaskAttempt.objects.filter(node__in=nodes, state__in=ACTIVE_TASK_STATES)
                  .values_list("node_id").annotate(n=Count("id")))
    return {node: counts[node.pk] for node in nodes if node.pk in counts}


def node_delete_unless_busy(*, node: Node) -> None:
    """Delete a node row (the Django admin's way), refused while tasks are
    active on it: the cascade would drop the GPUs and ports they hold, and
    its agent registers the node again at its next heartbeat, whose GPUs
    and ports the next pass would then hand out a second time."""
    with transaction.atomic():
        lock_passes()  # no pass places a task there meanwhile
        if TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES).exists():
            raise NodeStateError(f"node {node.name} still has active tasks; drain it first")
        node.delete()


def node_uncordon(*, node: Node) -> Node:
    """Back in service (as `kubectl uncordon`): ends a drain too, and asks for
    a scheduling pass so that waiting jobs may start here at once."""
    Node.objects.filter(pk=node.pk).update(schedulable=True, drain_mode=Node.DrainMode.NONE, cordoned_at=None,
                                           cordoned_by="")
    transaction.on_commit(queues.request_schedule, robust=True)
    return Node.objects.get(pk=node.pk)
