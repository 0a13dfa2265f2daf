"""The upstream channel: typed frames from a replication client to its source.

A replication link carries the log down the tree; this module is its way back up, on the
same connection: a replica sends ``UPSTREAM`` frames (kind u16 + payload, at most
`frames.MAX_UPSTREAM_PAYLOAD` bytes; byte layout in `replicator/frames.py`) to the source
it streams from, and the source dispatches each one by kind to a registered handler.

- Negotiated per connection: the client sets `frames.OPT_UPSTREAM` in its HELLO, the
  source answers with the `frames.WELCOME_UPSTREAM` header flag when it will read them.
  A client never sends to a source that did not say so (an older one), and a source only
  reads after a WELCOME carrying the flag.
- Forward compatible: a kind with no handler is logged (once per kind and connection
  origin) and ignored, never a reason to drop the link.
- Bounded: a frame's size is checked on its header before a byte of the body is read; the
  client's outbox holds at most `OUTBOX_FRAMES` frames / `OUTBOX_BYTES` bytes while no
  upstream-capable source is connected, dropping the oldest (counted).
- Relayed: a tier-1 replica's source hands kinds it does not handle itself to its own
  client's outbox (`relay_to`), so tier-2 frames travel on toward the root.
- Best effort, at most once: frames in flight when a link is cut are lost. Senders that
  must not lose state re-send it in full when a link comes up (`UpstreamOutbox.on_connect`).

Handlers run on the source's event loop (on the root: the gateway's), called from the
transport's callback as each frame's bytes arrive (`Link.push`; a standby's APPLIED
report gates the root's acknowledgements: no task wake-up in between), so they must be
cheap: fold the payload into memory and let a batch or a timer persist it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import struct
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from prometheus_client import Counter

from core.errors import ProtocolError
from replicator import frames
from replicator.tcp import read_stream_frame
from replicator.transport import Frame, Link, PeerClosed

log = logging.getLogger("mercury.replication.upstream")

#: Kinds (u16). Add new ones here; a source that does not know a kind ignores it.
#: Read summaries of a node's readers (`reads/readstats.py`'s payload).
READS = 1
#: A root candidate's standby: the last seq it durably applied (u64), for semi-synchronous
#: acknowledgement on the leader (`ha/standby.py`, `ha/leader.py`).
APPLIED = 2
_APPLIED = struct.Struct("<Q")


def encode_applied(seq: int) -> bytes:
    """Payload of an `APPLIED` frame: the last seq a standby durably applied."""
    return _APPLIED.pack(seq)


def decode_applied(payload: bytes) -> int:
    """The seq in an `APPLIED` payload (ValueError when malformed)."""
    if len(payload) != _APPLIED.size:
        raise ValueError(f"APPLIED payload of {len(payload)} bytes")
    return int(_APPLIED.unpack(payload)[0])


#: Frames the client keeps while no upstream-capable source is connected.
OUTBOX_FRAMES = 1024
OUTBOX_BYTES = 16 << 20
#: A source must take an upstream frame within this time (else the session ends).
SEND_TIMEOUT = 30.0
_UPSTREAM_ONLY = frozenset({frames.UPSTREAM})
#: Exported where the source runs in the process serving /metrics (the root).
FRAMES = Counter(
    "mercury_upstream_frames",
    "UPSTREAM frames a replication source received, by kind and outcome (handled, relayed "
    "by a replica, ignored: a kind nobody handles)",
    ["kind", "outcome"],
)


class Origin(NamedTuple):
    """Which connection an upstream frame came in on: the client's id (from its HELLO)
    and its address. A relayed frame's origin is the relaying replica, not the node that
    made it: a payload that needs its maker names it itself. `role`: the role of the
    peer's TLS certificate (`net.certs`; "none" for one without a role let in by
    --tls-allow-roleless), None on a link without TLS."""

    client_id: bytes
    peer: str
    role: str | None = None


Handler = Callable[[Origin, int, bytes], None]


class UpstreamRouter:
    """The source side: reads UPSTREAM frames and dispatches them by kind."""

    def __init__(self) -> None:
        self._handlers: dict[int, Handler] = {}
        #: Called for kinds with no handler (a replica relays them upstream); None: log
        #: and ignore them.
        self.fallback: Handler | None = None
        #: Frames received, by kind (tests and status read it).
        self.received: collections.Counter[int] = collections.Counter()
        self.ignored: collections.Counter[int] = collections.Counter()
        self._warned: set[tuple[int, str]] = set()

    def register(self, kind: int, handler: Handler) -> None:
        """Call `handler(origin, kind, payload)` for every frame of `kind`."""
        self._handlers[kind] = handler

    def dispatch(self, origin: Origin, kind: int, payload: bytes) -> None:
        """Hand one frame to its handler; an unknown kind is logged once and ignored. A
        handler's error is logged and the link stays up (one bad summary is not a reason
        to cut replication)."""
        self.received[kind] += 1
        handler = self._handlers.get(kind)
        outcome = "handled"
        if handler is None:
            handler, outcome = self.fallback, "relayed"
        if handler is None:
            self.ignored[kind] += 1
            FRAMES.labels(str(kind), "ignored").inc()
            if (kind, origin.peer) not in self._warned and len(self._warned) < 1024:
                self._warned.add((kind, origin.peer))
                log.warning("ignoring upstream frames of unknown kind %d from %s", kind, origin[1])
            return
        FRAMES.labels(str(kind), outcome).inc()
        try:
            handler(origin, kind, payload)
        except Exception:
            log.exception("upstream handler of kind %d failed on a frame from %s", kind, origin[1])

    def _frame(self, origin: Origin, frame: Frame) -> None:
        """One UPSTREAM frame from `origin` (ProtocolError, ending the link, when its body
        is not one)."""
        try:
            kind, payload = frames.decode_upstream(bytes(frame.body))
        except ValueError as err:
            raise ProtocolError(str(err)) from err
        self.dispatch(origin, kind, payload)

    async def serve_beside(self, link: Link, origin: Origin, stream: Awaitable[None]) -> None:
        """Run `stream` (the source's sending side) and the upstream reader together until
        either ends: a client that closed or sent a bad frame ends its stream too.

        The link's reading is switched to `Link.push`: each frame is dispatched as its
        bytes arrive, in the transport's callback."""
        sending = asyncio.ensure_future(stream)
        reading = link.push(lambda f: self._frame(origin, f), _UPSTREAM_ONLY)
        try:
            await asyncio.wait({sending, reading}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sending, reading):
                t.cancel()
            await asyncio.gather(sending, reading, return_exceptions=True)
        for t in (sending, reading):
            err = t.exception() if t.done() and not t.cancelled() else None
            if err is not None:
                raise err


class UpstreamOutbox:
    """The client side: frames waiting for (or being written to) an upstream-capable
    source. Call its methods on the event loop that runs the replication client."""

    def __init__(self, max_frames: int = OUTBOX_FRAMES, max_bytes: int = OUTBOX_BYTES) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._q: collections.deque[bytes] = collections.deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        #: Frames written to a source, and frames dropped because the outbox was full.
        self.sent = 0
        self.dropped = 0
        #: True while a session to an upstream-capable source pumps this outbox.
        self.connected = False
        #: The pumped session's link once its on-connect state is queued (None: none).
        self._link: Link | None = None

    def send(self, kind: int, payload: bytes) -> None:
        """Queue one frame (ValueError when `payload` is over the frame bound); the oldest
        frames are dropped (counted) when the outbox is over its bounds."""
        frame = frames.encode_upstream(kind, payload)
        link = self._link
        # When the link is idle the frame goes to the network now rather than one loop turn
        # later in `pump` (a standby's APPLIED report gates its leader's acknowledgements).
        # A link that is not taking what it gets queues as usual; `pump`'s drain times it out.
        if link is not None and not self._q and not link.closing() and not link.backlog():
            link.write(frame)
            self.sent += 1
            return
        self._q.append(frame)
        self._bytes += len(frame)
        while len(self._q) > self.max_frames or self._bytes > self.max_bytes:
            self._bytes -= len(self._q.popleft())
            self.dropped += 1
        self._ready.set()

    def pending(self) -> int:
        """Frames waiting to be sent."""
        return len(self._q)

    def on_connect(self, listener: Callable[[], None]) -> None:
        """Call `listener()` each time a session to an upstream-capable source starts
        (before anything queued is written): the place to re-send state in full."""
        self._listeners.append(listener)

    async def pump(self, link: Link, send_timeout: float = SEND_TIMEOUT) -> None:
        """Write queued frames to `link` until cancelled (the session's end). A frame
        leaves the queue once handed to the transport; TimeoutError when the source takes
        nothing for `send_timeout` seconds."""
        self.connected = True
        try:
            for listener in list(self._listeners):
                try:
                    listener()
                except Exception:
                    log.exception("upstream on_connect listener failed")
            self._link = link
            while True:
                while self._q:
                    frame = self._q.popleft()
                    self._bytes -= len(frame)
                    link.write(frame)
                    self.sent += 1
                    await link.drain(send_timeout)
                self._ready.clear()
                await self._ready.wait()
        finally:
            self._link = None
            self.connected = False


def relay_to(outbox: UpstreamOutbox) -> Handler:
    """A handler forwarding frames unchanged to `outbox` (a replica's own upstream)."""

    def relay(_origin: Origin, kind: int, payload: bytes) -> None:
        outbox.send(kind, payload)

    return relay


async def read_welcome(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    """The source's answer to a HELLO read from a raw stream, as (type, header flags,
    body): the flags say whether it reads upstream frames (`frames.WELCOME_UPSTREAM`).
    (A client on a `Link` reads it with `Link.recv`.)"""
    try:
        h, body = await read_stream_frame(reader, None)
    except PeerClosed:
        raise ProtocolError("connection closed by the peer") from None
    return h.type, h.flags, body


def pump_while(outbox: UpstreamOutbox | None, flags: int, link: Link) -> asyncio.Task[None] | None:
    """Start pumping `outbox` into `link` when the source's WELCOME `flags` accepted
    upstream frames; the task (cancel it when the session ends) or None."""
    if outbox is None or not flags & frames.WELCOME_UPSTREAM:
        return None
    return asyncio.ensure_future(outbox.pump(link))


class SpoolForwarder:
    """Sends the files another process drops in `directory` (one payload each, named
    ``*.bin``, written then renamed) upstream as frames of `kind`, oldest first, and
    deletes them. The payloads of the last `replay_s` seconds (at most `replay_bytes`) are
    kept and sent again each time a session starts, so a frame lost with a cut link is
    made good (a receiver merging them must be idempotent). A replica's readers spool
    their read summaries this way (`reads/readstats.py`); its worker runs this."""

    name = "upstream-spool"

    def __init__(
        self,
        directory: str,
        outbox: UpstreamOutbox,
        kind: int,
        *,
        interval: float = 1.0,
        replay_s: float = 36 * 3600.0,
        replay_bytes: int = 8 << 20,
    ) -> None:
        self.directory = directory
        self.outbox = outbox
        self.kind = kind
        self.interval = interval
        self.replay_s = replay_s
        self.replay_bytes = replay_bytes
        self._kept: collections.deque[tuple[float, bytes]] = collections.deque()
        self._kept_bytes = 0
        self.forwarded = 0
        self._task: asyncio.Task[None] | None = None
        outbox.on_connect(self._replay)

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def collect(self) -> list[bytes]:
        """Read and delete what is spooled now, oldest first (blocking file I/O: run it
        in a thread)."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".bin"))
        except FileNotFoundError:
            return []
        out = []
        for name in names[:256]:
            path = os.path.join(self.directory, name)
            try:
                with open(path, "rb") as f:
                    payload = f.read()
                os.unlink(path)
            except FileNotFoundError:
                continue
            if len(payload) > frames.MAX_UPSTREAM_PAYLOAD:
                log.warning("spooled payload %s of %d bytes is over the bound", name, len(payload))
                continue
            out.append(payload)
        return out

    def forward(self, payloads: list[bytes]) -> None:
        """Queue `payloads` upstream and keep them for a replay (on the loop)."""
        for payload in payloads:
            self.outbox.send(self.kind, payload)
            self._keep(payload)
        self.forwarded += len(payloads)

    def _keep(self, payload: bytes) -> None:
        now = time.monotonic()
        self._kept.append((now, payload))
        self._kept_bytes += len(payload)
        while self._kept and (
            self._kept_bytes > self.replay_bytes or self._kept[0][0] < now - self.replay_s
        ):
            self._kept_bytes -= len(self._kept.popleft()[1])

    def _replay(self) -> None:
        for _, payload in self._kept:
            self.outbox.send(self.kind, payload)

    async def _run(self) -> None:
        while True:
            try:
                self.forward(await asyncio.to_thread(self.collect))
            except OSError as err:
                log.warning("upstream spool %s: %s", self.directory, err)
            await asyncio.sleep(self.interval)
