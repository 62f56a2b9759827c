"""An HTTP peer for tests that answers byte for byte whatever it is told to:
a webhook receiver that misbehaves, a task's web port speaking odd HTTP."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class RawHttpServer:
    """On `address` (a free port): reads each request's head and answers what
    `answer` is (or makes of the head's bytes), each connection on a thread
    of its own; the heads are kept in `requests`."""

    def __init__(self, answer: bytes | Callable[[bytes], bytes], *, address: str = "127.0.0.1") -> None:
        self.answer = answer if callable(answer) else (lambda _head: answer)
        self.requests: list[bytes] = []
        self.sock = socket.create_server((address, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                self.requests.append(data)
                conn.sendall(self.answer(data))
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
