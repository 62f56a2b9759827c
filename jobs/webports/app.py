"""The proxy as an ASGI application: every request whose Host is under
PORTAL_PROXY_DOMAIN comes here (portal/asgi.py), never to the portal's views.

A task host answers one path itself (ENTER_PATH: a ticket posted from the
portal's page in, the proxy's cookie out); everything else needs that
cookie and a fresh check that its user may still use the port, then goes
through to the job.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.conf import settings

from jobs.services import webports
from jobs.webports import headers as hdrs
from jobs.webports.forward_http import forward_http, plain_response
from jobs.webports.forward_ws import CLOSE_FORBIDDEN, forward_websocket

log = logging.getLogger(__name__)

NOT_SIGNED_IN = ("Not signed in to this task's port. Sign in to the portal and open the port from its job page "
                 "(only the job's owner and portal admins may).")
ENTER_REFUSED = ("This link has expired or was used already, was not opened from the portal's own page, or the "
                 "task is no longer running: open the port again from its job page.")
ENTER_NOT_POSTED = "Open the task's port from its job page on the portal; this address takes no link."
FOREIGN_ORIGIN = ("Refused: this comes from a page of another site; its Origin is not this task's own address "
                  "(the proxy takes WebSockets and requests that may change something from the task's own pages only).")
TOO_MANY = ("You have {limit} requests or WebSockets open through the portal's proxy, the most one user may have "
            "at once (WEB_PORT_CONNECTIONS_PER_USER); close some and try again.")
# What a page of any origin may ask of a task host with its visitor's cookie:
# the app's own links, images and scripts.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A ticket is a few hundred bytes; a form body past this is no ticket.
ENTER_BODY_BYTES = 4096


def _header(scope: dict[str, Any], name: bytes) -> str:
    return next((value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name), "")


def _secure(scope: dict[str, Any]) -> bool:
    return scope.get("scheme") in ("https", "wss") or settings.HTTPS


def _own_origin(scope: dict[str, Any]) -> str:
    """The task host's origin as its pages send it (no default port)."""
    scheme = "https" if _secure(scope) else "http"
    authority = _header(scope, b"host").lower().removesuffix(":443" if scheme == "https" else ":80")
    return f"{scheme}://{authority}"


def _from_another_origin(scope: dict[str, Any]) -> bool:
    """Is this a WebSocket, or a request that may change something, sent by
    a page of another origin? The browser sends the proxy's cookie with it
    all the same (every task host is one site under a shared proxy domain),
    so the visitor's sign-in would speak for that page (finding 37). No
    Origin at all is not a browser's page (browsers send one with both)."""
    if scope["type"] == "http" and scope["method"] in SAFE_METHODS:
        return False
    origin = _header(scope, b"origin")
    return bool(origin) and origin.lower() != _own_origin(scope)


@database_sync_to_async
def _target_of(grant: webports.Grant) -> webports.WebPortTarget | None:
    return webports.grant_target(grant)


@database_sync_to_async
def _redeem(ticket: str, host: webports.TaskHost, origin: str) -> webports.Grant | None:
    return webports.ticket_redeem(ticket, host=host, origin=origin)


def _cookie_grants(scope: dict[str, Any], host: webports.TaskHost) -> list[webports.Grant]:
    """Every valid proxy cookie for this host. Under HTTPS only the __Host-
    name counts, which no other host can set; over plain HTTP a job on a
    sibling host may have set one of the same name on the parent domain, so
    none of them shadows another: each is tried."""
    name = webports.cookie_name(secure=_secure(scope))
    values = [v for k, v in hdrs.cookie_pairs(scope["headers"]) if k == name]
    grants = (webports.cookie_grant(value, host=host) for value in values)
    return [g for g in grants if g is not None]


async def _allowed(scope: dict[str, Any], host: webports.TaskHost) -> tuple[int, webports.WebPortTarget] | None:
    """(the user, where to forward) if a cookie lets its user in now."""
    for grant in _cookie_grants(scope, host):
        target = await _target_of(grant)
        if target is not None:
            return grant.user_id, target
    return None


async def _deny(scope: dict[str, Any], receive: Any, send: Any, status: int, text: str,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    if scope["type"] == "websocket":
        if (await receive())["type"] == "websocket.connect":
            await send({"type": "websocket.close", "code": CLOSE_FORBIDDEN})
        return
    await plain_response(send, status, text, extra)


class WebPortProxy:
    def __init__(self) -> None:
        # Exchanges being forwarded, per user, in this worker (one event
        # loop: no lock). What they hold is the worker's file descriptors,
        # so the count is the worker's own (finding 38).
        self.open: Counter[int] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        host = webports.task_host_from_header(_header(scope, b"host"))
        if host is None:
            await _deny(scope, receive, send, 404, "No such task port.")
            return
        if scope["type"] == "http" and scope["path"] == webports.ENTER_PATH:
            await self._enter(scope, receive, send, host)
            return
        if _from_another_origin(scope):
            await _deny(scope, receive, send, 403, FOREIGN_ORIGIN)
            return
        allowed = await _allowed(scope, host)
        if allowed is None:
            await _deny(scope, receive, send, 403, NOT_SIGNED_IN)
            return
        user_id, target = allowed
        if self.open[user_id] >= settings.WEB_PORT_CONNECTIONS_PER_USER:
            await _deny(scope, receive, send, 429, TOO_MANY.format(limit=settings.WEB_PORT_CONNECTIONS_PER_USER),
                        [(b"retry-after", b"10")])
            return
        self.open[user_id] += 1
        try:
            await self._forward(scope, receive, send, host, target)
        finally:
            self.open[user_id] -= 1
            if not self.open[user_id]:
                del self.open[user_id]

    async def _forward(self, scope: dict[str, Any], receive: Any, send: Any, host: webports.TaskHost,
                       target: webports.WebPortTarget) -> None:
        async def still_allowed() -> bool:
            return await _allowed(scope, host) is not None

        if scope["type"] == "websocket":
            await forward_websocket(scope, receive, send, target, still_allowed)
        else:
            await forward_http(scope, receive, send, target, still_allowed)

    async def _enter(self, scope: dict[str, Any], receive: Any, send: Any, host: webports.TaskHost) -> None:
        """The ticket comes in a POST from the portal's page, whose Origin
        the browser sets and the ticket names: a ticket in a link, or posted
        by a page of anyone else's, gets no one in (finding 36)."""
        if scope["method"] != "POST":
            await plain_response(send, 405, ENTER_NOT_POSTED, [(b"allow", b"POST")])
            return
        body = await _form_body(receive)
        if body is None:
            await plain_response(send, 413, ENTER_REFUSED)
            return
        tickets = parse_qs(body.decode("latin-1")).get("ticket") or [""]
        grant = await _redeem(tickets[0], host, _header(scope, b"origin"))
        if grant is None or await _target_of(grant) is None:
            await plain_response(send, 403, ENTER_REFUSED)
            return
        name = webports.cookie_name(secure=_secure(scope))
        cookie = (f"{name}={webports.cookie_value(grant)}; Path=/; HttpOnly; SameSite=Lax; "
                  f"Max-Age={settings.PORTAL_PROXY_SESSION_SECONDS}" + ("; Secure" if _secure(scope) else ""))
        # 303: the browser goes on with a GET of the landing path.
        await plain_response(send, 303, "", [
            (b"location", grant.next_path.encode("latin-1")), (b"set-cookie", cookie.encode("latin-1")),
            (b"referrer-policy", b"no-referrer"),
        ])


async def _form_body(receive: Any) -> bytes | None:
    """The request's body, None past ENTER_BODY_BYTES."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        body += message.get("body", b"")
        if len(body) > ENTER_BODY_BYTES:
            return None
        if not message.get("more_body", False):
            return body


class HostRouter:
    """Requests for a proxy host go to the proxy, all others to the portal."""

    def __init__(self, *, portal: Any, proxy: Any) -> None:
        self.portal = portal
        self.proxy = proxy

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and webports.is_proxy_host(_header(scope, b"host")):
            await self.proxy(scope, receive, send)
        else:
            await self.portal(scope, receive, send)
