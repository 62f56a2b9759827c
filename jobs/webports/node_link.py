"""The proxy's connection to a task's web port: always through the node
agent's forwarder (jobs/node/webforward.py), for a node on this machine as
for one on another, so there is one path and the tests walk it.

The forwarder listens on the node's address; the proxy sends a forward
proof as its first line (jobs/services/webports.py), and the forwarder
answers "OK" once it has connected to the port, or "NO <why>". After "OK"
the socket is the task's port, byte for byte: the caller speaks HTTP or
WebSocket over it (and TLS first, for an https port).
"""

from __future__ import annotations

import asyncio
import socket

from jobs.services import webports

CONNECT_SECONDS = 10
REPLY_MAX_BYTES = 256


class NodeRefused(Exception):
    """The node's forwarder is away or refused; the message says which."""


class NodeBusy(NodeRefused):
    """The node's forwarder holds as many connections to the task owner's
    web ports as it takes (WEB_PORT_NODE_CONNECTIONS_PER_USER)."""


async def open_task_socket(target: webports.WebPortTarget) -> socket.socket:
    """A connected, non-blocking socket to the task's web port (the caller
    owns it), or NodeRefused."""
    if target.forward_port is None:
        raise NodeRefused(f"the agent of node {target.node_name} is not running")
    loop = asyncio.get_running_loop()
    try:
        sock = await asyncio.wait_for(_connect(loop, target.node_address, target.forward_port), CONNECT_SECONDS)
    except (OSError, asyncio.TimeoutError) as exc:
        raise NodeRefused(f"node {target.node_name} does not answer at {target.node_address} "
                          f"({exc.__class__.__name__})") from None
    try:
        proof = webports.forward_proof_line(node_name=target.node_name, attempt_id=target.attempt_id,
                                            port=target.port)
        await loop.sock_sendall(sock, proof)
        reply = await asyncio.wait_for(_reply_line(loop, sock), CONNECT_SECONDS)
    except (OSError, asyncio.TimeoutError) as exc:
        sock.close()
        raise NodeRefused(f"node {target.node_name} broke the connection ({exc.__class__.__name__})") from None
    except BaseException:
        sock.close()
        raise
    if reply != b"OK":
        sock.close()
        reason = reply.removeprefix(b"NO ").decode("ascii", errors="replace") or "no answer"
        if reason.startswith("busy: "):
            raise NodeBusy(f"node {target.node_name} refused: {reason.removeprefix('busy: ')}")
        raise NodeRefused(f"node {target.node_name} refused: {reason}")
    return sock


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"{host} has no address")
    for family, kind, proto, _name, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error


async def _reply_line(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    """The forwarder's answer, read a byte at a time: whatever follows it is
    the task's, and must stay in the socket for the caller."""
    line = b""
    while len(line) < REPLY_MAX_BYTES:
        byte = await loop.sock_recv(sock, 1)
        if not byte or byte == b"\n":
            break
        line += byte
    return line
