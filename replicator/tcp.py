"""The replication transport over TCP, plaintext or mutual TLS (`replicator/transport.py`).

What goes on the wire is exactly the frames the protocol writes (`replicator/frames.py`)
and, after a SNAPSHOT frame, the snapshot file's raw bytes. Three kinds of link:

- accepted and connected links run on asyncio streams; a link switched to `read_ahead`
  moves its reading onto `wire.FrameReader` (a buffered protocol receiving each large body
  straight into its own buffer), one switched to `push` onto `_Pusher` (frames dispatched
  in the transport's callback, no task wake-up in between);
- a `bulk` link (`connect(bulk=True)`, a bootstrap's) is a blocking socket driven from
  worker threads: its receive buffer is sized before connecting (the window scale is
  negotiated then) and the snapshot's bytes move socket -> pipe -> file with splice, never
  through user space (over TLS they must be decrypted there: plain reads).

A listener with TLS puts the TLS layer on each connection as it is accepted, before a
byte is read (see `_TlsAccept`); `Link.handshake` then waits for the handshake and names
why it failed (`tls_refusal_reason`). Over TLS both ends then check the other's role
(`net.tlsconf.check_replication_peer`): an accepted link from a certificate without a
replication role is refused before any frame, and `connect` refuses a source whose
certificate lacks one (PeerRoleError, an OSError) before sending any.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import ssl
import struct
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from core.errors import ProtocolError, SnapshotTransferError
from net import handover
from net.tlsconf import PeerRoleError, TlsContexts, check_replication_peer
from replicator import frames, wire
from replicator.transport import Frame, Link, LinkRefused, PeerClosed

#: StreamReader buffer of an accepted connection (asyncio's default).
_STREAM_LIMIT = 1 << 16
#: ... and of a connected one (a replica's: a whole large log record fits).
_CONNECT_LIMIT = 16 << 20
#: A TLS handshake not finished by then fails (`Link.handshake` adds a second).
HANDSHAKE_TIMEOUT = 10.0
#: Bytes per sendfile call; each must go out within the stall timeout.
_STALL_BLOCK = 4 << 20
_FILE_BLOCK = 1 << 20
#: A bulk transfer: kernel buffers this large on both ends.
_BULK_BUF = 4 << 20
_CHUNK = 1 << 20
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, Linux; Python < 3.10 lacks the name


def _address(transport: asyncio.BaseTransport) -> str:
    """The peer's "host:port" ("unknown" when the peer is already gone: uvloop asks the
    socket then, and a reset one has no peer name any more)."""
    try:
        peername = transport.get_extra_info("peername")
    except OSError:
        return "unknown"
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return str(peername)


def _common_name(cert: Any) -> str | None:
    """The subject common name of a peer certificate (`SSLSocket.getpeercert()`)."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class TcpTransport:
    """Links over TCP; with `tls`, mutual TLS both ways (every peer must present a
    certificate signed by the CA of `tls`; a client checks the source's against the host
    name it connects to). `handshake_timeout` bounds an accepted link's TLS handshake."""

    def __init__(
        self, tls: TlsContexts | None = None, *, handshake_timeout: float = HANDSHAKE_TIMEOUT
    ) -> None:
        self.tls = tls
        self.handshake_timeout = handshake_timeout

    async def listen(
        self, host: str, port: int, handler: Callable[[Link], Awaitable[None]]
    ) -> TcpListener:
        listener = TcpListener(self, handler)
        loop = asyncio.get_running_loop()
        # The process's replication socket (inherited on a hand-over, net/handover.py).
        sock = handover.SOCKETS.listen(handover.REPL, (host, port))
        if self.tls is None:
            server = await loop.create_server(lambda: _PlainAccept(listener), sock=sock)
        else:
            server = await loop.create_server(lambda: _TlsAccept(listener), sock=sock)
        listener.server = server
        bound = server.sockets[0].getsockname()
        listener.address = (host, int(bound[1]))
        return listener

    async def connect(
        self, host: str, port: int, *, timeout: float | None, bulk: bool = False
    ) -> Link:
        if bulk:
            ctx = self.tls.client if self.tls is not None else None
            sock = await asyncio.to_thread(_connect_blocking, host, port, ctx, timeout)
            if isinstance(sock, ssl.SSLSocket):
                try:
                    self._check_source(sock.getpeercert(binary_form=True), host, port)
                except PeerRoleError:
                    sock.close()
                    raise
            return BulkLink(sock, f"{host}:{port}")
        async with asyncio.timeout(timeout):
            if self.tls is None:
                reader, writer = await asyncio.open_connection(host, port, limit=_CONNECT_LIMIT)
            else:
                reader, writer = await asyncio.open_connection(
                    host, port, limit=_CONNECT_LIMIT, ssl=self.tls.client, server_hostname=host
                )
        if self.tls is not None:
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            try:
                self._check_source(der, host, port)
            except PeerRoleError:
                writer.transport.abort()
                raise
        return TcpLink(reader, writer)

    def _check_source(self, der: bytes | None, host: str, port: int) -> None:
        """PeerRoleError unless the source's certificate carries a replication role: a
        replica never takes records (nor a snapshot) from a consumer's certificate."""
        assert self.tls is not None
        check_replication_peer(
            der, allow_roleless=self.tls.files.allow_roleless, peer=f"source {host}:{port}"
        )


class TcpListener:
    """A listening socket and the links it accepted (see `Listener`)."""

    def __init__(self, transport: TcpTransport, handler: Callable[[Link], Awaitable[None]]) -> None:
        self.transport = transport
        self.handler = handler
        self.address: tuple[str, int] = ("", 0)
        self.server: asyncio.Server | None = None
        self._closing = False
        #: Handler tasks, from their creation until they end.
        self._tasks: set[asyncio.Task[None]] = set()
        #: Every connection's own transport from the moment it is accepted until its
        #: handler ends: `close` aborts the ones a handler never got to (accepted as the
        #: listener closed, their handler task not yet run).
        self._transports: set[asyncio.Transport] = set()

    def _start(self, link: TcpLink, raw: asyncio.Transport) -> None:
        task = asyncio.get_running_loop().create_task(self._run(link, raw))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, link: TcpLink, raw: asyncio.Transport) -> None:
        try:
            if not self._closing:
                await self.handler(link)
        finally:
            self._transports.discard(raw)
            if not link.closing():
                link.abort()

    async def close(self) -> None:
        self._closing = True
        server = self.server
        if server is not None:
            # asyncio's own loop makes a transport for an accepted socket one loop turn
            # after the accept, and drops the socket unclosed when the server was closed in
            # between (CPython gh-109564): stop accepting, let the turn run, then close.
            # (uvloop makes the transport at the accept; its `remove_reader` is a no-op.)
            for sock in server.sockets:
                asyncio.get_running_loop().remove_reader(sock.fileno())
            await asyncio.sleep(0)
            server.close()
        pending = list(self._tasks)
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)


class TcpLink:
    """A link on asyncio streams (plaintext, or TLS once `handshake` is done)."""

    def __init__(
        self,
        reader: asyncio.StreamReader | None,
        writer: asyncio.StreamWriter | None,
        *,
        pending: _Handshake | None = None,
        raw: asyncio.Transport | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._pending = pending
        self._raw = raw if raw is not None else (writer.transport if writer else None)
        assert self._raw is not None
        self.address = _address(self._raw)
        self._frames: wire.FrameReader | None = None
        self._pushed = False
        self._closed = False
        #: An accepted TLS link's peer role once `handshake` passed (`net.certs`; "none":
        #: a certificate without a role let in by --tls-allow-roleless); None without TLS.
        self.peer_role: str | None = None

    # -- identity and handshake --

    @property
    def identity(self) -> str:
        cert = self._writer.get_extra_info("peercert") if self._writer is not None else None
        return _common_name(cert) or self.address

    async def handshake(self, timeout: float) -> None:
        hs = self._pending
        if hs is None:
            return
        self._pending = None
        assert self._raw is not None
        try:
            await asyncio.wait_for(asyncio.shield(hs.done), timeout + 1)
        except TimeoutError:
            reason = "tls_timeout"
            detail = f"no TLS handshake within {timeout:g}s"
        except ssl.SSLError as err:
            reason = tls_refusal_reason(err)
            detail = f"{err.reason or err}"
        except (ConnectionError, OSError) as err:
            # The TLS layer aborts a handshake past its timeout itself.
            timed_out = isinstance(err, ConnectionAbortedError) and "longer" in str(err)
            reason, detail = ("tls_timeout" if timed_out else "tls_failed"), str(err) or repr(err)
        except asyncio.CancelledError:
            self.abort()
            raise
        else:
            tls_transport = hs.app.tls_transport
            assert tls_transport is not None
            ssl_object = tls_transport.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            try:
                self.peer_role = check_replication_peer(
                    der, allow_roleless=hs.allow_roleless, peer=f"replica {self.address}"
                )
            except PeerRoleError as err:
                reason, detail = err.reason, err.detail
            else:
                loop = asyncio.get_running_loop()
                self._reader = hs.reader
                self._writer = asyncio.StreamWriter(tls_transport, hs.app, hs.reader, loop)
                return
        self.abort()  # nothing to say to a peer we cannot trust
        raise LinkRefused(reason, detail)

    # -- sending --

    def _w(self) -> asyncio.StreamWriter:
        w = self._writer
        if self._closed or w is None:
            raise ConnectionResetError("link closed by this side")
        return w

    def write(self, data: bytes) -> None:
        w = self._w()
        if w.transport.is_closing():
            raise ConnectionResetError("connection lost")
        if data:
            w.write(data)

    def backlog(self) -> int:
        w = self._writer
        return w.transport.get_write_buffer_size() if w is not None else 0

    def closing(self) -> bool:
        if self._closed:
            return True
        t = self._writer.transport if self._writer is not None else self._raw
        return t is None or t.is_closing()

    async def drain(self, timeout: float | None) -> None:
        w = self._w()
        async with asyncio.timeout(timeout):
            await w.drain()

    async def send(self, data: bytes, timeout: float | None = None) -> None:
        self.write(data)
        await self.drain(timeout)

    # -- receiving --

    async def recv(
        self, timeout: float | None = None, allowed: frozenset[int] | None = None
    ) -> Frame:
        if self._closed:
            raise ConnectionResetError("link closed by this side")
        async with asyncio.timeout(timeout):
            fr = self._frames
            if fr is not None:
                ftype, held = await fr.read_frame()
                if allowed is not None and ftype not in allowed:
                    raise ProtocolError(f"bad frame header: unexpected frame type {ftype}")
                return Frame(ftype, fr.last_flags, held, fr.record_crc_ok)
            assert self._reader is not None
            h, body = await read_stream_frame(self._reader, allowed)
            return Frame(h.type, h.flags, body)

    def read_ahead(self, limit: int) -> None:
        assert self._reader is not None and self._writer is not None
        self._frames = wire.take_over(self._reader, self._writer, limit)

    def push(
        self, handler: Callable[[Frame], None], allowed: frozenset[int] | None = None
    ) -> asyncio.Future[None]:
        assert self._reader is not None and self._writer is not None
        self._pushed = True
        return _Pusher.take_over(handler, allowed, self._reader, self._writer)

    def end_reading(self) -> None:
        if self._reader is not None:
            self._reader.feed_eof()
        if self._frames is not None:
            self._frames.feed_eof()

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
        writer = self._w()
        sock = writer.get_extra_info("socket")
        if sock is not None:  # a bulk transfer: let the kernel queue more of it
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BULK_BUF)
        return await send_file(
            writer, path, offset, count, stall_timeout=stall_timeout, progress=progress
        )

    async def recv_file(self, fd: int, count: int, *, idle_timeout: float) -> None:
        if self._closed:
            raise ConnectionResetError("link closed by this side")
        assert self._reader is not None
        left = count
        while left:
            try:
                async with asyncio.timeout(idle_timeout):
                    block = await self._reader.read(min(_CHUNK, left))
            except TimeoutError as err:
                raise SnapshotTransferError("snapshot transfer stalled") from err
            if not block:
                break
            os.write(fd, block)
            left -= len(block)
        if left:
            raise SnapshotTransferError(
                f"snapshot transfer cut with {left} bytes to go", hint="retry resumes it"
            )

    # -- ending --

    def abort(self) -> None:
        self._closed = True
        t = self._writer.transport if self._writer is not None else self._raw
        if t is not None:
            t.abort()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is None:
            if self._raw is not None:
                self._raw.abort()
            return
        await wire.close(self._writer)


async def read_stream_frame(
    reader: asyncio.StreamReader, allowed: frozenset[int] | None
) -> tuple[frames.FrameHeader, bytes]:
    """One frame from a StreamReader with its header (the flags matter to a WELCOME);
    `PeerClosed` when the peer closed between frames, ProtocolError on a bad header, CRC
    or a cut frame. The header is checked before a byte of the body is read."""
    try:
        raw = await reader.readexactly(frames.HEADER_SIZE)
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            raise PeerClosed() from err
        raise ProtocolError("connection closed mid-frame") from err
    try:
        h = frames.decode_header(raw, allowed)
    except ValueError as err:
        raise ProtocolError(f"bad frame header: {err}") from err
    try:
        body = await reader.readexactly(h.length) if h.length else b""
    except asyncio.IncompleteReadError as err:
        raise ProtocolError(
            f"frame truncated: got {len(err.partial)} of {h.length} body bytes"
        ) from err
    if not frames.check_body(raw, body):
        raise ProtocolError(f"frame of type {h.type} fails its CRC")
    return h, body


class _Pusher(asyncio.Protocol):
    """The reading side of a link switched to `push`: frames are parsed and handed to the
    handler in the transport's callback, as their bytes arrive. A task reading them was
    woken one turn of the loop later, and on an HA leader (whose loop serves every writer)
    a standby's APPLIED report gates acknowledgements. Frame headers are checked (type,
    bound) before a body is buffered; a bad frame ends the reading. The stream protocol
    the transport had keeps the writer's flow control."""

    def __init__(
        self,
        handler: Callable[[Frame], None],
        allowed: frozenset[int] | None,
        old: asyncio.BaseProtocol | None,
    ) -> None:
        self.handler = handler
        self.allowed = allowed
        self._old = old
        self._buf = bytearray()
        self._need = frames.HEADER_SIZE  # bytes the next step waits for
        self._header: bytes | None = None
        #: Done when the peer closed (None) or sent something wrong (ProtocolError).
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    def take_over(
        cls,
        handler: Callable[[Frame], None],
        allowed: frozenset[int] | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> asyncio.Future[None]:
        """Move the connection's reading onto a new pusher: bytes `reader` already holds
        are handed on first. Returns its `done` future."""
        transport: Any = writer.transport  # a ReadTransport too (a socket or TLS one)
        d = cls(handler, allowed, transport.get_protocol())
        held = bytes(getattr(reader, "_buffer", b""))
        transport.set_protocol(d)
        d._transport = transport
        transport.resume_reading()  # in case the stream reader had paused it
        if held:
            d.data_received(held)
        if reader.at_eof() or getattr(reader, "_eof", False):
            d._finish(None)
        return d.done

    _transport: Any = None

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self._buf += data
        while len(self._buf) >= self._need:
            if self._header is None:
                raw = bytes(self._buf[: frames.HEADER_SIZE])
                try:
                    h = frames.decode_header(raw, self.allowed)
                except ValueError as err:
                    self._finish(ProtocolError(f"bad frame header: {err}"))
                    return
                self._header = raw
                self._need = frames.HEADER_SIZE + h.length
                continue
            header, body = self._header, bytes(self._buf[frames.HEADER_SIZE : self._need])
            del self._buf[: self._need]
            self._header, self._need = None, frames.HEADER_SIZE
            if not frames.check_body(header, body):
                self._finish(ProtocolError(f"frame of type {header[0]} fails its CRC"))
                return
            try:
                self.handler(Frame(header[0], header[1], body))
            except ProtocolError as err:
                self._finish(err)
                return

    def eof_received(self) -> bool | None:
        self._finish(None if not self._buf else ProtocolError("connection closed mid-frame"))
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(None)
        if self._old is not None:
            self._old.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._old is not None:
            self._old.pause_writing()

    def resume_writing(self) -> None:
        if self._old is not None:
            self._old.resume_writing()

    def _finish(self, err: ProtocolError | None) -> None:
        if self.done.done():
            return
        if err is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(err)
            if self._transport is not None:
                self._transport.pause_reading()  # nothing more is read; the stream ends


async def send_file(
    writer: asyncio.StreamWriter,
    path: str,
    offset: int,
    count: int,
    *,
    stall_timeout: float,
    progress: Callable[[int], None] = lambda _n: None,
) -> int:
    """Send `count` bytes of file `path` from `offset`: zero-copy sendfile where the loop
    has it (asyncio, plain TCP), else 1 MiB reads written with backpressure (uvloop, on
    the root; TLS).

    Sent in blocks, each of which must leave within `stall_timeout` seconds (TimeoutError
    otherwise: the peer stopped reading); `progress` gets the bytes sent after each block.
    """
    loop = asyncio.get_running_loop()
    done = 0
    # Over TLS the bytes must be encrypted in user space: no sendfile.
    tls = writer.get_extra_info("sslcontext") is not None
    with open(path, "rb") as f:
        try:
            if tls:
                raise asyncio.SendfileNotAvailableError("TLS transport")
            while done < count:
                n = min(_STALL_BLOCK, count - done)
                sent = await asyncio.wait_for(
                    loop.sendfile(writer.transport, f, offset + done, n, fallback=False),
                    stall_timeout,
                )
                done += int(sent)
                progress(done)
                if not sent:
                    break
            await asyncio.wait_for(writer.drain(), stall_timeout)
            return done
        except (NotImplementedError, asyncio.SendfileNotAvailableError):
            pass
        f.seek(offset + done)
        left = count - done
        while left:
            block = f.read(min(_FILE_BLOCK, left))
            if not block:
                break
            writer.write(block)
            await asyncio.wait_for(writer.drain(), stall_timeout)
            left -= len(block)
            progress(count - left)
        return count - left


# --- accepting --------------------------------------------------------------------------


class _PlainAccept(asyncio.StreamReaderProtocol):
    """A plaintext connection: `asyncio.start_server`'s protocol, which also registers the
    transport with the listener the moment it is accepted (see `TcpListener.close`)."""

    def __init__(self, listener: TcpListener) -> None:
        self.reader = asyncio.StreamReader(limit=_STREAM_LIMIT)
        super().__init__(self.reader)
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        stream = cast(asyncio.Transport, transport)
        self.listener._transports.add(stream)
        super().connection_made(transport)
        writer = asyncio.StreamWriter(stream, self, self.reader, asyncio.get_running_loop())
        # Held here as long as the transport holds this protocol (as `start_server`'s
        # protocol holds its writer): a handler task cancelled before it ran drops its
        # link, and the writer must not be collected before `close` aborts the transport.
        self.link = TcpLink(self.reader, writer)
        self.listener._start(self.link, stream)


class _TlsAccept(asyncio.Protocol):
    """Puts TLS on a new connection before anything is read from it.

    The TLS layer is installed in `connection_made`, synchronously: uvloop starts reading
    right after that call (a `pause_reading` there does not hold), so a later
    `loop.start_tls` could lose the peer's ClientHello to this protocol and the handshake
    would hang. `asyncio.sslproto.SSLProtocol` runs on uvloop's transports as on asyncio's.
    """

    def __init__(self, listener: TcpListener) -> None:
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tls = self.listener.transport.tls
        assert tls is not None
        loop = asyncio.get_running_loop()
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        stream = cast(asyncio.Transport, transport)
        reader = asyncio.StreamReader(limit=_STREAM_LIMIT)
        app = _TlsStream(reader)
        waiter: asyncio.Future[None] = loop.create_future()
        layer = sslproto.SSLProtocol(
            loop,
            app,
            tls.server,
            waiter,
            server_side=True,
            # A float works (asyncio compares it to elapsed seconds); the stub says int.
            ssl_handshake_timeout=self.listener.transport.handshake_timeout,  # type: ignore[arg-type]
        )
        self.listener._transports.add(stream)
        stream.set_protocol(layer)
        layer.connection_made(stream)
        pending = _Handshake(reader, app, waiter, tls.files.allow_roleless)
        link = TcpLink(None, None, pending=pending, raw=stream)
        self.listener._start(link, stream)


class _TlsStream(asyncio.StreamReaderProtocol):
    """The stream protocol under TLS; remembers the TLS transport it is given."""

    tls_transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tls_transport = cast(asyncio.Transport, transport)
        super().connection_made(transport)


@dataclass
class _Handshake:
    """A TLS handshake under way: its stream ends and the future it completes."""

    reader: asyncio.StreamReader
    app: _TlsStream
    done: asyncio.Future[None]
    #: The peer may present a certificate without a role (`TlsFiles.allow_roleless`).
    allow_roleless: bool = False


#: OpenSSL's reasons for a server-side handshake failure, by what the peer did.
_PLAINTEXT = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
     "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_RECORD"}
)  # fmt: skip
_NO_CERT = frozenset({"PEER_DID_NOT_RETURN_A_CERTIFICATE", "NO_CERTIFICATE_RETURNED"})


def tls_refusal_reason(err: ssl.SSLError) -> str:
    """The `mercury_repl_refused_total` reason for a failed server-side handshake."""
    if isinstance(err, ssl.SSLCertVerificationError):
        return "untrusted_certificate"
    reason = err.reason or ""
    if reason in _PLAINTEXT:
        return "plaintext"
    if reason in _NO_CERT:
        return "no_certificate"
    if "CERTIFICATE" in reason or "UNKNOWN_CA" in reason:
        return "untrusted_certificate"
    return "tls_failed"


# --- bulk links (a bootstrap's) ---------------------------------------------------------


def _connect_blocking(
    host: str, port: int, ctx: ssl.SSLContext | None, timeout: float | None
) -> socket.socket:
    """A TCP connection with a large receive buffer, set before connecting so that the
    window scale is negotiated for it (a bulk transfer is window-bound otherwise); with
    `ctx`, mutual TLS (the source must present a certificate signed by our CA)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BULK_BUF)
        sock.settimeout(timeout if timeout is None else max(timeout, 1e-3))
        sock.connect((host, port))
        if ctx is not None:
            sock = ctx.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise
    return sock


class BulkLink:
    """A link on a blocking socket, each operation in a worker thread: few frames, then
    one large transfer of raw bytes into a file (`recv_file`)."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self._sock = sock
        self.address = address
        self._out = bytearray()
        self._closed = False
        self._ended = False

    @property
    def identity(self) -> str:
        cert = self._sock.getpeercert() if isinstance(self._sock, ssl.SSLSocket) else None
        return _common_name(cert) or self.address

    async def handshake(self, timeout: float) -> None:
        return None

    def _check(self) -> None:
        if self._closed:
            raise ConnectionResetError("link closed by this side")

    def write(self, data: bytes) -> None:
        self._check()
        self._out += data

    def backlog(self) -> int:
        return len(self._out)

    def closing(self) -> bool:
        return self._closed

    async def drain(self, timeout: float | None) -> None:
        self._check()
        if not self._out:
            return
        data, self._out = bytes(self._out), bytearray()

        def go() -> None:
            self._sock.settimeout(_sock_timeout(timeout))
            self._sock.sendall(data)

        await asyncio.to_thread(go)

    async def send(self, data: bytes, timeout: float | None = None) -> None:
        self.write(data)
        await self.drain(timeout)

    async def recv(
        self, timeout: float | None = None, allowed: frozenset[int] | None = None
    ) -> Frame:
        self._check()
        if self._ended:
            raise PeerClosed()
        sock = self._sock

        def go() -> Frame:
            sock.settimeout(_sock_timeout(timeout))
            raw = _recv_exact(sock, frames.HEADER_SIZE, first=True)
            try:
                h = frames.decode_header(raw, allowed)
            except ValueError as err:
                raise ProtocolError(f"bad frame header: {err}") from err
            body = _recv_exact(sock, h.length) if h.length else b""
            if not frames.check_body(raw, body):
                raise ProtocolError(f"frame of type {h.type} fails its CRC")
            return Frame(h.type, h.flags, body)

        return await asyncio.to_thread(go)

    def read_ahead(self, limit: int) -> None:
        return None

    def push(
        self, handler: Callable[[Frame], None], allowed: frozenset[int] | None = None
    ) -> asyncio.Future[None]:
        raise NotImplementedError("a bulk link is read with recv and recv_file")

    def end_reading(self) -> None:
        self._ended = True

    async def send_file(
        self,
        path: str,
        offset: int,
        count: int,
        *,
        stall_timeout: float,
        progress: Callable[[int], None] = lambda _n: None,
    ) -> int:
        raise NotImplementedError("a bulk link receives files")

    async def recv_file(self, fd: int, count: int, *, idle_timeout: float) -> None:
        self._check()
        await asyncio.to_thread(_receive, self._sock, fd, count, idle_timeout)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # a thread blocked on it returns
        self._sock.close()

    async def close(self) -> None:
        self.abort()


def _sock_timeout(timeout: float | None) -> float | None:
    # A socket timeout of 0 would make it non-blocking: the smallest wait instead.
    return None if timeout is None else max(timeout, 1e-3)


def _recv_exact(sock: socket.socket, n: int, first: bool = False) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            if first and not got:
                raise PeerClosed("connection closed by the source")
            raise ProtocolError("connection closed by the source")
        got += k
    return bytes(buf)


def _receive(sock: socket.socket, fd: int, count: int, idle_timeout: float) -> None:
    """Move `count` bytes from `sock` to file `fd` at its position.

    Linux: splice socket -> pipe -> file, so the bytes never enter user space (this is
    what brings a transfer close to `cp`); elsewhere, recv_into a buffer and write.
    Raises SnapshotTransferError when the peer closes early or stalls.
    """
    left = count
    if isinstance(sock, ssl.SSLSocket):
        _receive_tls(sock, fd, count, idle_timeout)
        return
    # Blocking fd (splice needs it) with a kernel receive timeout for stall detection.
    sock.setblocking(True)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(idle_timeout), 0))
    if hasattr(os, "splice"):
        r, w = os.pipe()
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(w, _F_SETPIPE_SZ, _CHUNK)
            while left:
                try:
                    k = os.splice(sock.fileno(), w, min(_CHUNK, left))
                except BlockingIOError as err:
                    raise SnapshotTransferError("snapshot transfer stalled") from err
                if k == 0:
                    break
                moved = 0
                while moved < k:
                    moved += os.splice(r, fd, k - moved)
                left -= k
        finally:
            os.close(r)
            os.close(w)
    else:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while left:
            try:
                k = sock.recv_into(view[: min(_CHUNK, left)])
            except (TimeoutError, BlockingIOError) as err:
                raise SnapshotTransferError("snapshot transfer stalled") from err
            if k == 0:
                break
            os.write(fd, view[:k])
            left -= k
    if left:
        raise SnapshotTransferError(
            f"snapshot transfer cut with {left} bytes to go", hint="retry resumes it"
        )


def _receive_tls(sock: ssl.SSLSocket, fd: int, count: int, idle_timeout: float) -> None:
    """`_receive` over TLS: the bytes must be decrypted in user space, so no splice."""
    sock.settimeout(idle_timeout)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    left = count
    while left:
        try:
            k = sock.recv_into(view[: min(_CHUNK, left)])
        except TimeoutError as err:
            raise SnapshotTransferError("snapshot transfer stalled") from err
        if k == 0:
            break
        os.write(fd, view[:k])
        left -= k
    if left:
        raise SnapshotTransferError(
            f"snapshot transfer cut with {left} bytes to go", hint="retry resumes it"
        )
