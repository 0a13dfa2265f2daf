"""The replication transport seam: what the replication protocol needs of a network.

The source, the client, the upstream channel, bootstrap and the HA standby's history probe
speak to the network only through the three protocols below; which network it is, is
chosen where a process is wired. Two implementations:

- `replicator.tcp.TcpTransport`: TCP, plaintext or mutual TLS (the deployment's; the bytes
  on the wire are the frames of `replicator/frames.py`, unchanged).
- `replicator.memnet.MemoryNetwork`: links in memory with controllable delay, loss,
  reordering and partitions, deterministic given a seed, on the caller's event loop and
  its clock (tests; a simulated tree on a virtual clock).

Vocabulary. A *frame* is one encoded frame of `frames.py` (header and body); a *link* is
one connection between two endpoints, carrying frames both ways and, once a snapshot
transfer starts, raw file bytes from the source to the client (`send_file` /
`recv_file`). A *deadline* is a timeout in seconds from the call, on the clock of the
link's event loop (`loop.time()`), never the wall clock.

Threading. A link belongs to the event loop it was made on (by `Transport.connect` or
handed to a listener's handler): every method is called on that loop's thread, never
from another thread (hop with `loop.call_soon_threadsafe`). A handler given to
`Link.push` runs on that loop, inside the transport's own callback, as each frame
arrives: it must be cheap and must not block. A transport may do blocking I/O in worker
threads of its own (TCP's bulk links do); that is invisible to the caller.

Edge values.

- Deadlines: `None` waits for ever. Zero or negative means "only what is possible at
  once": `recv` returns a frame that has already arrived and raises TimeoutError
  otherwise; `drain` returns when no more than the link's buffer is held back and raises
  TimeoutError otherwise; `connect` raises TimeoutError unless the link is made without
  waiting (over TCP: never). A deadline that passes leaves the link in an unknown state
  (a frame may be half read or half written): the only thing to do with it is to
  `close` or `abort` it.
- Frames: `write`/`send` take one or more whole frames, concatenated; `b""` is a no-op.
  A frame with an empty body (a 10-byte header) is a frame like any other. A frame's
  body is bounded by its type (`frames.MAX_BODY_OF`, at most `frames.MAX_BODY`): a
  receiver refuses a longer one at its header, before a byte of its body is held (a
  `ProtocolError`), whatever the transport. Bytes that are not whole frames are delivered
  as they are by TCP (the receiver fails on them) and refused by the in-memory transport
  (ValueError from `write`).
- `recv(allowed=...)`: a frame of another type is a `ProtocolError` at its header.

What a link raises (`recv` | `write`, `send`, `drain`):

- the peer closed (`close`) between frames: `PeerClosed` once every frame it sent before
  the close was received | may succeed (TCP cannot tell before the peer's reset comes
  back) or raise `ConnectionResetError`; nothing written arrives.
- the peer closed mid-frame: `ProtocolError` (frame truncated) | as above.
- reset (the peer's `abort`, a TCP RST): `ConnectionResetError` (over TCP also
  `PeerClosed`: an aborting kernel with nothing unread closes cleanly) | the same.
- closed or aborted by this side: `ConnectionResetError` | `ConnectionResetError`.
- `end_reading()` called: `PeerClosed` once the frames already received are read |
  unaffected.
- partitioned (nothing gets through, nobody closed): `TimeoutError` at the deadline |
  `write` succeeds; `drain` and `send` raise `TimeoutError` at their deadline once more
  than `HIGH_WATER` bytes are held back (TCP: the kernel's buffers too).
- corrupt bytes (a bad header or CRC): `ProtocolError` | -.

`connect` raises `ConnectionRefusedError` (an OSError) when nothing listens at the
address, `TimeoutError` past its deadline (a partition), `ssl.SSLError` when a TLS source
is not trusted. `Link.handshake` (accepted links) raises `LinkRefused` naming the reason
counted in `mercury_repl_refused_total`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol

from core.errors import ProtocolError

#: Bytes a link holds back before `drain` waits (asyncio's default high-water mark).
HIGH_WATER = 64 << 10


class Frame(NamedTuple):
    """One frame received: its type, header flags and body (CRC checked)."""

    type: int
    flags: int
    body: bytes | bytearray
    #: For a RECORD: the log record's own CRC was verified too, in the pass that checked
    #: the frame's (the store need not check it again). False: not known.
    record_ok: bool = False


class PeerClosed(ProtocolError):
    """The peer closed the link between two frames (or `end_reading` was called)."""

    def __init__(self, message: str = "connection closed by the peer") -> None:
        super().__init__(message)


class LinkRefused(Exception):
    """An accepted link failed the transport's own handshake (TLS): `reason` is the
    `mercury_repl_refused_total` label, `detail` what to log. The link is aborted."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Link(Protocol):
    """One connection, seen from one end (see the module docstring for the contract)."""

    #: The peer's address, "host:port" (for logs).
    address: str

    @property
    def identity(self) -> str:
        """Who the peer is: the subject common name of its TLS certificate where it
        presented one, else `address`."""
        ...

    async def handshake(self, timeout: float) -> None:
        """Accepted links: finish the transport's own handshake (TLS: the peer's
        certificate must be signed by our CA) before anything else; `LinkRefused` (the
        link is aborted) when it fails or does not finish within `timeout`. A no-op for
        links without one and for links made by `connect`."""
        ...

    def write(self, data: bytes) -> None:
        """Queue whole frames for sending without waiting (see `drain`)."""
        ...

    def backlog(self) -> int:
        """Bytes written but not yet handed to the network (0: the link is idle)."""
        ...

    def closing(self) -> bool:
        """True once this side closed or lost the link."""
        ...

    async def drain(self, timeout: float | None) -> None:
        """Wait until the backlog is under the link's buffer (backpressure)."""
        ...

    async def send(self, data: bytes, timeout: float | None = None) -> None:
        """`write` then `drain`."""
        ...

    async def recv(
        self, timeout: float | None = None, allowed: frozenset[int] | None = None
    ) -> Frame:
        """The next frame; `allowed`: the types acceptable here (None: any)."""
        ...

    def read_ahead(self, limit: int) -> None:
        """From now on, frames may be received ahead of `recv` up to `limit` bytes (a long
        stream follows; TCP then receives large bodies straight into their buffers).
        Frames received ahead are checked against no `allowed` set."""
        ...

    def push(
        self, handler: Callable[[Frame], None], allowed: frozenset[int] | None = None
    ) -> asyncio.Future[None]:
        """From now on, hand every frame to `handler` as it arrives (on the loop, in the
        transport's callback) instead of queueing it for `recv`. Frames already received
        go first. Returns a future done when the peer closes between frames (result None)
        or sends a bad, cut or unallowed frame, or `handler` raises `ProtocolError` (that
        error); nothing more is read then. Any other error of `handler` propagates into
        the transport (a bug: handlers catch their own).
        """
        ...

    def end_reading(self) -> None:
        """End what this side reads here: the next `recv` with nothing received raises
        `PeerClosed` (a session ending itself from another task)."""
        ...

    async def send_file(
        self,
        path: str,
        offset: int,
        count: int,
        *,
        stall_timeout: float,
        progress: Callable[[int], None] = lambda _n: None,
    ) -> int:
        """Send `count` raw bytes of file `path` from `offset` (after the frames written
        before); each block must leave within `stall_timeout` (TimeoutError otherwise).
        `progress` gets the bytes sent so far after each block. Returns the bytes sent."""
        ...

    async def recv_file(self, fd: int, count: int, *, idle_timeout: float) -> None:
        """Receive `count` raw bytes (what the peer's `send_file` sends after the frames
        read so far) into file descriptor `fd` at its position. `SnapshotTransferError`
        when the link ends early or nothing arrives for `idle_timeout`."""
        ...

    def abort(self) -> None:
        """Drop the link at once (what was not sent is lost)."""
        ...

    async def close(self) -> None:
        """Send what is queued, then close; never raises for a peer already gone."""
        ...


class Listener(Protocol):
    """A listening endpoint."""

    #: Where it listens ((host, port): the port is the one bound when 0 was asked).
    address: tuple[str, int]

    async def close(self) -> None:
        """Stop accepting, cancel every handler task still running and wait for it, and
        abort every link accepted (also one accepted as the listener closed whose handler
        never ran): nothing is served after this returns."""
        ...


class Transport(Protocol):
    """Makes links: listens for them and connects them."""

    async def listen(
        self, host: str, port: int, handler: Callable[[Link], Awaitable[None]]
    ) -> Listener:
        """Listen at (`host`, `port`; 0: any free port) and run `handler(link)` in a task
        of its own for every link accepted (the listener aborts the link when the
        handler returns without closing it)."""
        ...

    async def connect(
        self, host: str, port: int, *, timeout: float | None, bulk: bool = False
    ) -> Link:
        """A link to the listener at (`host`, `port`). `bulk`: the link will receive a
        snapshot (`recv_file`): TCP then sizes its buffers for a bulk transfer."""
        ...
