"""uvicorn's httptools protocol, handing request bodies on without copying
them twice.

uvicorn collects what arrives of a body in a bytearray (`+=`, a copy) and
gives the app bytes(...) of it (another copy). When the app is keeping up,
as the upload reader is (portal/http_bridge.py reads ahead), each socket
read is the whole next message: here it is handed on as it is. When pieces
pile up, uvicorn's own way joins them. On a 200 MB upload the two copies
were a fifth of the worker's copying (perf, bench/hdfs_transfer.py's setup).

It also gives each request's scope a way to drop its connection at once
(ABORT_EXTENSION), for a client that stalls a streamed answer.
"""

from __future__ import annotations

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from portal.http_bridge import ABORT_EXTENSION


class PortalHttpToolsProtocol(HttpToolsProtocol):
    def on_message_begin(self) -> None:
        super().on_message_begin()
        # portal/http_bridge.py drops a client that stalls a streamed answer
        # at once: a close would wait for it to take what is buffered.
        self.scope.setdefault("extensions", {})[ABORT_EXTENSION] = self.transport.abort  # type: ignore[typeddict-item]

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle.body or cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            super().on_body(body)  # joins (or drops) as uvicorn does
            return
        # receive() sends bytes(cycle.body): for bytes that is the object itself.
        cycle.body = body  # type: ignore[assignment]  (uvicorn's is a bytearray)
        if len(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()
