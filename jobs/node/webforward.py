"""The node's web-port forwarder: how the portal's proxy reaches a task's
web port, on this machine or another.

Web-labelled ports are published on the node's loopback only
(NODE_WEB_PORT_ADDRESS, jobs/node/runner.py), so nothing off the node
reaches them. This forwarder listens on the node's own address (port
NODE_WEB_FORWARD_PORT, or one the kernel picks, advertised in the cache
while it runs) and takes a connection only if its first line is a valid
forward proof (jobs/services/webports.py): signed with this node's key,
fresh, never seen before, for a web port of a task running on this node.
Then it answers "OK" and splices the connection to that port on the
loopback, byte for byte both ways (HTTP, WebSockets, TLS of an https port:
the forwarder reads none of it). Anything else gets "NO <why>" and is
closed. It never connects anywhere else: the address is always the node's
loopback, the port always one of a running task's web ports.

One asyncio loop in one thread serves every connection; the database and
cache calls (a few per connection) go to worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections import Counter

from django.conf import settings
from django.db import close_old_connections

from jobs.services import webports

log = logging.getLogger(__name__)

PROOF_MAX_BYTES = 512
HANDSHAKE_SECONDS = 5.0
CONNECT_SECONDS = 10.0
READ_BYTES = 64 * 1024
# Connections still to show a proof: past this many, new ones are closed at
# once (each waits at most HANDSHAKE_SECONDS).
MAX_HANDSHAKES = 128
REFUSED_PROOF = b"NO bad, stale or used proof\n"
REFUSED_PORT = b"NO not a web port of a task running on this node\n"
REFUSED_UNREACHABLE = b"NO the task's web port does not answer (yet)\n"
# The proxy tells this one (it starts "NO busy") to the browser as a 429.
REFUSED_BUSY = ("NO busy: this node forwards {limit} connections to the web ports of this user's tasks already, "
                "the most it takes (WEB_PORT_NODE_CONNECTIONS_PER_USER)\n")


class Nonces:
    """Proofs seen lately, each until it could no longer pass as fresh."""

    def __init__(self) -> None:
        self._expiry: dict[str, float] = {}

    def claim(self, nonce: str, *, now: float) -> bool:
        """True the first time a nonce is seen."""
        if len(self._expiry) > 1024:
            self._expiry = {n: t for n, t in self._expiry.items() if t > now}
        if nonce in self._expiry:
            return False
        self._expiry[nonce] = now + 2 * webports.FORWARD_PROOF_SECONDS + 1
        return True


def _listening_socket(address: str, port: int) -> socket.socket:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None  # a host name: listen on every address of the node
    family = socket.AF_INET6 if ip is not None and ip.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((str(ip) if ip is not None else "0.0.0.0", port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class WebForwarder:
    """Started by the node agent; lives as long as the agent."""

    def __init__(self, *, node_name: str, address: str, port: int = 0, task_ports: range = range(0)) -> None:
        if port in task_ports:
            raise ValueError(f"NODE_WEB_FORWARD_PORT={port} lies in the node's task ports "
                             f"{task_ports.start}-{task_ports.stop - 1}: choose a port outside them")
        self.node_name = node_name
        self.address = address
        self._sock = _listening_socket(address, port)  # bind errors stop the agent's start
        self.port: int = self._sock.getsockname()[1]
        # A proof made before we started cannot have been seen by us: refusing
        # those keeps a proof replayable neither before nor after a restart.
        self._started_ms = int(time.time() * 1000)
        self._nonces = Nonces()
        self._handshakes = 0
        # Connections spliced, per task owner (one loop: no lock). Each holds
        # two of the agent's file descriptors for as long as the client and
        # the app (both may be the owner's) keep it open.
        self.open: Counter[int] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="web-forward", daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the web-port forwarder did not start (see the log)")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    # ------------------------------------------------------------ serving

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:
            log.exception("the web-port forwarder stopped")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, sock=self._sock)
        self._ready.set()
        try:
            while True:
                await asyncio.to_thread(self._advertise)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), settings.NODE_HEARTBEAT_SECONDS)
                if self._stop.is_set():
                    break
        finally:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(webports.forward_port_withdraw, node_name=self.node_name, port=self.port)

    def _advertise(self) -> None:
        try:
            webports.forward_port_advertise(node_name=self.node_name, port=self.port,
                                            seconds=settings.NODE_LOST_AFTER_SECONDS)
        except Exception:  # Redis away: the heartbeat says so too; try again next beat
            log.exception("could not advertise the web-port forwarder")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._forward(reader, writer)
        except Exception:
            log.exception("forwarding a connection failed")
        finally:
            if not writer.is_closing():
                writer.transport.abort()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._handshakes >= MAX_HANDSHAKES:
            return
        self._handshakes += 1
        try:
            asked = await self._handshake(reader, writer)
        finally:
            self._handshakes -= 1
        if asked is None:
            await _close(writer)
            return
        port, owner_id = asked
        limit = settings.WEB_PORT_NODE_CONNECTIONS_PER_USER
        if self.open[owner_id] >= limit:
            writer.write(REFUSED_BUSY.format(limit=limit).encode("ascii"))
            await _close(writer)
            return
        self.open[owner_id] += 1
        try:
            await self._connect_and_splice(reader, writer, port)
        finally:
            self.open[owner_id] -= 1
            if not self.open[owner_id]:
                del self.open[owner_id]

    async def _connect_and_splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                  port: int) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(settings.NODE_WEB_PORT_ADDRESS, port), CONNECT_SECONDS)
        except (OSError, asyncio.TimeoutError):
            writer.write(REFUSED_UNREACHABLE)
            await _close(writer)
            return
        writer.write(b"OK\n")
        await splice(reader, writer, up_reader, up_writer)

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> tuple[int, int] | None:
        """(the task port a valid proof asks for, the task's owner); None
        (the reason sent) otherwise."""
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), HANDSHAKE_SECONDS)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, OSError):
            return None
        now_ms = int(time.time() * 1000)
        request = None
        if len(line) <= PROOF_MAX_BYTES:
            request = webports.forward_proof_read(line, node_name=self.node_name, now_ms=now_ms)
        if request is None or request.issued_ms < self._started_ms \
                or not self._nonces.claim(request.nonce, now=now_ms / 1000):
            writer.write(REFUSED_PROOF)
            return None
        owner_id = None if request.port == self.port else await asyncio.to_thread(self._task_owner, request)
        if owner_id is None:
            writer.write(REFUSED_PORT)
            return None
        return request.port, owner_id

    def _task_owner(self, request: webports.ForwardRequest) -> int | None:
        close_old_connections()  # a worker thread's connection may have gone stale
        return webports.web_port_owner_on_node(node_name=self.node_name, attempt_id=request.attempt_id,
                                               port=request.port)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """One direction, with back-pressure (drain): a slow reader on one side
    slows the writer on the other, nothing piles up here."""
    while True:
        data = await source.read(READ_BYTES)
        if not data:
            return
        sink.write(data)
        await sink.drain()


async def splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
    """Both directions, until either side ends or breaks. The proxy never
    half-closes (its HTTP client and WebSocket client do not), so an end of
    stream from either side is the end of the exchange: keeping the task's
    side open after the proxy left would hold it for as long as the app
    cares to send nothing."""
    pipes = [asyncio.ensure_future(_pipe(reader, up_writer)), asyncio.ensure_future(_pipe(up_reader, writer))]
    try:
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in pipes:
            task.cancel()
        outcomes = await asyncio.gather(*pipes, return_exceptions=True)
        broken = any(isinstance(outcome, OSError) for outcome in outcomes)
        for side in (writer, up_writer):
            if broken:
                side.transport.abort()  # a side reset: what is still buffered goes nowhere
            else:
                side.close()  # sends what drain() left buffered (up to its low mark), then FIN
