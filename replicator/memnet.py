"""The replication transport in memory: a simulated network (`replicator/transport.py`).

A `MemoryNetwork` connects named nodes. Each node gets a `MemoryTransport` bound to its
name (`network.transport("r1")`); listeners are found by (host, port), where the host is
the listening node's name. Nothing touches a socket, a thread or the wall clock: every
delay is a timer of the caller's event loop (`loop.call_at` on `loop.time()`), so a
loop with a virtual clock runs a whole tree without waiting, and the same seed and the
same sequence of calls give the same deliveries, losses and orders.

What travels is *units*: each frame written (`write` splits concatenated frames) and each
block of a file (`send_file`). Per pair of nodes a `Conditions` says what happens to a
unit: a delay drawn uniformly from `delay` (or from the measured `delay_samples`), a loss
with probability `loss` (the unit vanishes; the receiver sees the gap), with probability
`corrupt` one byte flipped (the receiver's CRC check refuses it), with probability
`duplicate` a second copy right behind it, and with probability `reorder` an extra
`reorder_delay` that lets later units overtake it. Otherwise units arrive in order (a
unit never arrives before the one sent before it). A close travels like a unit (after
the data, never lost); a reset (`abort`) overtakes the data and drops what the peer had
not read. A partition between two nodes (`partition`) holds every unit and every new
connection between them until `heal`: the links stay open, senders fill their window and
then wait (`drain` times out), receivers wait (`recv` times out), as over TCP when a
network cut drops packets; healed, the held units arrive in order.

Backpressure: a sender's `backlog` is what it sent beyond `window` bytes that the
receiver has not read yet; `drain` waits while the backlog is over `HIGH_WATER`.

Determinism: every draw (delay, loss, reorder) comes from a generator seeded with the
network's seed and the link's number (links are numbered in the order they connect),
in the order units are sent. Arrival times are the loop's clock plus the draws: on a
`VirtualClockLoop` (below), which moves its clock only when nothing is left to run, the
same program gives the same deliveries every time; on a real clock the draws are the
same but the instants, and so an order among near-simultaneous units, may differ.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import math
import os
import random
import selectors
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from core.errors import ProtocolError, SnapshotTransferError
from replicator import frames
from replicator.transport import HIGH_WATER, Frame, Link, PeerClosed

#: Bytes a sender may have unread at the receiver before its backlog grows (the kernel
#: buffers of both ends, over TCP).
WINDOW = 256 << 10
#: Bytes of a file per unit (`send_file`).
FILE_BLOCK = 1 << 20
#: Ports handed out for port 0 and to connecting ends.
_FIRST_PORT = 20000

T = TypeVar("T")

_EOF = b""  # a close, as a unit (a frame or a file block is never empty)


@dataclass(frozen=True)
class Conditions:
    """What a link between two nodes does to each unit (see the module docstring)."""

    #: Seconds of delay, drawn uniformly from [low, high] per unit.
    delay: tuple[float, float] = (0.0, 0.0)
    #: When not empty, the delay is drawn from these (seconds, equally likely) instead: a
    #: measured distribution (`bench/sim_calibration.py` fits one to real processes).
    delay_samples: tuple[float, ...] = ()
    #: Probability that a unit is lost.
    loss: float = 0.0
    #: Probability that a unit is held back `reorder_delay` more seconds.
    reorder: float = 0.0
    reorder_delay: float = 0.01
    #: Probability that a frame arrives with one byte flipped (the receiver's CRC check
    #: refuses it: a `ProtocolError`).
    corrupt: float = 0.0
    #: Probability that a frame arrives twice (the copy right behind it).
    duplicate: float = 0.0
    #: Bytes unread at the receiver before the sender's backlog grows.
    window: int = WINDOW


class Cpu(Protocol):
    """The nodes' processors, when a simulation models them (`sim/cpu.py`): each unit a
    node sends or receives is work that takes its core's time, so it leaves or is seen
    later than the clock's instant. Without one (`MemoryNetwork.cpu` None), work is
    free: the clock stands still while code runs."""

    def sent(self, node: str, size: int, now: float) -> float:
        """When a unit of `size` bytes written by `node` at `now` leaves it."""
        ...

    def received(self, node: str, size: int, record: bool, now: float) -> float:
        """When a unit that reached `node` at `now` has been processed (`record`: a
        RECORD frame, which the node also commits)."""
        ...


def _delay(rng: random.Random, cond: Conditions) -> float:
    """One unit's delay under `cond` (one draw of `rng`)."""
    if cond.delay_samples:
        return rng.choice(cond.delay_samples)
    return rng.uniform(*cond.delay)


class MemoryNetwork:
    """Nodes, their listeners, the conditions between them and the partitions."""

    def __init__(self, seed: int = 0, conditions: Conditions | None = None) -> None:
        self.seed = seed
        self.conditions = conditions or Conditions()
        self._pairs: dict[frozenset[str], Conditions] = {}
        self._cut: set[frozenset[str]] = set()
        self._listeners: dict[tuple[str, int], MemoryListener] = {}
        self._ports = itertools.count(_FIRST_PORT)
        self._links = itertools.count()
        #: Every channel still open, for `heal` to release what a partition held (a dict:
        #: released in the order they opened, the same every run).
        self._channels: dict[_Channel, None] = {}
        self._healed: asyncio.Event | None = None
        #: Units lost and corrupted so far (tests read them).
        self.lost = 0
        self.corrupted = 0
        self.duplicated = 0
        #: The nodes' CPU cost (None: code costs no virtual time).
        self.cpu: Cpu | None = None

    def transport(self, name: str, identity: str | None = None) -> MemoryTransport:
        """The transport of node `name`; `identity` is what its peers see as
        `Link.identity` (a certificate's name; None: its address)."""
        return MemoryTransport(self, name, identity)

    def set_conditions(self, a: str, b: str, conditions: Conditions) -> None:
        """Conditions between nodes `a` and `b` (both ways), from the next unit on."""
        self._pairs[frozenset((a, b))] = conditions

    def conditions_between(self, a: str, b: str) -> Conditions:
        return self._pairs.get(frozenset((a, b)), self.conditions)

    def partition(self, a: str, b: str) -> None:
        """Cut nodes `a` and `b` apart (both ways) until `heal`."""
        self._cut.add(frozenset((a, b)))

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Join `a` and `b` again (no names: every partition); held units go on."""
        if a is None or b is None:
            self._cut.clear()
        else:
            self._cut.discard(frozenset((a, b)))
        for ch in list(self._channels):
            ch.release()
        if self._healed is not None:
            self._healed.set()
            self._healed = None

    def cut(self, a: str, b: str) -> bool:
        """True while `a` and `b` are partitioned."""
        return frozenset((a, b)) in self._cut

    def _wait_heal(self) -> Awaitable[bool]:
        if self._healed is None:
            self._healed = asyncio.Event()
        return self._healed.wait()

    def _rng(self, what: str) -> random.Random:
        return random.Random(f"{self.seed}/{what}")


class MemoryTransport:
    """Links of one node of a `MemoryNetwork` (see `Transport`)."""

    def __init__(self, network: MemoryNetwork, name: str, identity: str | None) -> None:
        self.network = network
        self.name = name
        self.identity = identity

    async def listen(
        self, host: str, port: int, handler: Callable[[Link], Awaitable[None]]
    ) -> MemoryListener:
        net = self.network
        if port == 0:
            port = next(net._ports)
            while (host, port) in net._listeners:
                port = next(net._ports)
        if (host, port) in net._listeners:
            raise OSError(98, f"address {host}:{port} already in use")
        listener = MemoryListener(self, (host, port), handler)
        net._listeners[(host, port)] = listener
        return listener

    async def connect(
        self, host: str, port: int, *, timeout: float | None, bulk: bool = False
    ) -> Link:
        net = self.network
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while net.cut(self.name, host):  # a SYN into a partition: wait for the heal
                await net._wait_heal()
            cond = net.conditions_between(self.name, host)
            no = next(net._links)
            rng = net._rng(f"connect/{no}")
            await asyncio.sleep(_delay(rng, cond))  # the handshake's round trip
            while net.cut(self.name, host):
                await net._wait_heal()
        listener = net._listeners.get((host, port))
        if listener is None or listener.closing:
            raise ConnectionRefusedError(111, f"nothing listens at {host}:{port}")
        local_port = next(net._ports)
        mine = MemoryLink(loop, f"{host}:{port}", listener.transport.identity)
        theirs = MemoryLink(loop, f"{self.name}:{local_port}", self.identity)
        up = _Channel(net, loop, (self.name, host), net._rng(f"link/{no}/up"), theirs)
        down = _Channel(net, loop, (host, self.name), net._rng(f"link/{no}/down"), mine)
        mine._attach(up, down)
        theirs._attach(down, up)
        listener._accept(theirs)
        return mine


class MemoryListener:
    """A listening address of a `MemoryNetwork` (see `Listener`)."""

    def __init__(
        self,
        transport: MemoryTransport,
        address: tuple[str, int],
        handler: Callable[[Link], Awaitable[None]],
    ) -> None:
        self.transport = transport
        self.address = address
        self.handler = handler
        self.closing = False
        # Dicts, not sets: cancelled and aborted in the order accepted, the same every run.
        self._tasks: dict[asyncio.Task[None], None] = {}
        self._links: dict[MemoryLink, None] = {}

    def _accept(self, link: MemoryLink) -> None:
        self._links[link] = None
        task = asyncio.get_running_loop().create_task(self._run(link))
        self._tasks[task] = None
        task.add_done_callback(lambda t: self._tasks.pop(t, None))

    async def _run(self, link: MemoryLink) -> None:
        try:
            await self.handler(link)
        finally:
            self._links.pop(link, None)
            if not link.closing():
                link.abort()

    async def close(self) -> None:
        self.closing = True
        net = self.transport.network
        if net._listeners.get(self.address) is self:
            del net._listeners[self.address]
        pending = list(self._tasks)
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for link in list(self._links):
            link.abort()
        self._links.clear()


class _Channel:
    """One direction of a link: units from a sender to `dest`, through the network's
    conditions, in (arrival time, send order) order."""

    def __init__(
        self,
        net: MemoryNetwork,
        loop: asyncio.AbstractEventLoop,
        ends: tuple[str, str],
        rng: random.Random,
        dest: MemoryLink,
    ) -> None:
        self.net = net
        self.loop = loop
        self.ends = ends
        self.rng = rng
        self.dest = dest
        self._seq = itertools.count()
        self._pending: list[tuple[float, int, bytes, bool]] = []  # a heap; True: a frame
        self._held: list[tuple[bytes, bool]] = []  # arrived during a partition
        self._last_at = 0.0
        self._max_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        #: Bytes sent and not yet read (or lost) at the receiver.
        self.unread = 0
        self.window = net.conditions_between(*ends).window
        self.reset = False
        net._channels[self] = None

    def send(self, unit: bytes, frame: bool = True) -> None:
        """Send `unit`: a whole frame, or (`frame` False) a block of a file."""
        cond = self.net.conditions_between(*self.ends)
        self.window = cond.window
        now = self.loop.time()
        cpu = self.net.cpu
        if cpu is not None:
            now = cpu.sent(self.ends[0], len(unit), now)  # after the sender's core wrote it
        # A close comes after everything sent before it, overtaken units included.
        at = max(now + _delay(self.rng, cond), self._last_at if unit else self._max_at)
        if unit and cond.reorder and self.rng.random() < cond.reorder:
            at += cond.reorder_delay  # later units may overtake this one
        else:
            self._last_at = at
        if unit and cond.loss and self.rng.random() < cond.loss:
            self.net.lost += 1
            return  # it left the sender: not counted as unread
        if unit and cond.corrupt and self.rng.random() < cond.corrupt:
            self.net.corrupted += 1
            flip = self.rng.randrange(len(unit))
            unit = unit[:flip] + bytes([unit[flip] ^ 0x5A]) + unit[flip + 1 :]
        self.unread += len(unit)
        self._max_at = max(self._max_at, at)
        self._push(at, unit, frame)
        if unit and cond.duplicate and self.rng.random() < cond.duplicate:
            # A copy right behind it (a retransmission the network delivered twice).
            self.net.duplicated += 1
            self.unread += len(unit)
            self._push(at, unit, frame)

    def send_reset(self) -> None:
        """A reset: overtakes whatever is still on the way (which is dropped)."""
        self.reset = True
        self._pending.clear()
        self._held.clear()
        self.unread = 0
        self.net._channels.pop(self, None)
        self.loop.call_soon(self.dest._on_reset)

    def _push(self, at: float, unit: bytes, frame: bool) -> None:
        heapq.heappush(self._pending, (at, next(self._seq), unit, frame))
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None or not self._pending:
            return
        self._timer = self.loop.call_at(self._pending[0][0], self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.loop.time()
        while self._pending and self._pending[0][0] <= now:
            _, _, unit, frame = heapq.heappop(self._pending)
            if self.net.cut(*self.ends) or self._held:
                self._held.append((unit, frame))
            else:
                self._deliver(unit, frame)
        self._arm()

    def _deliver(self, unit: bytes, frame: bool) -> None:
        if not unit:
            self.net._channels.pop(self, None)
        cpu = self.net.cpu
        if cpu is None:
            self.dest._arrive(unit)
            return
        # The receiver's core parses it (and commits a record) before its code sees it;
        # the instants of one core strictly increase, so units keep their order.
        record = frame and len(unit) > frames.HEADER_SIZE and unit[0] == frames.RECORD
        done = cpu.received(self.ends[1], len(unit), record, self.loop.time())
        self.loop.call_at(done, self.dest._arrive, unit)

    def release(self) -> None:
        """After a heal: what the partition held arrives now, in order."""
        if not self._held or self.net.cut(*self.ends):
            return
        held, self._held = self._held, []
        for unit, frame in held:
            self._deliver(unit, frame)

    def consumed(self, n: int) -> None:
        self.unread -= n
        src = self.src
        if src is not None:
            src._wake_writers()

    #: The sending link (set by `MemoryLink._attach`).
    src: MemoryLink | None = None

    def backlog(self) -> int:
        return max(0, self.unread - self.window)


class MemoryLink:
    """One end of an in-memory link (see `Link`)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, address: str, peer_identity: str | None
    ) -> None:
        self.loop = loop
        self.address = address
        self._identity = peer_identity
        self._out: _Channel | None = None
        self._in: _Channel | None = None
        self._inbox: collections.deque[bytes] = collections.deque()
        self._file_left = b""  # the rest of a file block `recv_file` did not need
        self._eof = False  # the peer's close arrived (after everything it sent)
        self._ended = False  # `end_reading`
        self._reset = False
        self._closed = False
        self._readers: asyncio.Future[None] | None = None
        self._writers: asyncio.Future[None] | None = None
        self._push: _Push | None = None

    def _attach(self, out: _Channel, inp: _Channel) -> None:
        self._out = out
        self._in = inp
        out.src = self

    # -- identity --

    @property
    def identity(self) -> str:
        return self._identity or self.address

    async def handshake(self, timeout: float) -> None:
        return None

    # -- network side --

    def _arrive(self, unit: bytes) -> None:
        if self._closed or self._reset:
            if self._in is not None:
                self._in.consumed(len(unit))
            return
        if not unit:
            self._eof = True
        else:
            self._inbox.append(unit)
        if self._push is not None:
            self._push.run()
        self._wake_readers()

    def _on_reset(self) -> None:
        if self._closed:
            return
        self._reset = True
        if self._in is not None:
            self._in.unread = 0
        self._inbox.clear()
        if self._push is not None:
            self._push.fail(ConnectionResetError("connection reset by the peer"))
        self._wake_readers()
        self._wake_writers()

    def _wake_readers(self) -> None:
        w = self._readers
        if w is not None and not w.done():
            w.set_result(None)

    def _wake_writers(self) -> None:
        w = self._writers
        if w is not None and not w.done():
            w.set_result(None)

    # -- sending --

    def _check_send(self) -> _Channel:
        if self._closed:
            raise ConnectionResetError("link closed by this side")
        if self._reset:
            raise ConnectionResetError("connection reset by the peer")
        if self._eof:
            raise ConnectionResetError("the peer closed the link")
        assert self._out is not None
        return self._out

    def write(self, data: bytes) -> None:
        out = self._check_send()
        units = split_frames(data)
        for unit in units:
            out.send(unit)

    def backlog(self) -> int:
        return self._out.backlog() if self._out is not None else 0

    def closing(self) -> bool:
        return self._closed or self._reset

    async def drain(self, timeout: float | None) -> None:
        out = self._check_send()
        if out.backlog() <= HIGH_WATER:
            return
        async with asyncio.timeout(timeout):
            while True:
                out = self._check_send()
                if out.backlog() <= HIGH_WATER:
                    return
                self._writers = self.loop.create_future()
                try:
                    await self._writers
                finally:
                    self._writers = None

    async def send(self, data: bytes, timeout: float | None = None) -> None:
        self.write(data)
        await self.drain(timeout)

    # -- receiving --

    async def _next_unit(self, timeout: float | None) -> bytes:
        """The next unit read (`_EOF` once the peer closed and all was read)."""
        if not self._inbox:
            self._raise_if_ended()
            if timeout is not None and timeout <= 0:
                raise TimeoutError
            async with asyncio.timeout(timeout):
                while not self._inbox:
                    self._raise_if_ended()
                    if self._eof or self._ended:
                        return _EOF
                    self._readers = self.loop.create_future()
                    try:
                        await self._readers
                    finally:
                        self._readers = None
        unit = self._inbox.popleft()
        if self._in is not None:
            self._in.consumed(len(unit))
        return unit

    def _raise_if_ended(self) -> None:
        if self._closed:
            raise ConnectionResetError("link closed by this side")
        if self._reset:
            raise ConnectionResetError("connection reset by the peer")

    async def recv(
        self, timeout: float | None = None, allowed: frozenset[int] | None = None
    ) -> Frame:
        self._raise_if_ended()
        if not self._inbox and (self._eof or self._ended):
            raise PeerClosed()
        unit = await self._next_unit(timeout)
        if not unit:
            raise PeerClosed()
        return parse_unit(unit, allowed)

    def read_ahead(self, limit: int) -> None:
        return None  # units arrive whole: nothing to gain

    def push(
        self, handler: Callable[[Frame], None], allowed: frozenset[int] | None = None
    ) -> asyncio.Future[None]:
        push = self._push = _Push(self, handler, allowed)
        push.run()  # frames already here go first
        return push.done

    def end_reading(self) -> None:
        self._ended = True
        self._wake_readers()

    # -- files --

    async def send_file(
        self,
        path: str,
        offset: int,
        count: int,
        *,
        stall_timeout: float,
        progress: Callable[[int], None] = lambda _n: None,
    ) -> int:
        done = 0
        # Read on the loop, not in a thread: a simulation's run stays on its clock (the
        # files of tests and simulations are small).
        with open(path, "rb") as f:
            f.seek(offset)
            while done < count:
                block = f.read(min(FILE_BLOCK, count - done))
                if not block:
                    break
                out = self._check_send()
                out.send(block, frame=False)
                await self.drain(stall_timeout)
                done += len(block)
                progress(done)
        return done

    async def recv_file(self, fd: int, count: int, *, idle_timeout: float) -> None:
        left = count
        while left:
            chunk = self._file_left
            self._file_left = b""
            if not chunk:
                try:
                    chunk = await self._next_unit(idle_timeout)
                except TimeoutError as err:
                    raise SnapshotTransferError("snapshot transfer stalled") from err
                if not chunk:
                    break
            use, self._file_left = chunk[:left], chunk[left:]
            os.write(fd, use)
            left -= len(use)
        if left:
            raise SnapshotTransferError(
                f"snapshot transfer cut with {left} bytes to go", hint="retry resumes it"
            )

    # -- ending --

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._out is not None and not self._out.reset:
            self._out.send_reset()
        self._inbox.clear()
        self._wake_readers()
        self._wake_writers()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._out is not None and not self._reset:
            self._out.send(_EOF)  # after everything written (never lost)
        self._inbox.clear()
        self._wake_readers()
        self._wake_writers()


class _Push:
    """A link's reading in push mode: every frame to the handler as it arrives."""

    def __init__(
        self, link: MemoryLink, handler: Callable[[Frame], None], allowed: frozenset[int] | None
    ) -> None:
        self.link = link
        self.handler = handler
        self.allowed = allowed
        self.done: asyncio.Future[None] = link.loop.create_future()

    def run(self) -> None:
        link = self.link
        while not self.done.done() and link._inbox:
            unit = link._inbox.popleft()
            if link._in is not None:
                link._in.consumed(len(unit))
            try:
                self.handler(parse_unit(unit, self.allowed))
            except ProtocolError as err:
                self.done.set_exception(err)
                return
        if not self.done.done() and (link._eof or link._ended):
            self.done.set_result(None)

    def fail(self, err: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(err)


def split_frames(data: bytes) -> list[bytes]:
    """`data` (whole frames, concatenated) cut into frames (ValueError when it is not)."""
    out = []
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        if len(data) - pos < frames.HEADER_SIZE:
            raise ValueError("not whole frames: a cut header")
        length = int.from_bytes(view[pos + 2 : pos + 6], "little")
        end = pos + frames.HEADER_SIZE + length
        if end > len(data):
            raise ValueError("not whole frames: a cut body")
        out.append(bytes(view[pos:end]))
        pos = end
    return out


def parse_unit(unit: bytes, allowed: frozenset[int] | None) -> Frame:
    """A received unit as a frame, checked as TCP checks one (header, bound, CRC)."""
    if len(unit) < frames.HEADER_SIZE:
        raise ProtocolError("connection closed mid-frame")
    raw = unit[: frames.HEADER_SIZE]
    try:
        h = frames.decode_header(raw, allowed)
    except ValueError as err:
        raise ProtocolError(f"bad frame header: {err}") from err
    body = unit[frames.HEADER_SIZE :]
    if len(body) != h.length:
        raise ProtocolError(f"frame truncated: got {len(body)} of {h.length} body bytes")
    if not frames.check_body(raw, body):
        raise ProtocolError(f"frame of type {h.type} fails its CRC")
    return Frame(h.type, h.flags, body)


class _JumpingSelector(selectors.DefaultSelector):
    """A selector for `VirtualClockLoop`: polls, and when nothing is ready and the loop
    would sleep until its next timer, moves the clock there instead."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:  # no timer at all: only another thread can wake the loop
            return super().select(None)
        assert self.loop is not None
        self.loop.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock: `time()` starts at 0 and moves only when the loop
    has nothing to run, straight to its next timer. A simulation over `MemoryNetwork`
    then takes no wall time for its delays, and runs the same way every time (work done
    in other threads, e.g. `asyncio.to_thread`, is not on this clock: the clock may jump
    while it runs)."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def _run_once(self) -> None:
        # Every turn of the loop moves the clock by the least step a float can (about
        # 1e-15 s at the hundreds of seconds a run lasts), as a real clock always moves:
        # otherwise a deadline `interval - elapsed` that rounds to the current instant
        # (a wait of 4e-16 s, due "now" but not yet "elapsed") fires, finds itself not
        # due, and is set again at the same instant for ever (found by `mercury sim`).
        self.now = math.nextafter(self.now, math.inf)
        super()._run_once()  # type: ignore[misc]


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a fresh `VirtualClockLoop`."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(coro)
