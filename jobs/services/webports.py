"""Who may open a task's web port through the portal's proxy, and the two
credentials the proxy takes: a ticket and the proxy's own cookie.

A web port (a label in WEB_PORT_LABELS) is served at a host name of its own,
t<task attempt>-<port>.PORTAL_PROXY_DOMAIN, so an app that assumes it owns
"/" (Jupyter with base_url "/") works, and the portal's host-only cookies
never reach it. The proxy host therefore has a sign-in of its own:

1. The job page links to a portal URL (jobs:web_port). Its view checks the
   user may open the port and answers a page of the portal's with a form
   that posts a *ticket* to the task host: signed with the secret key,
   valid TICKET_SECONDS, usable once (its nonce is claimed in the cache),
   naming the user, the task attempt, the port, the path to land on and
   the portal's origin the page is served from.
2. The task host redeems the ticket only from a POST whose Origin is that
   origin (so only the browser the portal handed it to can: a ticket sent
   on as a link, or posted from any other page, lets no one in, review
   finding 36) and sets its own cookie (host-only, HttpOnly), signed,
   naming the same user, attempt and port, for PORTAL_PROXY_SESSION_SECONDS.
3. Every request through the proxy checks again (web_port_target): the user
   is active and their password unchanged, is the job's owner or a portal
   admin, and the task still runs with that web port.

Admins may open any task's web port, as they may open a terminal in any
task (SECURITY.md, "Web ports").

The proxy never connects to a task's port itself: the port is bound to its
node's loopback, and the node agent's forwarder (jobs/node/webforward.py)
splices a connection to it only after the portal proves itself with a
*forward proof*, made and checked here (both sides import this module): an
HMAC, keyed per node from the secret key, over the node, the task attempt,
the port, a timestamp and a nonce. The forwarder's port is advertised in
the cache while it runs (forward_port_of).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.core.cache import cache
from django.http.request import split_domain_port, validate_host
from django.utils.crypto import salted_hmac
from django.utils.encoding import iri_to_uri

from jobs.models import TaskAttempt, TaskState, User

TICKET_SECONDS = 30
# The one path of a task host the proxy answers itself.
ENTER_PATH = "/__pai_portal__/enter"
COOKIE_NAME = "pai_webport"
# Under HTTPS the cookie is a __Host- cookie, which browsers take only from
# the host itself (Secure, Path=/, no Domain): a page of a sibling task host
# can set a cookie on the shared parent domain, but never one of these
# (finding 45).
SECURE_COOKIE_NAME = "__Host-" + COOKIE_NAME


def cookie_name(*, secure: bool) -> str:
    """The proxy's cookie's name on a task host served over HTTPS or not."""
    return SECURE_COOKIE_NAME if secure else COOKIE_NAME
_TICKET_SALT = "jobs.webports.ticket"
_LANDING_SALT = "jobs.webports.landing"
# The longest path a link may ask to land on (a browser's URL is longer, a
# task's own links are far shorter).
LANDING_MAX_CHARS = 2048
_COOKIE_SALT = "jobs.webports.cookie"
_HOST_RE = re.compile(r"t(\d{1,18})-(\d{1,5})")
# A forward proof is good this long either side of its timestamp (clocks of
# the portal and its nodes differ a little), once.
FORWARD_PROOF_SECONDS = 30
FORWARD_GREETING = "PAI-WEBFORWARD/1"
_FORWARD_KEY_SALT = "jobs.webports.forward-key:"
_PROOF_RE = re.compile(
    r"PAI-WEBFORWARD/1 ([A-Za-z0-9_.-]{1,64}) (\d{1,18}) (\d{1,5}) (\d{1,16}) ([0-9a-f]{32}) ([0-9a-f]{64})\n")


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
    node_name: str
    node_address: str  # where the node's forwarder listens (the node's address)
    forward_port: int | None  # the forwarder's port; None while the node's agent is away

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
    attempt = TaskAttempt.objects.select_related("job", "node").filter(pk=attempt_id, state=TaskState.RUNNING).first()
    if attempt is None or not attempt.container_id or attempt.node is None:
        return None
    label = web_ports(attempt).get(port)
    if label is None or not (attempt.job.owner_id == user.pk or user.is_admin):
        return None
    return WebPortTarget(attempt_id=attempt.pk, port=port, label=label, node_name=attempt.node.name,
                         node_address=attempt.node.address, forward_port=forward_port_of(attempt.node.name))


def web_port_owner_on_node(*, node_name: str, attempt_id: int, port: int) -> int | None:
    """The node's own check before it forwards: if `port` is a web port of
    a task attempt running on this node now, the id of the task's owner
    (whose connections the forwarder counts); None otherwise."""
    attempt = (TaskAttempt.objects.select_related("job").only("ports", "container_id", "job__owner_id")
               .filter(pk=attempt_id, node__name=node_name, state=TaskState.RUNNING).first())
    if attempt is None or not attempt.container_id or port not in web_ports(attempt):
        return None
    return attempt.job.owner_id


def _auth_tag(user: User) -> str:
    """Changes when the user's password does (which ends their sessions)."""
    return hashlib.sha256(user.get_session_auth_hash().encode()).hexdigest()[:32]


def safe_next_path(path: str) -> str:
    """A path on the task host to land on; "/" for anything else."""
    if not path.startswith("/") or path.startswith(("//", "/\\")) or any(c in path for c in "\r\n\t"):
        return "/"
    return iri_to_uri(path)


def landing_signature(*, attempt_id: int, port: int, path: str) -> str:
    """Signs a landing path the portal itself chose for a task's port (the
    job page's Open Jupyter link, with its token): a link carrying it goes
    straight on, while a path from anywhere else is shown to the user first
    (finding 43)."""
    return salted_hmac(_LANDING_SALT, f"{attempt_id}:{port}:{path}", algorithm="sha256").hexdigest()[:32]


def landing_signed(*, attempt_id: int, port: int, path: str, signature: str) -> bool:
    expected = landing_signature(attempt_id=attempt_id, port=port, path=path)
    return secrets.compare_digest(expected.encode(), signature.encode("utf-8", errors="replace"))


def portal_origin_trusted(origin: str) -> bool:
    """Is `origin` ("http://host:port") one the portal itself serves pages
    from? PORTAL_URL's, a CSRF trusted origin, or a host ALLOWED_HOSTS names
    (not "*": with it, anyone's Host would do, and a ticket would name an
    origin of theirs)."""
    origin = origin.lower()
    if origin in {o.lower() for o in settings.CSRF_TRUSTED_ORIGINS}:
        return True
    if settings.PORTAL_URL and origin == _origin_of(settings.PORTAL_URL):
        return True
    scheme, _, authority = origin.partition("://")
    host, _port = split_domain_port(authority)
    return scheme in ("http", "https") and bool(host) and "/" not in authority and validate_host(
        host, [h for h in settings.ALLOWED_HOSTS if h != "*"])


def _origin_of(url: str) -> str:
    scheme, _, rest = url.lower().partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def ticket_issue(*, user: User, attempt_id: int, port: int, next_path: str, origin: str) -> str:
    """A ticket into the task host, if `user` may use the port now, to be
    posted from a page of the portal's at `origin`."""
    if web_port_target(user=user, attempt_id=attempt_id, port=port) is None:
        raise WebPortUnavailable("this task is not running, or this is not one of its web ports")
    if not portal_origin_trusted(origin):
        raise WebPortUnavailable(f"the portal was reached at {origin}, which it does not know as its own "
                                 "(set PORTAL_URL or PORTAL_CSRF_TRUSTED_ORIGINS)")
    payload = {"u": user.pk, "h": _auth_tag(user), "a": attempt_id, "p": port, "n": secrets.token_urlsafe(16),
               "next": safe_next_path(next_path), "o": origin.lower()}
    return signing.dumps(payload, salt=_TICKET_SALT)


def ticket_redeem(ticket: str, *, host: TaskHost, origin: str | None) -> Grant | None:
    """The grant a ticket carries, once, posted from the page it was issued
    for (`origin`: the request's Origin header): a second use, another host,
    another origin (or none), a forged or expired ticket give None."""
    try:
        payload = signing.loads(ticket, salt=_TICKET_SALT, max_age=TICKET_SECONDS)
    except signing.BadSignature:
        return None
    if (payload.get("a"), payload.get("p")) != (host.attempt_id, host.port):
        return None
    if not origin or not secrets.compare_digest(origin.lower().encode(), str(payload.get("o", "")).encode()):
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


@dataclass(frozen=True)
class EnterForm:
    """What the portal's page posts to the task host: `ticket` to `action`."""

    action: str
    ticket: str

    @property
    def task_host_url(self) -> str:
        """Where the port opens, as the page names it."""
        return self.action.removesuffix(ENTER_PATH)


def web_port_enter_form(*, user: User, attempt_id: int, port: int, next_path: str, secure: bool,
                        portal_host: str) -> EnterForm:
    """The form that takes the user into the task host. The task host is on
    the port the portal was reached on (`portal_host`, the request's Host),
    unless PORTAL_PROXY_PORT names another; the page posting the form is at
    the portal's origin as reached, which the ticket names."""
    scheme = "https" if secure else "http"
    ticket = ticket_issue(user=user, attempt_id=attempt_id, port=port, next_path=next_path,
                          origin=f"{scheme}://{portal_host}")
    portal_port = portal_host.rsplit(":", 1)[1] if not portal_host.endswith("]") and ":" in portal_host else ""
    port_part = str(settings.PORTAL_PROXY_PORT or portal_port)
    default = "443" if secure else "80"
    authority = TaskHost(attempt_id, port).name + (f":{port_part}" if port_part and port_part != default else "")
    return EnterForm(action=f"{scheme}://{authority}{ENTER_PATH}", ticket=ticket)


# ----------------------------------------------------------- forward proofs


@dataclass(frozen=True)
class ForwardRequest:
    """What a valid forward proof asks a node's forwarder for."""

    node_name: str
    attempt_id: int
    port: int
    issued_ms: int  # Unix time in milliseconds, by the portal's clock
    nonce: str


def _forward_mac(request: ForwardRequest, secret: str) -> str:
    # The key is the node's own (derived from the secret key and its name),
    # and the node is in the message too: a proof is good at one node only.
    message = (f"{FORWARD_GREETING} {request.node_name} {request.attempt_id} {request.port} "
               f"{request.issued_ms} {request.nonce}")
    return salted_hmac(_FORWARD_KEY_SALT + request.node_name, message, secret=secret, algorithm="sha256").hexdigest()


def forward_proof_line(*, node_name: str, attempt_id: int, port: int, now_ms: int | None = None) -> bytes:
    """The first line the portal sends to a node's forwarder (made at
    `now_ms`, by default now)."""
    issued_ms = int(time.time() * 1000) if now_ms is None else now_ms
    request = ForwardRequest(node_name, attempt_id, port, issued_ms, secrets.token_hex(16))
    mac = _forward_mac(request, settings.SECRET_KEY)
    return (f"{FORWARD_GREETING} {request.node_name} {request.attempt_id} {request.port} {request.issued_ms} "
            f"{request.nonce} {mac}\n").encode("ascii")


def forward_proof_read(line: bytes, *, node_name: str, now_ms: int) -> ForwardRequest | None:
    """The request a proof line carries, if it is well formed, for this
    node, fresh, and signed with the secret key (or one of its fallbacks,
    while the key is rotated); None otherwise. Whether it was used already
    is the forwarder's to check (its nonce)."""
    match = _PROOF_RE.fullmatch(line.decode("ascii", errors="replace"))
    if match is None or match.group(1) != node_name:
        return None
    request = ForwardRequest(match.group(1), int(match.group(2)), int(match.group(3)), int(match.group(4)),
                             match.group(5))
    if abs(now_ms - request.issued_ms) > FORWARD_PROOF_SECONDS * 1000:
        return None
    secrets_known = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    if not any(hmac.compare_digest(_forward_mac(request, key), match.group(6)) for key in secrets_known):
        return None
    return request


def _forward_port_key(node_name: str) -> str:
    return f"{settings.PAI_INSTANCE}:web-forward-port:{node_name}"


def forward_port_advertise(*, node_name: str, port: int, seconds: float) -> None:
    """The node's forwarder listens on `port` (said again before it expires)."""
    cache.set(_forward_port_key(node_name), port, timeout=max(1, int(seconds)))


def forward_port_withdraw(*, node_name: str, port: int) -> None:
    if cache.get(_forward_port_key(node_name)) == port:
        cache.delete(_forward_port_key(node_name))


def forward_port_of(node_name: str) -> int | None:
    """Where the node's forwarder listens, None if its agent is away."""
    port = cache.get(_forward_port_key(node_name))
    return port if isinstance(port, int) else None
