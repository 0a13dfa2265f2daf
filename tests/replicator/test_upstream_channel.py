"""The upstream channel: frames from a replication client to its source — over the
in-memory transport, and over real sockets where the bytes themselves are the point (a
forged header) or a real `mercury replica` process relays as tier 1."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from core.errors import ProtocolError
from replicator import frames, upstream, wire
from replicator.memnet import MemoryNetwork
from replicator.transport import Link
from store.store import Store
from testkit.procs import Procs
from testkit.replication import MEM_PORT, RootNode, mem_source, root_node, until, wait_for
from tests.replicator.nodes import start_replica


class Inbox:
    """A router whose handlers record what they get (called on the source's loop)."""

    def __init__(self, *kinds: int) -> None:
        self.router = upstream.UpstreamRouter()
        self.got: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()
        for k in kinds:
            self.router.register(k, self._record)

    def _record(self, _origin: upstream.Origin, kind: int, payload: bytes) -> None:
        with self._lock:
            self.got.append((kind, payload))

    def payloads(self, kind: int) -> list[bytes]:
        with self._lock:
            return [p for k, p in self.got if k == kind]


def _hello(db_id: bytes, options: int) -> bytes:
    return frames.encode_hello(
        frames.Hello(
            frames.PROTOCOL_VERSION,
            frames.MODE_STREAM,
            frames.OPT_NEWEST_ONLY | options,
            uuid.uuid4().bytes,
            db_id,
            0,
            0,
            0,
            frames.ZERO_SHA,
        )
    )


async def _session(
    port: int, db_id: bytes, options: int, send: list[bytes], *, wait_heartbeat: bool = True
) -> int:
    """Handshake with `options`, write the raw `send` bytes, then read until a heartbeat
    (the link is still up after them); the WELCOME's header flags."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await wire.send(writer, _hello(db_id, options))
        ftype, flags, _ = await asyncio.wait_for(upstream.read_welcome(reader), 10)
        assert ftype == frames.WELCOME
        for data in send:
            await wire.send(writer, data)
        if wait_heartbeat:
            async with asyncio.timeout(10):
                while (await wire.read_frame(reader))[0] != frames.HEARTBEAT:
                    pass
        return flags
    finally:
        await wire.close(writer)


def _db_id(root: RootNode) -> bytes:
    return uuid.UUID(root.store.db_id).bytes


def test_upstream_frame_round_trip_and_bounds() -> None:
    frame = frames.encode_upstream(upstream.READS, b"abc")
    h = frames.decode_header(frame[: frames.HEADER_SIZE])
    assert (h.type, h.length) == (frames.UPSTREAM, 5)
    assert frames.decode_upstream(frame[frames.HEADER_SIZE :]) == (upstream.READS, b"abc")
    with pytest.raises(ValueError, match="exceeds"):
        frames.encode_upstream(1, b"x" * (frames.MAX_UPSTREAM_PAYLOAD + 1))
    claim = frames.HEADER.pack(frames.UPSTREAM, 0, frames.MAX_UPSTREAM_PAYLOAD + 3, 0)
    with pytest.raises(ValueError, match="exceeds"):
        frames.decode_header(claim)
    with pytest.raises(ValueError):
        frames.decode_upstream(b"\x01")


def test_outbox_is_bounded_and_drops_the_oldest() -> None:
    box = upstream.UpstreamOutbox(max_frames=3)
    for i in range(5):
        box.send(upstream.READS, bytes([i]))
    assert (box.pending(), box.dropped) == (3, 2)


async def _mem_session(
    store: Store,
    router: upstream.UpstreamRouter | None,
    options: int,
    send: list[bytes],
    settled: Callable[[], bool] = lambda: True,
) -> int:
    """`_session` against an in-memory source of `store` (reading upstream frames with
    `router`; None: an older source without one), kept open until `settled()`."""
    net = MemoryNetwork()
    source = await mem_source(net, "root", store, upstream=router)
    link = await net.transport("raw").connect("root", MEM_PORT, timeout=5)
    try:
        await link.send(_hello(uuid.UUID(store.db_id).bytes, options))
        welcome = await link.recv(5)
        assert welcome.type == frames.WELCOME
        for data in send:
            await link.send(data, 5)
        while (await link.recv(5)).type != frames.HEARTBEAT:
            pass
        await until(settled, 10, "the source's handling")
        while (await link.recv(5)).type != frames.HEARTBEAT:
            pass  # and the link is still up after them
        return welcome.flags
    finally:
        await link.close()
        await source.stop()


def test_source_dispatches_by_kind_ignores_unknown_kinds_and_keeps_the_link(
    store: Store,
) -> None:
    inbox = Inbox(upstream.READS)
    sent = [frames.encode_upstream(777, b"from the future"), frames.encode_upstream(1, b"r1")]
    flags = asyncio.run(
        _mem_session(
            store,
            inbox.router,
            frames.OPT_UPSTREAM,
            sent,
            lambda: inbox.payloads(upstream.READS) == [b"r1"],
        )
    )
    assert flags & frames.WELCOME_UPSTREAM
    assert inbox.payloads(upstream.READS) == [b"r1"]
    assert inbox.router.ignored[777] == 1
    assert inbox.payloads(777) == []


def test_old_peers_never_see_upstream_frames(store: Store) -> None:
    """A source without a router (an older one) does not set the flag; a client that does
    not offer upstream frames (an older one) is not told to send any and streams as before."""
    assert asyncio.run(_mem_session(store, None, frames.OPT_UPSTREAM, [])) == 0
    inbox = Inbox(upstream.READS)
    assert asyncio.run(_mem_session(store, inbox.router, 0, [])) == 0


def test_a_frame_over_its_bound_closes_the_connection_at_its_header(tmp_path: Path) -> None:
    inbox = Inbox(upstream.READS)
    with root_node(str(tmp_path / "root"), upstream=inbox.router) as root:

        async def forged() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", root.port)
            try:
                await wire.send(writer, _hello(_db_id(root), frames.OPT_UPSTREAM))
                await upstream.read_welcome(reader)
                # Claims a body past the bound and never sends it: closed at once.
                await wire.send(writer, frames.HEADER.pack(frames.UPSTREAM, 0, 200 << 20, 0))
                async with asyncio.timeout(10):
                    with pytest.raises(ProtocolError, match="closed"):
                        while True:
                            await wire.read_frame(reader)
            finally:
                await wire.close(writer)

        asyncio.run(forged())
        assert inbox.got == []


def test_tier1_replica_relays_frames_of_its_replicas_to_the_root(
    tmp_path: Path, procs: Procs
) -> None:
    """A real tier-1 `mercury replica` streams from the root with an upstream-capable
    client and relays to it what a tier-2 client sends to its own source."""
    inbox = Inbox(upstream.READS)
    with root_node(str(tmp_path / "root"), upstream=inbox.router) as root:
        root.write(10)
        t1 = start_replica(procs, tmp_path / "t1", [root.port], name="t1")
        payloads = [b"tier-2 summary %d" % i for i in range(3)]
        sent = [frames.encode_upstream(upstream.READS, p) for p in payloads]
        sent.insert(1, frames.encode_upstream(4242, b"unknown to the root too"))
        flags = asyncio.run(_session(t1.repl, _db_id(root), frames.OPT_UPSTREAM, sent))
        assert flags & frames.WELCOME_UPSTREAM
        wait_for(lambda: inbox.payloads(upstream.READS) == payloads, 30, "relayed frames")
        # Relayed in order; the kind the root does not know was ignored there, not at tier 1.
        wait_for(lambda: inbox.router.ignored[4242] == 1, 10, "unknown kind ignored at root")


def test_spooled_payloads_go_upstream_and_are_sent_again_when_a_link_comes_back(
    tmp_path: Path,
) -> None:
    """The worker's forwarder takes the files the readers spool, queues them, and sends
    what it sent recently again at the start of every session (a frame lost with a cut
    link is made good; the root's merge is idempotent)."""

    async def run() -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = []

        async def handle(link: Link) -> None:
            with contextlib.suppress(ProtocolError):
                while True:
                    got.append(frames.decode_upstream(bytes((await link.recv()).body)))

        net = MemoryNetwork()
        listener = await net.transport("source").listen("source", 1, handle)
        box = upstream.UpstreamOutbox()
        fwd = upstream.SpoolForwarder(str(tmp_path), box, upstream.READS)
        for i, p in enumerate((b"one", b"two")):
            (tmp_path / f"{i:03d}.bin").write_bytes(p)
        (tmp_path / ".half.tmp").write_bytes(b"not yet renamed")
        fwd.forward(await asyncio.to_thread(fwd.collect))
        assert sorted(p.name for p in tmp_path.iterdir()) == [".half.tmp"]
        assert box.pending() == 2
        for want in (4, 6):  # the first session: replay + queued; the second: replay
            link = await net.transport("replica").connect("source", 1, timeout=5)
            pump = asyncio.ensure_future(box.pump(link))
            await until(lambda: len(got) >= want, 10, f"{want} frames")  # noqa: B023
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            await link.close()
        await listener.close()
        return got

    got = asyncio.run(run())
    assert got.count((upstream.READS, b"one")) == 3 and got.count((upstream.READS, b"two")) == 3
