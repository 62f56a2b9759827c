"""A real image registry for tests: Debian's docker-registry on loopback,
stopped by PID. Docker lets 127.0.0.1 registries be plain HTTP by default,
so no certificate is needed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests import services as test_services
from tests.cluster import free_port, wait_for

# The registries running_registry started, by address, for frozen() and
# down(); and how to start each again.
_PROCESSES: dict[str, subprocess.Popen] = {}
_FOLDERS: dict[str, Path] = {}


def forget(image: str) -> None:
    """Remove `image` from the engine, layers and all, once the containers
    that used it are gone (the node removes a task's container after it ends)."""
    import docker
    import docker.errors

    api = docker.from_env().api

    def removed() -> bool:
        try:
            api.remove_image(image)
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError:
            return False  # a container still uses it
        return True

    wait_for(removed, timeout=60, what=f"{image} to be removable")


@contextmanager
def image_in_registry(image: str, dockerfile: str) -> Iterator[str]:
    """`image` built from `dockerfile` (FROM a local image), pushed to the
    registry its name gives and then removed from the engine: a task gets
    it only by a pull. Removed from the engine again afterwards."""
    import docker

    subprocess.run(["docker", "build", "-q", "-t", image, "-"], input=dockerfile, text=True, check=True,
                   capture_output=True, timeout=600)
    try:
        events = list(docker.from_env().api.push(image, stream=True, decode=True))
        assert not [e for e in events if e.get("error")], events
        forget(image)
        yield image
    finally:
        forget(image)


@contextmanager
def running_registry(folder: Path, *, users: dict[str, str] | None = None) -> Iterator[str]:
    """A registry on 127.0.0.1:<free port> keeping its data in `folder`
    (removed at the end); with `users`, it wants one of their passwords
    (htpasswd). Yields its address."""
    test_services.need("docker-registry")
    port = free_port()
    auth = ""
    if users:
        test_services.need("htpasswd")
        lines = [subprocess.run(["htpasswd", "-Bbn", name, password], capture_output=True, text=True,
                                check=True).stdout.strip() for name, password in users.items()]
        (folder / "htpasswd").write_text("\n".join(lines) + "\n")
        auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {folder / 'htpasswd'}\n"
    (folder / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}")
    address = f"127.0.0.1:{port}"
    _FOLDERS[address] = folder
    _PROCESSES[address] = _serve(folder, port)
    try:
        yield address
    finally:
        _FOLDERS.pop(address, None)
        process = _PROCESSES.pop(address, None)
        if process is not None:
            _end(process)
        shutil.rmtree(folder, ignore_errors=True)


def _serve(folder: Path, port: int) -> subprocess.Popen:
    with open(folder / "registry.log", "ab") as log:
        process = subprocess.Popen(["docker-registry", "serve", str(folder / "config.yml")], stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: process.poll() is None and socket.create_connection(("127.0.0.1", port), 1).close() is None,
                 timeout=20, what="the registry to listen")
    except BaseException:
        _end(process)
        raise
    return process


def _end(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGCONT)  # a frozen() left stopped would not hear SIGTERM
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@contextmanager
def down(address: str) -> Iterator[None]:
    """The registry at `address` (one of running_registry's) stopped, so
    that connections to it are refused, as to a registry that is down;
    started again at the end, on the same port and with the same images."""
    _end(_PROCESSES.pop(address))
    try:
        yield
    finally:
        _PROCESSES[address] = _serve(_FOLDERS[address], int(address.rpartition(":")[2]))


@contextmanager
def frozen(address: str) -> Iterator[None]:
    """The registry at `address` (one of running_registry's) stopped with
    SIGSTOP: connections to it are accepted by the kernel and then nothing
    is ever sent, as from a registry that hangs, mid-download or before;
    continued at the end."""
    process = _PROCESSES[address]
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


@contextmanager
def trickling(address: str, *, stopped: float = 0.45, running: float = 0.05) -> Iterator[None]:
    """The registry at `address` stopped and continued in turn (`stopped` s,
    then `running` s), so that it sends a little now and then, as a registry
    that trickles on purpose; running again at the end."""
    process = _PROCESSES[address]
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            os.kill(process.pid, signal.SIGSTOP)
            done.wait(stopped)
            os.kill(process.pid, signal.SIGCONT)
            done.wait(running)

    thread = threading.Thread(target=cycle, name="trickle", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        os.kill(process.pid, signal.SIGCONT)


@contextmanager
def registry_agent(cluster, registry: str, name: str, *, gpus: int, gpu_type: str,
                   env: dict[str, str] | None = None) -> Iterator[str]:
    """A node agent of its own (the cluster's port range 5), to which the
    admin opened the loopback registry, with `env` in its environment too;
    stopped at the end."""
    cluster.start_agent(name, ports=cluster.port_range(5), gpus=gpus, gpu_type=gpu_type,
                        env={"REGISTRY_ALLOWED": registry, **(env or {})})
    from tests.helpers import stop_node_agent

    try:
        yield name
    finally:
        stop_node_agent(cluster, name)


class DroppingProxy:
    """A TCP proxy on loopback to the registry at `upstream`, through which
    the engine pulls (its address names the images). While `dropping` is
    set, the answer to a GET of the blob `blob` (a digest) is cut after its
    headers and a few bytes of its body, and the connection reset, as by a
    registry (or the network before it) that drops mid-pull; all else goes
    through as it is. `cuts`: how many answers it cut so far."""

    def __init__(self, upstream: str, blob: str) -> None:
        self.upstream = upstream
        self.blob = blob.encode()
        self.dropping = threading.Event()
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="dropping-proxy", daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            host, _, port = self.upstream.rpartition(":")
            server = socket.create_connection((host, int(port)), 10)
            doomed = threading.Event()  # the answer now coming is the blob's, to be cut
            threading.Thread(target=self._requests, args=(client, server, doomed), daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client, doomed), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, doomed: threading.Event) -> None:
        # The engine sends a request on a connection only once the answer
        # before it was read: what the server sends after this GET is its answer.
        blob_get = re.compile(rb"(?:^|\r\n)GET /v2/\S*/blobs/" + re.escape(self.blob) + rb" ")
        try:
            while data := client.recv(65536):
                if self.dropping.is_set() and blob_get.search(data):
                    doomed.set()
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(server)

    def _answers(self, server: socket.socket, client: socket.socket, doomed: threading.Event) -> None:
        held = b""
        try:
            while data := server.recv(65536):
                if not doomed.is_set():
                    client.sendall(data)
                    continue
                held += data
                headers_end = held.find(b"\r\n\r\n")
                if headers_end >= 0 and len(held) >= headers_end + 4 + 8:
                    client.sendall(held[:headers_end + 4 + 8])  # headers, and 8 bytes of the body
                    self.cuts += 1
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
                    # Wakes the thread reading the engine's requests on this socket:
                    # until it lets go of it, closing it here sends nothing.
                    client.shutdown(socket.SHUT_RD)
                    break
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


@contextmanager
def dropping_proxy(upstream: str, blob: str) -> Iterator[DroppingProxy]:
    proxy = DroppingProxy(upstream, blob)
    try:
        yield proxy
    finally:
        proxy.close()
