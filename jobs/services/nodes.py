"""Nodes joining, beating, and being given up for lost."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.models import ACTIVE_TASK_STATES, ExitType, Node, TaskAttempt
from jobs.services.lifecycle import ContainerExit, attempt_record_exit


@dataclass(frozen=True)
class NodeInfo:
    """What a node agent tells the portal about its machine."""

    name: str
    address: str
    docker_host: str
    engine_id: str
    cpus: int
    memory_mb: int
    gpus: list[dict] = field(default_factory=list)
    gpus_simulated: bool = False
    port_start: int = 20000
    port_end: int = 20999
    agent_pid: int | None = None
    agent_host: str = ""


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
    """Create or update the node row; a lost node that comes back is ready."""
    values = {
        "address": info.address, "docker_host": info.docker_host, "engine_id": info.engine_id,
        "cpus": info.cpus, "memory_mb": info.memory_mb, "gpus": info.gpus, "gpus_simulated": info.gpus_simulated,
        "port_start": info.port_start, "port_end": info.port_end, "agent_pid": info.agent_pid,
        "agent_host": info.agent_host, "last_heartbeat": timezone.now(),
    }
    node, created = Node.objects.update_or_create(name=info.name, defaults=values)
    Node.objects.filter(pk=node.pk, status=Node.Status.LOST).update(status=Node.Status.READY)
    node.refresh_from_db()
    return node


def node_heartbeat(node_id: int) -> bool:
    """False if the node row is gone (an admin deleted it)."""
    now = timezone.now()
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
    now = now or timezone.now()
    window = min(settings.NODE_LOST_AFTER_SECONDS, 3 * settings.NODE_HEARTBEAT_SECONDS + 1)
    return now - timedelta(seconds=window)


def nodes_mark_lost(now: datetime | None = None) -> list[str]:
    """Nodes whose heartbeat stopped are lost; their tasks end as failed
    with a platform reason (and their jobs retry if they may)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.NODE_LOST_AFTER_SECONDS)
    lost: list[str] = []
    stale = Node.objects.filter(status=Node.Status.READY).filter(
        Q(last_heartbeat__lt=cutoff) | Q(last_heartbeat__isnull=True)
    )
    for node in stale:
        claimed = Node.objects.filter(pk=node.pk, last_heartbeat=node.last_heartbeat, status=node.status).update(
            status=Node.Status.LOST
        )
        if claimed != 1:
            continue
        lost.append(node.name)
        since = node.last_heartbeat.isoformat(timespec="seconds") if node.last_heartbeat else "never"
        active = TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES).values_list("pk", flat=True)
        for attempt_id in list(active):
            attempt_record_exit(attempt_id, ContainerExit(
                exit_code=None, exit_type=ExitType.NODE_LOST,
                error=f"node {node.name} was lost (no heartbeat since {since})",
            ))
    return lost
