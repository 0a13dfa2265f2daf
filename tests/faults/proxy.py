"""A TCP proxy that injects faults into replication streams (source -> replica direction).

It parses the frames it forwards (`replicator/frames.py`) so faults land on frame
boundaries or inside frames on purpose:

- ``cut_after``: close both sides once this many bytes went downstream (per connection);
- ``delay``: sleep this long before forwarding each frame;
- ``duplicate_every``: send every n-th RECORD frame twice (a repeated seq);
- ``drop_every``: skip every n-th RECORD frame (a seq gap);
- ``truncate_every``: send only the first half of every n-th frame, then carry on with the
  next frames (a spliced, corrupt stream);
- ``blackhole_after``: after this many frames, forward nothing more but keep the connection
  open (a stalled source);
- ``raw``: forward bytes without parsing (snapshot transfers are not framed after the
  offer); only ``cut_after`` applies.

Runs its own event loop in a thread; `faults` can be changed while it runs, and
`connections` counts accepted connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from typing import Any

from replicator import frames


@dataclass
class Faults:
    """What to break, per connection (counts start over on every connection)."""

    cut_after: int | None = None
    delay: float = 0.0
    duplicate_every: int = 0
    drop_every: int = 0
    truncate_every: int = 0
    blackhole_after: int | None = None
    raw: bool = False
    #: Apply faults only to the first this-many connections (None = all).
    only_first: int | None = None


class FaultProxy:
    """127.0.0.1:`port` -> 127.0.0.1:`target`."""

    def __init__(self, target: int, faults: Faults | None = None, port: int = 0) -> None:
        self.target = target
        self.faults = faults or Faults()
        self.connections = 0
        self.injected: dict[str, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        fut = asyncio.run_coroutine_threadsafe(self._start(port), self._loop)
        self.port: int = fut.result(10)

    async def _start(self, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        return int(self._server.sockets[0].getsockname()[1])

    def _count(self, what: str) -> None:
        self.injected[what] = self.injected.get(what, 0) + 1

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._handlers.add(me)
        self.connections += 1
        n = self.connections
        only = self.faults.only_first
        active = only is None or n <= only
        swriter: asyncio.StreamWriter | None = None
        tasks: set[asyncio.Future[None]] = set()
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target)
            tasks = {
                asyncio.ensure_future(self._pipe(creader, swriter)),
                asyncio.ensure_future(self._down(sreader, cwriter, active)),
            }
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
            for w in (cwriter, swriter):
                if w is not None:
                    w.close()
                    with contextlib.suppress(Exception):
                        await w.wait_closed()
            self._handlers.discard(me)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()

    async def _down(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, active: bool) -> None:
        # Faults are read live, so a test can change them while a connection is open.
        sent = 0
        nframes = 0
        nrecords = 0
        none = Faults()
        f = self.faults if active else none
        snapshot_raw = f.raw

        async def out(data: bytes) -> bool:
            nonlocal sent
            if f.cut_after is not None and sent + len(data) >= f.cut_after:
                w.write(data[: max(0, f.cut_after - sent)])
                await w.drain()
                self._count("cut")
                return False
            w.write(data)
            await w.drain()
            sent += len(data)
            return True

        while True:
            f = self.faults if active else none
            if snapshot_raw:
                data = await r.read(65536)
                if not data or not await out(data):
                    return
                continue
            try:
                head = await r.readexactly(frames.HEADER_SIZE)
                h = frames.decode_header(head)
                body = await r.readexactly(h.length)
            except asyncio.IncompleteReadError:
                return
            frame = head + body
            nframes += 1
            if f.blackhole_after is not None and nframes > f.blackhole_after:
                self._count("blackhole")
                await asyncio.sleep(3600)  # the fault itself: nothing passes any more
            if f.delay:
                await asyncio.sleep(f.delay)  # the fault itself: a slow link
            if h.type == frames.SNAPSHOT:
                snapshot_raw = True  # the file bytes follow unframed
            if h.type == frames.RECORD:
                nrecords += 1
                if f.drop_every and nrecords % f.drop_every == 0:
                    self._count("drop")
                    continue
                if f.truncate_every and nrecords % f.truncate_every == 0:
                    self._count("truncate")
                    if not await out(frame[: len(frame) // 2]):
                        return
                    continue
                if f.duplicate_every and nrecords % f.duplicate_every == 0:
                    self._count("duplicate")
                    if not await out(frame):
                        return
            if not await out(frame):
                return

    def close(self) -> None:
        """Stop accepting and drop every connection."""

        async def _stop() -> None:
            if self._server is not None:
                self._server.close()
            handlers = list(self._handlers)
            for t in handlers:
                t.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
