"""The same scenarios over every transport (TCP, mutual TLS, in memory) give the same
result: the same frames delivered in order, the same errors on a close, an end or a bad
frame, the same bytes of a file — the contract of `replicator/transport.py` — and a real
source says the same to the same HELLO over TCP and in memory. The protocol
tests run on the in-memory transport; this suite is why that says something about TCP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from core.errors import ProtocolError, SnapshotTransferError
from net import certs
from net.tlsconf import TlsContexts, TlsFiles
from replicator import frames
from replicator.heartbeat import RootHeartbeat
from replicator.memnet import MemoryNetwork
from replicator.source import ReplicationSource
from replicator.tcp import TcpTransport
from replicator.transport import Frame, Link, PeerClosed, Transport
from store.ops import SET, Op
from store.store import Store

KINDS = ["tcp", "tls", "memory"]

#: Frames of every size class: a header-only one, small ones, one large record body.
SAMPLE = [
    frames.encode_frame(frames.END, b""),
    frames.encode_wait(3),
    frames.encode_refuse(frames.REFUSE_NOT_READY, "not yet"),
    frames.encode_frame(frames.RECORD, os.urandom(3 << 20)),
    frames.encode_upstream(7, b"x" * 1000),
    frames.encode_frame(frames.WELCOME, b"w" * 54, flags=frames.WELCOME_UPSTREAM),
]


def _pki(d: Path) -> tuple[TlsContexts, TlsContexts]:
    """Contexts of a source ("source") and a replica ("replica") of one CA, each
    certificate with the replica role (`mercury certs`)."""
    certs.ensure(d, {"source": "replica", "replica": "replica"})

    def issue(name: str) -> TlsContexts:
        cert, key = d / f"{name}.crt", d / f"{name}.key"
        return TlsContexts(TlsFiles(cert=str(cert), key=str(key), ca=str(d / "ca.crt")))

    return issue("source"), issue("replica")


def _ends(kind: str, d: Path) -> tuple[Transport, Transport, str]:
    """(the listening side's transport, the connecting side's, the host to listen on)."""
    if kind == "memory":
        net = MemoryNetwork(seed=1)
        return net.transport("source", "source"), net.transport("replica", "replica"), "source"
    if kind == "tls":
        server, client = _pki(d)
        return TcpTransport(server), TcpTransport(client), "127.0.0.1"
    return TcpTransport(), TcpTransport(), "127.0.0.1"


@contextlib.asynccontextmanager
async def _pair(kind: str, d: Path, bulk: bool = False) -> AsyncIterator[tuple[Link, Link]]:
    """(accepted link, connected link), both handshaken; both closed at the end. `bulk`:
    the connected one is a bootstrap's (TCP: a blocking socket in worker threads)."""
    server_t, client_t, host = _ends(kind, d)
    accepted: asyncio.Queue[Link] = asyncio.Queue()
    release = asyncio.Event()

    async def handler(link: Link) -> None:
        await link.handshake(10)
        await accepted.put(link)
        await release.wait()  # the listener aborts the link when its handler returns

    listener = await server_t.listen(host, 0, handler)
    client = await client_t.connect(host, listener.address[1], timeout=10, bulk=bulk)
    server = await asyncio.wait_for(accepted.get(), 10)
    try:
        yield server, client
    finally:
        release.set()
        await client.close()
        await server.close()
        await listener.close()


def _run(
    kind: str, d: Path, body: Callable[[Link, Link], Awaitable[object]], bulk: bool = False
) -> object:
    async def go() -> object:
        async with _pair(kind, d, bulk) as (server, client):
            return await asyncio.wait_for(body(server, client), 30)

    return asyncio.run(go())


def _plain(f: Frame) -> tuple[int, int, bytes]:
    return f.type, f.flags, bytes(f.body)


def _expected() -> list[tuple[int, int, bytes]]:
    out = []
    for raw in SAMPLE:
        h = frames.decode_header(raw[: frames.HEADER_SIZE])
        out.append((h.type, h.flags, raw[frames.HEADER_SIZE :]))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_frames_arrive_whole_and_in_order_then_the_close(kind: str, tmp_path: Path) -> None:
    async def body(server: Link, client: Link) -> list[object]:
        async def sending() -> None:
            await server.send(b"".join(SAMPLE[:3]))  # several frames in one write
            for raw in SAMPLE[3:]:
                await server.send(raw, 10)  # a reader that reads lets every drain end
            await server.close()

        sender = asyncio.ensure_future(sending())
        got: list[object] = [_plain(await client.recv(10)) for _ in SAMPLE]
        await sender
        for _ in range(2):  # and it stays closed
            with pytest.raises(PeerClosed):
                await client.recv(10)
            got.append("closed")
        return got

    assert _run(kind, tmp_path, body) == [*_expected(), "closed", "closed"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_link_closed_here_refuses_everything(kind: str, tmp_path: Path) -> None:
    async def body(server: Link, client: Link) -> None:
        await client.close()
        assert client.closing()
        with pytest.raises(ConnectionResetError):
            client.write(SAMPLE[1])
        with pytest.raises(ConnectionResetError):
            await client.send(SAMPLE[1], 1)
        with pytest.raises(ConnectionResetError):
            await client.recv(1)
        with pytest.raises(PeerClosed):  # the other end sees a close between frames
            await server.recv(10)

    _run(kind, tmp_path, body)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_frames_are_protocol_errors_at_their_header(kind: str, tmp_path: Path) -> None:
    async def body(server: Link, client: Link) -> list[str]:
        out = []
        await server.send(frames.encode_wait(1))
        with pytest.raises(ProtocolError, match="unexpected frame type"):
            await client.recv(10, frozenset({frames.HELLO}))
        out.append("unallowed")
        return out

    assert _run(kind, tmp_path, body) == ["unallowed"]

    async def oversized(server: Link, client: Link) -> None:
        too_long = frames.encode_frame(frames.HELLO, b"h" * (frames.MAX_BODY_OF[frames.HELLO] + 1))
        await server.send(too_long)
        with pytest.raises(ProtocolError, match="exceeds"):
            await client.recv(10)

    _run(kind, tmp_path, oversized)

    async def corrupt(server: Link, client: Link) -> None:
        bad = bytearray(frames.encode_wait(1))
        bad[-1] ^= 0xFF
        await server.send(bytes(bad))
        with pytest.raises(ProtocolError, match="CRC"):
            await client.recv(10)

    _run(kind, tmp_path, corrupt)


@pytest.mark.parametrize("kind", KINDS)
def test_deadlines(kind: str, tmp_path: Path) -> None:
    async def body(server: Link, client: Link) -> None:
        with pytest.raises(TimeoutError):
            await client.recv(0)  # nothing there
        with pytest.raises(TimeoutError):
            await client.recv(-1)
        with pytest.raises(TimeoutError):
            await client.recv(0.05)
        await server.send(SAMPLE[1] + SAMPLE[2])
        assert _plain(await client.recv(10)) == _expected()[1]
        assert _plain(await client.recv(0)) == _expected()[2]  # already there: no wait
        await server.drain(0)  # nothing held back: returns at once

    _run(kind, tmp_path, body)


@pytest.mark.parametrize("kind", KINDS)
def test_pushed_frames_reach_the_handler_in_order_until_the_close(
    kind: str, tmp_path: Path
) -> None:
    async def body(server: Link, client: Link) -> list[object]:
        got: list[object] = []
        await client.send(SAMPLE[1])  # received before the switch: handed on first
        # Deliberate: time for that frame to reach the server's buffer before `push`, the
        # case under test. One still in flight would take the plain path and pass too, so
        # a slow machine can only make the test easier, never fail a correct link.
        await asyncio.sleep(0.05)
        done = server.push(lambda f: got.append(_plain(f)))
        await client.send(b"".join(SAMPLE[2:]))
        await client.close()
        await done
        return got

    assert _run(kind, tmp_path, body) == _expected()[1:]

    async def refused(server: Link, client: Link) -> None:
        done = server.push(lambda f: None, frozenset({frames.UPSTREAM}))
        await client.send(SAMPLE[4] + SAMPLE[1])
        with pytest.raises(ProtocolError, match="unexpected frame type"):
            await done

    _run(kind, tmp_path, refused)


@pytest.mark.parametrize("kind", KINDS)
def test_end_reading_ends_what_this_side_reads(kind: str, tmp_path: Path) -> None:
    async def body(server: Link, client: Link) -> None:
        waiting = asyncio.ensure_future(client.recv(10))
        # Deliberate: let the receive start waiting before the end, the case under test;
        # ended before it started, it raises the same (nothing was received), so the
        # pause decides only which path is taken, never the outcome.
        await asyncio.sleep(0.05)
        client.end_reading()
        with pytest.raises(PeerClosed):
            await waiting
        await client.send(SAMPLE[1], 10)  # sending goes on
        assert _plain(await server.recv(10)) == _expected()[1]

    _run(kind, tmp_path, body)


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_a_file_follows_its_frame_byte_for_byte(kind: str, bulk: bool, tmp_path: Path) -> None:
    data = os.urandom(5 << 20 | 12345)
    (tmp_path / "snap").write_bytes(data)

    async def body(server: Link, client: Link) -> bytes:
        await server.send(SAMPLE[1])
        sent = asyncio.ensure_future(
            server.send_file(str(tmp_path / "snap"), 100, len(data) - 100, stall_timeout=10)
        )
        assert _plain(await client.recv(10)) == _expected()[1]
        fd = os.open(tmp_path / "got", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            await client.recv_file(fd, len(data) - 100, idle_timeout=10)
        finally:
            os.close(fd)
        assert await sent == len(data) - 100
        # A TLS close waits for the peer's answer, which a blocking reader gives only
        # when it closes in turn: the close runs beside the read that sees it.
        closing = asyncio.ensure_future(server.close())
        fd = os.open(tmp_path / "more", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(SnapshotTransferError, match="cut"):
                await client.recv_file(fd, 10, idle_timeout=10)
        finally:
            os.close(fd)
        await client.close()
        await closing
        return (tmp_path / "got").read_bytes()

    assert _run(kind, tmp_path, body, bulk) == data[100:]


def test_identity_is_the_certificate_s_name_else_the_address(tmp_path: Path) -> None:
    async def identities(server: Link, client: Link) -> tuple[str, str]:
        return server.identity, client.identity

    assert _run("tls", tmp_path, identities) == ("replica", "source")
    assert _run("memory", tmp_path, identities) == ("replica", "source")

    async def addresses(server: Link, client: Link) -> bool:
        return server.identity == server.address and client.identity == client.address

    assert _run("tcp", tmp_path, addresses)


@pytest.mark.parametrize("kind", ["tcp", "memory"])
def test_connecting_where_nothing_listens_is_refused(kind: str, tmp_path: Path) -> None:
    async def go() -> None:
        _server, client, host = _ends(kind, tmp_path)
        listener = await _server.listen(host, 0, lambda link: link.close())
        port = listener.address[1]
        await listener.close()
        with pytest.raises(ConnectionRefusedError):
            await client.connect(host, port, timeout=5)

    asyncio.run(go())


def _protocol_session(kind: str, store: Store, hello: bytes) -> list[tuple[int, bytes]]:
    """What a raw client gets from a real source of `store` on transport `kind` after
    `hello` — every frame but heartbeats (they come with time) — until the close."""

    async def go() -> list[tuple[int, bytes]]:
        source_t: Transport
        client_t: Transport
        if kind == "memory":
            net = MemoryNetwork(seed=3)
            source_t, client_t, host = net.transport("root"), net.transport("raw"), "root"
        else:
            source_t, client_t, host = TcpTransport(), TcpTransport(), "127.0.0.1"
        source = ReplicationSource(
            store,
            host,
            0,
            node_id=b"\x05" * 16,
            heartbeat=RootHeartbeat(store, 60_000),
            transport=source_t,
        )
        await source.start()
        link = await client_t.connect(host, source.port, timeout=10)
        got = []
        try:
            await link.send(hello)
            while True:
                try:
                    f = await link.recv(10)
                except PeerClosed:
                    got.append((0, b"closed"))
                    return got
                if f.type != frames.HEARTBEAT:
                    got.append((f.type, bytes(f.body)))
        finally:
            await link.close()
            await source.stop()

    return asyncio.run(go())


@pytest.mark.parametrize(
    "case", ["stream to a stop seq", "another database", "an unknown protocol version"]
)
def test_a_source_says_the_same_over_tcp_and_in_memory(case: str, store: Store) -> None:
    for b in range(0, 60, 10):
        store.apply([Op(SET, f"k{i:04d}".encode(), b"v" * i, owner="t") for i in range(b, b + 10)])
    db_id = uuid.UUID(store.db_id).bytes
    version, mode, db = frames.PROTOCOL_VERSION, frames.MODE_STREAM, db_id
    if case == "another database":
        db = b"\x09" * 16
    if case == "an unknown protocol version":
        version = 99
    hello = frames.encode_hello(
        frames.Hello(version, mode, 0, b"\x07" * 16, db, 10, 45, 0, frames.ZERO_SHA)
    )
    tcp = _protocol_session("tcp", store, hello)
    assert tcp == _protocol_session("memory", store, hello)
    if case == "stream to a stop seq":
        assert [t for t, _ in tcp] == [frames.WELCOME, *[frames.RECORD] * 4, frames.END, 0]
    else:
        assert [t for t, _ in tcp] == [frames.REFUSE, 0]
