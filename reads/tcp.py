"""A small asyncio TCP server base for the protocol listeners (KT, memcached).

Built on `asyncio.Protocol` callbacks rather than streams: a request is parsed and answered
inside `data_received`, with no coroutine switch, which is most of a small read's cost.
Each connection keeps a buffer; a synchronous `Step` answers the complete requests it holds
(one short LMDB read transaction per request, never held across a callback) and the answers
are written in order, so pipelined requests work. Backpressure: when the transport's write
buffer is full, the connection stops reading until it drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from reads.metrics import READ_ERRORS

log = logging.getLogger(__name__)

#: A connection's protocol step: answer as many complete requests as the buffer holds,
#: deleting them from its front. Returns (reply bytes, close after writing).
Step = Callable[[bytearray], tuple[bytes, bool]]


class _Conn(asyncio.Protocol):
    def __init__(self, service: TcpService) -> None:
        self.service = service
        self.step = service.make_step()
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = transport  # type: ignore[assignment]
        self.service.conns.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        self.buf += data
        try:
            reply, close = self.step(self.buf)
        except Exception:
            # A bug must cost one connection, never the listener or the process.
            log.exception("%s listener: request failed; closing the connection", self.service.name)
            READ_ERRORS.labels(self.service.name, "internal").inc()
            t.close()
            return
        if reply:
            t.write(reply)
        if close:
            t.close()

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.conns.discard(self)
        self.transport = None
        self.buf = bytearray()


class TcpService:
    """Listen on host:port; each connection gets a fresh `Step` from `make_step()`.

    Implements `core.service.Service`.
    """

    def __init__(self, name: str, host: str, port: int, make_step: Callable[[], Step]) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.make_step = make_step
        self.conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self.conns)

    async def start(self) -> None:
        """Bind and listen; returns once connections are accepted."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Conn(self), self.host, self.port, reuse_address=True
        )

    async def stop(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is None:
            return
        self._server.close()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 5)
        self._server = None
