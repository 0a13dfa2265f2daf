"""The readiness-driven TLS transport (`net/tlsconn.py`) on real sockets and a real
uvloop loop (in a thread), with a CA made per test run: echo and keep-alive, a reply of
many writes to a client that reads late (the kept-bytes and backpressure path), paused
reading that resumes with bytes already decrypted, a client stalling in its handshake and
one speaking plaintext dropped while others are served, a context reloaded in place used
by new connections, close_notify on close."""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import socket
import ssl
import threading
from concurrent.futures import Future
from typing import Any

import pytest
import trustme
import uvloop

from net.tlsconn import HANDSHAKE_FAILED, TlsServer
from testkit.sockets import recv_exact
from testkit.wait import wait_until

Handler = collections.abc.Callable[["Conn", bytes], None]


class Conn(asyncio.Protocol):
    """Calls the server's `handler` for each chunk; records what the transport told it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: Any = None
        self.paused_writing = 0
        self.resumed_writing = 0
        self.lost: list[Exception | None] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.server.conns.append(self)

    def data_received(self, data: bytes) -> None:
        self.server.handler(self, data)

    def pause_writing(self) -> None:
        self.paused_writing += 1

    def resume_writing(self) -> None:
        self.resumed_writing += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


def echo(conn: Conn, data: bytes) -> None:
    conn.transport.write(data)


class Server:
    """A `TlsServer` on a uvloop loop in a thread."""

    def __init__(
        self,
        ctx: ssl.SSLContext,
        handler: Handler,
        handshake_timeout: float = 5.0,
        max_handshakes: int = 1000,
    ):
        self.ctx = ctx
        self.handler = handler
        self.conns: list[Conn] = []
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]

        async def start() -> TlsServer:
            return TlsServer(
                asyncio.get_running_loop(),
                lambda: Conn(self),
                self.sock,
                ctx,
                handshake_timeout,
                max_handshakes,
            )

        self.tls: TlsServer = self.call(start())

    def call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(10)

    def close(self) -> None:
        async def stop() -> None:
            self.tls.close()
            for c in self.conns:
                c.transport.abort()

        with contextlib.suppress(Exception):
            self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server_ctx(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


@pytest.fixture
def client_ctx(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


@contextlib.contextmanager
def serving(ctx: ssl.SSLContext, handler: Handler, **kw: Any) -> collections.abc.Iterator[Server]:
    s = Server(ctx, handler, **kw)
    try:
        yield s
    finally:
        s.close()


def connect(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), 5)
    raw.settimeout(10)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def test_echo_keep_alive_many_round_trips(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    with serving(server_ctx, echo) as srv, connect(srv.port, client_ctx) as c:
        for i in range(200):
            msg = f"request {i}\n".encode()
            c.sendall(msg)
            assert recv_exact(c, len(msg)) == msg
        # Several records in one go (a pipelining client).
        burst = b"".join(f"r{i};".encode() for i in range(100)) * 50
        c.sendall(burst)
        assert recv_exact(c, len(burst)) == burst
        t = srv.conns[0].transport
        assert t.get_extra_info("peername") == c.getsockname()
        assert t.get_extra_info("sslcontext") is server_ctx
        assert t.get_extra_info("ssl_object") is not None


def test_a_reply_of_many_writes_reaches_a_client_that_reads_late(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    """8 MiB in 64 KiB writes to a client that reads nothing for a while: the socket takes
    a part, the transport keeps the rest in order, pauses the protocol's writing above the
    high mark and resumes it once drained; every byte arrives, in order."""
    size = 8 << 20
    body = bytes(range(256)) * (size // 256)

    def big(conn: Conn, data: bytes) -> None:
        for off in range(0, size, 64 << 10):
            conn.transport.write(body[off : off + (64 << 10)])
        conn.transport.close()  # after the kept bytes

    with serving(server_ctx, big) as srv, connect(srv.port, client_ctx) as c:
        c.sendall(b"go")
        # the server's writes pile up: the protocol is told to pause
        wait_until(lambda: srv.conns and srv.conns[0].paused_writing, 10, "writing paused")
        conn = srv.conns[0]
        assert conn.paused_writing == 1
        assert conn.transport.get_write_buffer_size() > 0
        got = recv_exact(c, size)
        assert got == body
        # Then close_notify: a clean end of the TLS stream, not a truncation.
        assert c.recv(1) == b""
        wait_until(lambda: conn.lost, 5, "the connection lost")
        assert conn.resumed_writing == 1
        assert conn.lost == [None]


def test_paused_reading_resumes_with_what_was_already_received(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    """A protocol that pauses reading after each chunk and resumes later still gets every
    byte, including what was received (and decrypted) while paused."""
    got = bytearray()

    def slow(conn: Conn, data: bytes) -> None:
        got.extend(data)
        conn.transport.pause_reading()
        assert not conn.transport.is_reading()
        conn.server.loop.call_later(0.02, conn.transport.resume_reading)
        if len(got) >= 100_000:
            conn.transport.write(b"done")

    payload = bytes(i % 251 for i in range(100_000))
    with serving(server_ctx, slow) as srv, connect(srv.port, client_ctx) as c:
        for off in range(0, len(payload), 1000):  # 100 records, most arrive while paused
            c.sendall(payload[off : off + 1000])
        assert recv_exact(c, 4) == b"done"
        assert bytes(got) == payload


def test_stalled_and_plaintext_clients_are_dropped_while_others_are_served(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    before = {r: HANDSHAKE_FAILED.labels(r)._value.get() for r in ("timeout", "plaintext")}
    with serving(server_ctx, echo, handshake_timeout=0.5) as srv:
        silent = socket.create_connection(("127.0.0.1", srv.port), 5)
        # The start of a ClientHello, then nothing.
        partial = socket.create_connection(("127.0.0.1", srv.port), 5)
        partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        plain = socket.create_connection(("127.0.0.1", srv.port), 5)
        plain.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        garbage = socket.create_connection(("127.0.0.1", srv.port), 5)
        garbage.sendall(bytes(range(256)) * 4)
        # Meanwhile a real client is served.
        with connect(srv.port, client_ctx) as c:
            c.sendall(b"hello")
            assert recv_exact(c, 5) == b"hello"
        for s in (silent, partial, plain, garbage):
            s.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(100) == b""
            s.close()
        with connect(srv.port, client_ctx) as c:
            c.sendall(b"still")
            assert recv_exact(c, 5) == b"still"
        assert len(srv.conns) == 2  # only the real clients reached a protocol
    assert HANDSHAKE_FAILED.labels("timeout")._value.get() - before["timeout"] == 2
    assert HANDSHAKE_FAILED.labels("plaintext")._value.get() - before["plaintext"] >= 1


def test_a_flood_of_unfinished_handshakes_evicts_its_oldest_and_newcomers_are_served(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    before = HANDSHAKE_FAILED.labels("evicted")._value.get()
    # A timeout far beyond the test: only the cap can free the flood's descriptors.
    with serving(server_ctx, echo, handshake_timeout=300, max_handshakes=3) as srv:
        flood = [_stall(srv.port) for _ in range(3)]
        # A real client's connection evicts the oldest unfinished one, and is served.
        with connect(srv.port, client_ctx) as c:
            c.sendall(b"first")
            assert recv_exact(c, 5) == b"first"
        _closed_by_server(flood[0])
        flood.append(_stall(srv.port))  # the flood fills the cap again
        with connect(srv.port, client_ctx) as c:
            c.sendall(b"again")
            assert recv_exact(c, 5) == b"again"
        _closed_by_server(flood[1])
        assert srv.call(_count(srv.tls)) <= 3
        for s in flood:
            s.close()
    assert HANDSHAKE_FAILED.labels("evicted")._value.get() - before == 2


async def _count(tls: TlsServer) -> int:
    return len(tls.handshaking)


def _stall(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.sendall(b"\x16\x03\x01")  # a ClientHello's first bytes, then nothing
    return s


def _closed_by_server(s: socket.socket) -> None:
    s.settimeout(5)
    with contextlib.suppress(ConnectionResetError):
        assert s.recv(100) == b""


def test_a_context_reloaded_in_place_serves_new_connections(
    ca: trustme.CA, server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    with serving(server_ctx, echo) as srv, connect(srv.port, client_ctx) as c1:
        first = c1.getpeercert(binary_form=True)
        leaf = ca.issue_cert("127.0.0.1")
        leaf.configure_cert(server_ctx)  # what SIGHUP's reload does
        with connect(srv.port, client_ctx) as c2:
            assert c2.getpeercert(binary_form=True) != first
            c2.sendall(b"new")
            assert recv_exact(c2, 3) == b"new"
        c1.sendall(b"old")  # the open connection keeps working
        assert recv_exact(c1, 3) == b"old"


def test_abort_and_peer_reset_end_the_connection(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    with serving(server_ctx, echo) as srv:
        c = connect(srv.port, client_ctx)
        c.sendall(b"x")
        assert recv_exact(c, 1) == b"x"
        # A client that vanishes without close_notify (RST).
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        c.close()
        wait_until(lambda: srv.conns[0].lost, 5, "the connection lost")
        assert len(srv.conns[0].lost) == 1
        with connect(srv.port, client_ctx) as c2:
            c2.sendall(b"y")
            assert recv_exact(c2, 1) == b"y"
            srv.call(_abort(srv.conns[1]))
            c2.settimeout(5)
            with contextlib.suppress(ConnectionResetError, ssl.SSLError):
                assert c2.recv(1) == b""


async def _abort(conn: Conn) -> None:
    conn.transport.abort()


def test_a_protocol_that_raises_costs_its_connection_only(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    def picky(conn: Conn, data: bytes) -> None:
        if data.startswith(b"boom"):
            raise RuntimeError("a protocol bug")
        conn.transport.write(data)

    with serving(server_ctx, picky) as srv:
        with connect(srv.port, client_ctx) as bad:
            bad.sendall(b"boom")
            with contextlib.suppress(ConnectionResetError, ssl.SSLError):
                assert bad.recv(10) == b""
        with connect(srv.port, client_ctx) as good:
            good.sendall(b"fine")
            assert recv_exact(good, 4) == b"fine"
        assert srv.conns[0].lost and srv.conns[0].transport.is_closing()
