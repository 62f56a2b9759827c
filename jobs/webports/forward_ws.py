"""One WebSocket through to a task's web port (Jupyter's kernels,
TensorBoard, ...), message by message, for as long as the user may use it.

The connection to the job goes through the node's forwarder
(node_link.py), but the handshake names the task host (Host, and the
browser's own Origin), so an app that checks its Origin against its Host
(Jupyter does) sees a consistent pair. While it is open the user's right
is checked again every RECHECK_SECONDS (forward_http.py): a stopped task
or a deactivated user closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from jobs.services.webports import WebPortTarget
from jobs.webports import headers as hdrs
from jobs.webports.forward_http import job_tls_context, until_revoked
from jobs.webports.node_link import CONNECT_SECONDS, NodeRefused, open_task_socket

# A message from the job (uvicorn's default bound; the browser's to the job
# are bounded by the portal's workers, WS_MAX_MESSAGE_BYTES in portal/workers.py).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Frames of the job's read ahead of the browser. websockets' default, 16,
# let a browser that takes nothing make the portal hold 16 messages of up
# to MAX_MESSAGE_BYTES each; with 1 it stops reading past one or two.
MAX_QUEUED_FRAMES = 1
CLOSE_FORBIDDEN = 4403
CLOSE_UNREACHABLE = 4502


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name), None)


async def _open(scope: dict[str, Any], target: WebPortTarget) -> ClientConnection:
    sock = await open_task_socket(target)
    path = scope.get("raw_path") or scope["path"].encode()
    query = b"?" + scope["query_string"] if scope.get("query_string") else b""
    uri = f"{'wss' if target.tls else 'ws'}://{_header(scope, b'host')}{(path + query).decode('latin-1')}"
    client = (scope.get("client") or ("", 0))[0]
    origin = _header(scope, b"origin")
    headers = hdrs.to_job(scope["headers"], client=client, scheme=scope.get("scheme", "ws"), websocket=True)
    try:
        return await connect(
            uri, sock=sock, ssl=job_tls_context() if target.tls else None, origin=origin,  # type: ignore[arg-type]
            additional_headers=[(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers],
            subprotocols=scope.get("subprotocols") or None, user_agent_header=None, compression=None,
            open_timeout=CONNECT_SECONDS, max_size=MAX_MESSAGE_BYTES, max_queue=MAX_QUEUED_FRAMES, proxy=None,
        )
    except BaseException:
        sock.close()
        raise


async def forward_websocket(scope: dict[str, Any], receive: Any, send: Any, target: WebPortTarget,
                            still_allowed: Callable[[], Awaitable[bool]]) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    try:
        upstream = await _open(scope, target)
    except (NodeRefused, OSError, asyncio.TimeoutError, InvalidHandshake, InvalidStatus):
        await send({"type": "websocket.close", "code": CLOSE_UNREACHABLE})
        return
    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
    pumps = [asyncio.ensure_future(_from_browser(receive, upstream)),
             asyncio.ensure_future(_to_browser(send, upstream)),
             asyncio.ensure_future(_recheck(still_allowed))]
    try:
        done, _pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        code = next(iter(done)).result()
    finally:
        for pump in pumps:
            pump.cancel()
        await upstream.close()
    if code is not None:
        with contextlib.suppress(Exception):
            await send({"type": "websocket.close", "code": code})


async def _from_browser(receive: Any, upstream: ClientConnection) -> int | None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return None
        data = message.get("text") if message.get("text") is not None else message.get("bytes")
        if data is not None:
            try:
                await upstream.send(data)
            except ConnectionClosed:
                return 1000


async def _to_browser(send: Any, upstream: ClientConnection) -> int:
    try:
        async for data in upstream:
            await send({"type": "websocket.send", "text": data} if isinstance(data, str)
                       else {"type": "websocket.send", "bytes": data})
    except ConnectionClosed:
        pass
    code = upstream.close_code or 1000
    return code if code == 1000 or 3000 <= code <= 4999 else 1000


async def _recheck(still_allowed: Callable[[], Awaitable[bool]]) -> int:
    await until_revoked(still_allowed)
    return CLOSE_FORBIDDEN
