"""A small asyncio TCP server base for the protocol listeners (KT, memcached).

Each connection reads bytes into a buffer, hands complete requests to a synchronous
handler (one short LMDB read transaction per request, never across an await) and writes
the answers; pipelined requests are answered in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

#: A connection's protocol step: answer as many complete requests as the buffer holds,
#: deleting them from its front. Returns (reply bytes, close after writing).
Step = Callable[[bytearray], tuple[bytes, bool]]


class TcpService:
    """Listen on host:port; each connection gets a fresh `Step` from `make_step()`."""

    def __init__(self, name: str, host: str, port: int, make_step: Callable[[], Step]) -> None:
        self.name = name
        self.host = host
        self.port = port
        self._make_step = make_step
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._conns)

    async def start(self) -> None:
        """Bind and listen; returns once connections are accepted."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        step = self._make_step()
        buf = bytearray()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                buf += data
                reply, close = step(buf)
                if reply:
                    writer.write(reply)
                    await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
