"""A readiness-driven TLS transport: TLS on the socket itself, not through a memory BIO.

uvloop's (and asyncio's) TLS layer puts OpenSSL on two memory buffers between the socket
and the protocol: every received chunk is copied into one, decrypted out of it into
another object, every reply is encrypted into a buffer and copied out to the socket, and
each step runs through the layer's own state machine. For a small keep-alive echo that
layer costs more than the encryption (`bench/tls_echo.py`); on a replica's point reads
this transport saves less (`bench/tls.py`'s `*_loop_tls` A/B, `docs/security.md`).

Here the accepted socket is wrapped by `SSLContext.wrap_socket` (non-blocking, OpenSSL
reads and writes the fd itself) and driven by the event loop's readiness callbacks:

- handshake: `do_handshake` until it no longer wants to read or write, within
  `handshake_timeout` (a client stalling mid-handshake, or never starting, is dropped);
- reads: on readability, `recv` a record at a time; after a short record with nothing
  pending inside OpenSSL, wait for readiness again rather than pay a failed read (OpenSSL
  reads no further ahead than the record it decrypts, so unread bytes keep the fd
  readable). Plaintext already inside OpenSSL never makes the fd readable: resuming
  paused reading reads at once rather than waiting for the fd;
- writes: `send` right away; what the socket does not take is kept (in order) and sent
  when the fd is writable. OpenSSL must be called again with the very bytes of a write
  it could not finish, so the kept head is retried unchanged. The protocol's
  `pause_writing`/`resume_writing` follow the kept bytes' size against the high/low
  water marks, as on any asyncio transport;
- close: after the kept bytes are sent, one non-blocking `close_notify` (never waiting
  for the peer's), then the fd is closed; `abort` closes at once.

The transport speaks the `asyncio.Transport` interface the read protocols use, so the
HTTP protocol and its compiled fast path run on it unchanged. `TlsServer` accepts on a
listening socket and gives each connection one; a handshake that fails or times out is
counted (`mercury_tls_handshake_failed_total{reason}`) and logged at debug level, as
junk on a public port must not flood the log.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

from net.budget import TLS_LABELS, Budget, Principal, Reason, peer_principal
from net.metrics import budget_hooks

log = logging.getLogger(__name__)

HANDSHAKE_FAILED = Counter(
    "mercury_tls_handshake_failed_total",
    "TLS connections of a read listener dropped before their handshake completed, by reason "
    "(timeout; plaintext: the peer did not speak TLS; failed: any other TLS error; reset; "
    "evicted: the oldest handshake, for a new connection past the cap)",
    ("reason",),
)

#: Longest wait for a connection's handshake to complete, from its accept.
HANDSHAKE_TIMEOUT_S = 10.0
#: Bytes asked of OpenSSL per `recv`: one record's plaintext at most (it never returns
#: more than one record's). Not more: `recv` allocates a buffer of the size asked for on
#: every call, so asking for a plain socket's 256 KiB costs an allocation that a small
#: keep-alive request pays in full.
RECV_BYTES = 16 << 10
#: `recv` calls per readiness callback before the other connections get the loop; what is
#: left in OpenSSL is read on the next loop turn.
RECVS_PER_TURN = 16
#: Largest slice handed to one `send` (OpenSSL encrypts it record by record into the socket).
SEND_BYTES = 256 << 10
#: Default write buffer marks (asyncio's defaults).
HIGH_WATER = 64 << 10
#: Pause of the accepts after an accept failed for want of descriptors (as asyncio's).
ACCEPT_RETRY_S = 1.0
#: Handshakes in progress at most per listening socket; a new connection past it evicts
#: the oldest (`TlsServer`).
MAX_HANDSHAKES = 1000
#: Connections accepted per readiness of the listening socket before others get the loop.
ACCEPTS_PER_TURN = 64
#: The peer went away: a plain end of the connection, not an error worth a traceback.
_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, TimeoutError)


def _reason(err: BaseException) -> str:
    if isinstance(err, ssl.SSLError):
        text = f"{err.reason or ''} {err}".lower()
        if "http_request" in text or "wrong_version" in text or "wrong version" in text:
            return "plaintext"
        return "failed"
    if isinstance(err, (*_GONE, ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return "reset"
    return "failed"


class TlsTransport(asyncio.Transport):
    """One TLS connection on a non-blocking `ssl.SSLSocket`, driven by fd readiness."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: ssl.SSLSocket,
        protocol: asyncio.Protocol,
        extra: dict[str, Any],
        on_closed: Callable[[TlsTransport], None] | None = None,
    ) -> None:
        super().__init__(extra)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._on_closed = on_closed
        self._out: collections.deque[bytes | memoryview] = collections.deque()
        self._out_bytes = 0
        self._high = HIGH_WATER
        self._low = HIGH_WATER // 4
        self._write_paused = False  # told the protocol to pause writing
        self._reading = False  # a reader callback is registered
        self._read_paused = False
        self._writing = False  # a writer callback is registered
        self._closing = False
        self._closed = False

    # -- start (after the handshake) --------------------------------------------------

    def start(self) -> None:
        """Hand the connection to its protocol and start reading."""
        self._protocol.connection_made(self)
        if not self._closing and not self._read_paused:
            self._add_reader()
            # The handshake may have read the first request's record along with its own.
            if self._sock.pending():
                self._loop.call_soon(self._read_ready)

    # -- reading ------------------------------------------------------------------------

    def _add_reader(self) -> None:
        if not self._reading and not self._closed:
            self._loop.add_reader(self._fd, self._read_ready)
            self._reading = True

    def _remove_reader(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _read_ready(self) -> None:
        sock = self._sock
        for _ in range(RECVS_PER_TURN):
            if self._read_paused or self._closing:
                return
            try:
                data = sock.recv(RECV_BYTES)
            except ssl.SSLWantReadError:
                return
            except ssl.SSLWantWriteError:
                return  # (renegotiation is off: TLS 1.2 only, and refused)
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                data = b""
            except (OSError, ssl.SSLError) as err:
                self._fatal(err)
                return
            if not data:
                self._eof()
                return
            try:
                self._protocol.data_received(data)
            except Exception:  # a protocol bug costs this connection, never the listener
                log.exception("TLS connection: data_received failed; closing")
                self.abort()
                return
            # A short record with nothing left inside OpenSSL: most likely the whole
            # request. Asking again would cost a failed read and an exception (as much as
            # the read); if more is in the socket, the fd is still readable and this runs
            # again on the next loop turn. A full record reads on (a large body).
            if len(data) < RECV_BYTES and not sock.pending():
                return
        # Turn used up: what OpenSSL still holds (or the fd still has) is read next turn.
        if not self._closing and not self._read_paused:
            self._loop.call_soon(self._read_ready)

    def _eof(self) -> None:
        self._remove_reader()
        keep_open = False
        try:
            keep_open = bool(self._protocol.eof_received())
        except Exception:  # a protocol bug costs this connection only
            log.exception("TLS connection: eof_received failed")
        if not keep_open:
            self.close()

    def is_reading(self) -> bool:
        return not self._read_paused and not self._closing

    def pause_reading(self) -> None:
        if self._closing or self._read_paused:
            return
        self._read_paused = True
        self._remove_reader()

    def resume_reading(self) -> None:
        if self._closing or not self._read_paused:
            return
        self._read_paused = False
        self._add_reader()
        # Plaintext already inside OpenSSL never makes the fd readable: read it now.
        self._loop.call_soon(self._read_ready)

    # -- writing ------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        if not self._out:
            if len(data) <= SEND_BYTES:  # a reply: one call, written whole or not at all
                try:
                    self._sock.send(data)
                    return
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    pass  # kept below, offered again unchanged when writable
                except (OSError, ssl.SSLError) as err:
                    self._fatal(err)
                    return
            else:
                data = self._send_now(memoryview(data))
            if not data:
                return
            self._out.append(bytes(data))
        else:
            self._out.append(bytes(data))
        self._out_bytes += len(data)
        self._add_writer()
        self._check_high()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _send_now(self, view: memoryview) -> memoryview:
        """Send as much of `view` as the socket takes; return what is left."""
        while view:
            chunk = view[:SEND_BYTES]
            try:
                n = self._sock.send(chunk)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return view
            except (OSError, ssl.SSLError) as err:
                self._fatal(err)
                return view[:0]
            view = view[n:]
        return view

    def _add_writer(self) -> None:
        if not self._writing and not self._closed:
            self._loop.add_writer(self._fd, self._write_ready)
            self._writing = True

    def _remove_writer(self) -> None:
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False

    def _write_ready(self) -> None:
        while self._out:
            head = self._out[0]
            # Retry the head exactly as it was first offered (OpenSSL requires the same
            # bytes for a write it could not finish): its first SEND_BYTES at most.
            chunk = memoryview(head)[:SEND_BYTES]
            try:
                n = self._sock.send(chunk)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                break
            except (OSError, ssl.SSLError) as err:
                self._fatal(err)
                return
            self._out_bytes -= n
            if n == len(head):
                self._out.popleft()
            else:
                self._out[0] = memoryview(head)[n:]
        self._check_low()
        if not self._out:
            self._remove_writer()
            if self._closing:
                self._finish_close()

    def _check_high(self) -> None:
        if not self._write_paused and self._out_bytes > self._high:
            self._write_paused = True
            try:
                self._protocol.pause_writing()
            except Exception:
                log.exception("TLS connection: pause_writing failed")

    def _check_low(self) -> None:
        if self._write_paused and self._out_bytes <= self._low:
            self._write_paused = False
            try:
                self._protocol.resume_writing()
            except Exception:
                log.exception("TLS connection: resume_writing failed")

    def get_write_buffer_size(self) -> int:
        return self._out_bytes

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._low, self._high)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._check_high()

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("TLS connections close with close_notify (close())")

    # -- closing ------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close after the kept bytes are sent (the peer may read its last reply)."""
        if self._closing:
            return
        self._closing = True
        self._remove_reader()
        if not self._out:
            self._finish_close()

    def abort(self) -> None:
        self._closing = True
        self._force_close(None)

    def _finish_close(self) -> None:
        # One attempt at close_notify; never wait for the peer's.
        with contextlib.suppress(OSError, ValueError):
            self._sock.unwrap()  # sends it; raises SSLWantReadError (an OSError) after
        self._force_close(None)

    def _fatal(self, err: BaseException) -> None:
        if not isinstance(err, _GONE) and not isinstance(err, ssl.SSLError):
            log.debug("TLS connection error: %r", err)
        self._closing = True
        self._force_close(err if isinstance(err, Exception) else None)

    def _force_close(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._remove_reader()
        self._remove_writer()
        self._out.clear()
        self._out_bytes = 0
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._on_closed is not None:
            self._on_closed(self)
        self._loop.call_soon(self._protocol.connection_lost, exc)

    # -- the rest of the interface ------------------------------------------------------

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol


def _count(reason: Reason) -> None:
    HANDSHAKE_FAILED.labels(TLS_LABELS[reason]).inc()


class _Handshake:
    """Drives one accepted connection's handshake, then starts its transport. A member of
    its server's handshake budget (`net.budget.Member`): idle from its accept, as nothing
    it sent has been acted on, so the oldest goes first; once its peer's first message
    (the ClientHello) was whole and answered it has progressed, and goes only after every
    handshake that has not (a ClientHello trickled a byte at a time, reconnecting as it is
    cut, would otherwise evict an honest peer's handshake a few milliseconds older)."""

    __slots__ = ("fd", "hello", "server", "sock", "timer", "waiting")

    def __init__(self, server: TlsServer, sock: ssl.SSLSocket) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        loop = server.loop
        self.timer = loop.call_later(server.handshake_timeout, self._timeout)
        self.waiting: str | None = None  # "r" or "w": the callback registered
        #: Its peer's first message was whole and answered (a cipher is chosen).
        self.hello = False

    def idle_since(self) -> float | None:
        # (a fifo budget: the oldest admitted without progress goes, else the oldest)
        return None if self.hello else 0.0

    def stalled_since(self) -> float | None:
        return None

    def gone(self) -> bool:
        return False  # it leaves its budget whenever it ends

    def evict(self) -> None:
        self._fail("evicted", None, counted=True)

    def step(self) -> None:
        loop = self.server.loop
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._progressed()
            self._wait("r")
            return
        except ssl.SSLWantWriteError:
            self._progressed()
            self._wait("w")
            return
        except (OSError, ssl.SSLError) as err:
            self._fail(_reason(err), err)
            return
        self._unwait()
        self.timer.cancel()
        self.server.handshakes.leave(self)
        if self.server.closed:
            self.sock.close()
            return
        try:
            peer = self.sock.getpeername()
        except OSError as err:
            self._fail("reset", err)
            return
        extra = {
            "peername": peer,
            "sockname": self.sock.getsockname(),
            "socket": self.sock,
            "sslcontext": self.server.context,
            "ssl_object": self.sock,
            "peercert": self.sock.getpeercert(),
            "cipher": self.sock.cipher(),
            "compression": None,
        }
        try:
            protocol = self.server.protocol_factory()
            t = TlsTransport(loop, self.sock, protocol, extra, self.server.transports.discard)
        except Exception:
            log.exception("TLS listener: no protocol for a connection; closing it")
            self.sock.close()
            return
        self.server.transports.add(t)
        try:
            t.start()
        except Exception:
            log.exception("TLS connection: connection_made failed; closing")
            t.abort()

    def _progressed(self) -> None:
        if not self.hello and self.sock.cipher() is not None:
            self.hello = True  # OpenSSL chose a cipher: the ClientHello was whole

    def _wait(self, what: str) -> None:
        if self.waiting == what:
            return
        self._unwait()
        loop = self.server.loop
        if what == "r":
            loop.add_reader(self.fd, self.step)
        else:
            loop.add_writer(self.fd, self.step)
        self.waiting = what

    def _unwait(self) -> None:
        if self.waiting == "r":
            self.server.loop.remove_reader(self.fd)
        elif self.waiting == "w":
            self.server.loop.remove_writer(self.fd)
        self.waiting = None

    def _timeout(self) -> None:
        _count(Reason.HEAD)
        self._fail("timeout", None, counted=True)

    def _fail(self, reason: str | None, err: BaseException | None, counted: bool = False) -> None:
        """Close the connection; `reason` None: the server is closing (not counted);
        `counted`: counted by the budget's rules already."""
        self._unwait()
        self.timer.cancel()
        self.server.handshakes.leave(self)
        if reason is not None:
            if not counted:
                HANDSHAKE_FAILED.labels(reason).inc()
            log.debug("TLS handshake dropped (%s): %r", reason, err)
        with contextlib.suppress(OSError):
            self.sock.close()


class TlsServer:
    """Accepts TLS connections on `sock` (listening, bound) with `context`, giving each
    a `TlsTransport` and a protocol from `protocol_factory` once its handshake is done.
    `context` is read per connection, so a context reloaded in place (SIGHUP) applies to
    the connections accepted afterwards. Quacks like the `asyncio.Server` uvicorn keeps."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        protocol_factory: Callable[[], asyncio.Protocol],
        sock: socket.socket,
        context: ssl.SSLContext,
        handshake_timeout: float,
        max_handshakes: int = MAX_HANDSHAKES,
        share: float = 1.0,
    ) -> None:
        self.loop = loop
        self.protocol_factory = protocol_factory
        self.sock = sock
        self.context = context
        self.handshake_timeout = handshake_timeout
        #: Connections in their handshake (`net.budget`): at `max_handshakes`, a new one
        #: evicts the one waiting longest, so a flood of peers that connect and do not
        #: finish cannot lock newcomers out for the whole handshake timeout (each holds a
        #: descriptor and OpenSSL's state).
        #: One peer address holds at most `share` of them once they are at the cap.
        count, on_size = budget_hooks("tls_handshakes", max_handshakes, _count)
        self.handshakes: Budget[_Handshake] = Budget(
            max_handshakes, count, on_size=on_size, fifo=True, share=share
        )
        self.max_handshakes = max_handshakes
        self.transports: set[TlsTransport] = set()
        self.closed = False
        self._done: asyncio.Future[None] = loop.create_future()
        # TLS 1.2 renegotiation would make a read want a write (and is a CPU sink for a
        # peer); TLS 1.3 has none.
        context.options |= ssl.OP_NO_RENEGOTIATION
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._accept)

    @property
    def handshaking(self) -> dict[_Handshake, Principal]:
        """Connections in their handshake, oldest first."""
        return self.handshakes.members

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self.closed else (self.sock,)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                raw, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue  # that client left before its accept
                # Out of descriptors and the like: the pending connection keeps the socket
                # readable, so stop watching it for a while instead of spinning on it.
                log.warning("TLS listener: accept failed, retrying in %gs: %s", ACCEPT_RETRY_S, err)
                self.loop.remove_reader(self.sock.fileno())
                self.loop.call_later(ACCEPT_RETRY_S, self._watch)
                return
            try:
                raw.setblocking(False)
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                tls = self.context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            except (OSError, ssl.SSLError) as err:
                log.debug("TLS listener: wrap failed: %r", err)
                raw.close()
                continue
            h = _Handshake(self, tls)
            # (fifo: never refused, the oldest goes; its own oldest at its peer's share)
            self.handshakes.admit(h, peer_principal(addr))
            h.step()

    def _watch(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting (open connections stay until their protocols close them)."""
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.sock.fileno())
        for h in list(self.handshaking):
            h._fail(None, None)
        if not self._done.done():
            self._done.set_result(None)

    async def wait_closed(self) -> None:
        await self._done

    def is_serving(self) -> bool:
        return not self.closed
