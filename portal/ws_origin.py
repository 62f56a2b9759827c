"""The portal's WebSockets (the browser terminal) accept only pages of the
portal itself: the Origin header must equal the portal's own origin exactly,
scheme, host and port.

Channels' AllowedHostsOriginValidator compares host names only, so a page
served by a job on another port of the portal's host (review finding 1)
passed it. This is the rule Django's CSRF check applies to forms: the origin
must be `<scheme>://<Host header>` for a Host in ALLOWED_HOSTS, or one of
CSRF_TRUSTED_ORIGINS (a portal behind a TLS front that rewrites the Host).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http.request import validate_host

# 403 on the WebSocket handshake (the ASGI spec: close before accept).
_DENY = {"type": "websocket.close", "code": 4403}


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def portal_origins(scope: dict[str, Any]) -> set[str]:
    """The origins a WebSocket of this request may come from."""
    origins = set(settings.CSRF_TRUSTED_ORIGINS)
    host = (_header(scope, b"host") or "").lower()
    if host and validate_host(host.rsplit(":", 1)[0] if not host.endswith("]") else host, settings.ALLOWED_HOSTS):
        secure = scope.get("scheme") in ("wss", "https") or settings.HTTPS
        origins.add(f"{'https' if secure else 'http'}://{host}")
    return origins


def origin_allowed(scope: dict[str, Any]) -> bool:
    origin = _header(scope, b"origin")
    return origin is not None and origin.lower() in {o.lower() for o in portal_origins(scope)}


class ExactOriginValidator:
    """ASGI middleware: refuse a WebSocket whose Origin is not the portal's."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            message = await receive()  # websocket.connect
            if message["type"] == "websocket.connect":
                await send(_DENY)
            return
        await self.application(scope, receive, send)
