"""Who may open a task's web port through the portal's proxy, and the two
credentials the proxy takes: a ticket and the proxy's own cookie.

A web port (a label in WEB_PORT_LABELS) is served at a host name of its own,
t<task attempt>-<port>.PORTAL_PROXY_DOMAIN, so an app that assumes it owns
"/" (Jupyter with base_url "/") works, and the portal's host-only cookies
never reach it. The proxy host therefore has a sign-in of its own:

1. The job page links to a portal URL (jobs:web_port). Its view checks the
   user may open the port and redirects to the task host with a *ticket*:
   signed with the secret key, valid TICKET_SECONDS, usable once (its nonce
   is claimed in the cache), naming the user, the task attempt, the port and
   the path to land on.
2. The task host redeems the ticket and sets its own cookie (host-only,
   HttpOnly), signed, naming the same user, attempt and port, for
   PORTAL_PROXY_SESSION_SECONDS.
3. Every request through the proxy checks again (web_port_target): the user
   is active and their password unchanged, is the job's owner or a portal
   admin, and the task still runs with that web port.

Admins may open any task's web port, as they may open a terminal in any
task (SECURITY.md, "Web ports").
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.core.cache import cache
from django.utils.encoding import iri_to_uri

from jobs.models import TaskAttempt, TaskState, User

TICKET_SECONDS = 30
# The one path of a task host the proxy answers itself.
ENTER_PATH = "/__pai_portal__/enter"
COOKIE_NAME = "pai_webport"
_TICKET_SALT = "jobs.webports.ticket"
_COOKIE_SALT = "jobs.webports.cookie"
_HOST_RE = re.compile(r"t(\d{1,18})-(\d{1,5})")


@dataclass(frozen=True)
class TaskHost:
    """Which task attempt and port a proxy host name stands for."""

    attempt_id: int
    port: int

    @property
    def name(self) -> str:
        return f"t{self.attempt_id}-{self.port}.{settings.PORTAL_PROXY_DOMAIN}"


@dataclass(frozen=True)
class WebPortTarget:
    """Where the proxy forwards a task host's requests."""

    attempt_id: int
    port: int
    label: str
    address: str  # the node's loopback address the port is published on

    @property
    def tls(self) -> bool:
        return self.label == "https"  # the app itself speaks TLS


@dataclass(frozen=True)
class Grant:
    """A user let in to one task host (by a ticket, then by the cookie)."""

    user_id: int
    auth_tag: str
    host: TaskHost
    next_path: str = "/"


class WebPortUnavailable(Exception):
    """The user may not open this port, or it does not run (any more)."""


def task_host_from_header(host_header: str) -> TaskHost | None:
    """The task a Host header names, None if it names none (the portal)."""
    host = host_header.lower()
    if host.endswith("]") or ":" not in host:
        name = host
    else:
        name, _, port = host.rpartition(":")
        if not port.isdigit():
            return None
    suffix = "." + settings.PORTAL_PROXY_DOMAIN
    if not name.endswith(suffix):
        return None
    match = _HOST_RE.fullmatch(name[: -len(suffix)])
    if match is None:
        return None
    return TaskHost(int(match.group(1)), int(match.group(2)))


def is_proxy_host(host_header: str) -> bool:
    """Does this Host belong to the proxy (a task host, or a name under the
    proxy domain that names no task)? Such a request never reaches the portal."""
    name = host_header.lower().rsplit(":", 1)[0] if not host_header.endswith("]") else host_header.lower()
    return name.endswith("." + settings.PORTAL_PROXY_DOMAIN)


def web_ports(attempt: TaskAttempt) -> dict[int, str]:
    """The task's web-labelled ports: {port: label}."""
    web = set(settings.WEB_PORT_LABELS)
    return {port: label for label, ports in attempt.ports.items() if label in web for port in ports}


def web_port_target(*, user: User, attempt_id: int, port: int) -> WebPortTarget | None:
    """Where to forward, if `user` may use this port now; None otherwise."""
    if not user.is_active:
        return None
    attempt = TaskAttempt.objects.select_related("job").filter(pk=attempt_id, state=TaskState.RUNNING).first()
    if attempt is None or not attempt.container_id:
        return None
    label = web_ports(attempt).get(port)
    if label is None or not (attempt.job.owner_id == user.pk or user.is_admin):
        return None
    return WebPortTarget(attempt_id=attempt.pk, port=port, label=label, address=settings.NODE_WEB_PORT_ADDRESS)


def _auth_tag(user: User) -> str:
    """Changes when the user's password does (which ends their sessions)."""
    return hashlib.sha256(user.get_session_auth_hash().encode()).hexdigest()[:32]


def safe_next_path(path: str) -> str:
    """A path on the task host to land on; "/" for anything else."""
    if not path.startswith("/") or path.startswith(("//", "/\\")) or any(c in path for c in "\r\n\t"):
        return "/"
    return iri_to_uri(path)


def ticket_issue(*, user: User, attempt_id: int, port: int, next_path: str) -> str:
    """A ticket into the task host, if `user` may use the port now."""
    if web_port_target(user=user, attempt_id=attempt_id, port=port) is None:
        raise WebPortUnavailable("this task is not running, or this is not one of its web ports")
    payload = {"u": user.pk, "h": _auth_tag(user), "a": attempt_id, "p": port, "n": secrets.token_urlsafe(16),
               "next": safe_next_path(next_path)}
    return signing.dumps(payload, salt=_TICKET_SALT)


def ticket_redeem(ticket: str, *, host: TaskHost) -> Grant | None:
    """The grant a ticket carries, once: a second use, another host, a
    forged or expired ticket give None."""
    try:
        payload = signing.loads(ticket, salt=_TICKET_SALT, max_age=TICKET_SECONDS)
    except signing.BadSignature:
        return None
    if (payload.get("a"), payload.get("p")) != (host.attempt_id, host.port):
        return None
    if not cache.add(f"webports:ticket:{payload['n']}", 1, timeout=TICKET_SECONDS * 2):
        return None  # used already
    return Grant(user_id=payload["u"], auth_tag=payload["h"], host=host, next_path=safe_next_path(payload["next"]))


def cookie_value(grant: Grant) -> str:
    return signing.dumps({"u": grant.user_id, "h": grant.auth_tag, "a": grant.host.attempt_id, "p": grant.host.port},
                         salt=_COOKIE_SALT)


def cookie_grant(value: str, *, host: TaskHost) -> Grant | None:
    """The grant the proxy's cookie carries for this host, None if it is
    forged, expired or another task host's."""
    try:
        payload = signing.loads(value, salt=_COOKIE_SALT, max_age=settings.PORTAL_PROXY_SESSION_SECONDS)
    except signing.BadSignature:
        return None
    if (payload.get("a"), payload.get("p")) != (host.attempt_id, host.port):
        return None
    return Grant(user_id=payload["u"], auth_tag=payload["h"], host=host)


def grant_target(grant: Grant) -> WebPortTarget | None:
    """Checked on every request: the grant's user may still use the port."""
    user = User.objects.filter(pk=grant.user_id, is_active=True).first()
    if user is None or not secrets.compare_digest(_auth_tag(user), grant.auth_tag):
        return None
    return web_port_target(user=user, attempt_id=grant.host.attempt_id, port=grant.host.port)


def web_port_enter_url(*, user: User, attempt_id: int, port: int, next_path: str, secure: bool,
                       portal_host: str) -> str:
    """Where the portal sends the user: the task host, with a ticket. The
    task host is on the port the portal was reached on (`portal_host`, the
    request's Host), unless PORTAL_PROXY_PORT names another."""
    ticket = ticket_issue(user=user, attempt_id=attempt_id, port=port, next_path=next_path)
    portal_port = portal_host.rsplit(":", 1)[1] if not portal_host.endswith("]") and ":" in portal_host else ""
    port_part = str(settings.PORTAL_PROXY_PORT or portal_port)
    default = "443" if secure else "80"
    authority = TaskHost(attempt_id, port).name + (f":{port_part}" if port_part and port_part != default else "")
    return f"{'https' if secure else 'http'}://{authority}{ENTER_PATH}?ticket={ticket}"
