"""The gunicorn worker: uvicorn's, with a bound on WebSocket messages.

uvicorn reads a WebSocket message whole before the app sees it, 16 MB by
default; the browser terminal's messages are keystrokes, pastes (cut to
64 KB, jobs/terminal.py) and resizes. With this bound, and uvicorn pausing
its reads until the app takes each message, what one connection can make a
worker hold is a message and a socket read, whatever the client sends.
"""

from __future__ import annotations

from typing import Any

from uvicorn_worker import UvicornWorker

from portal.env import env_bool

WS_MAX_MESSAGE_BYTES = 512 * 1024


class PortalWorker(UvicornWorker):
    # uvicorn believes X-Forwarded-For from loopback clients by default, and
    # every client of a portal bound to 127.0.0.1 is one: anyone could then
    # choose the address the failed-login limits count. Only behind a proxy
    # of the admin's (PORTAL_BEHIND_PROXY=1, FORWARDED_ALLOW_IPS its address).
    CONFIG_KWARGS: dict[str, Any] = {
        **UvicornWorker.CONFIG_KWARGS, "ws_max_size": WS_MAX_MESSAGE_BYTES,
        "proxy_headers": env_bool("PORTAL_BEHIND_PROXY", False),
        "http": "portal.http_protocol:PortalHttpToolsProtocol",  # httptools, one copy less per body piece
    }
