"""A small asyncio TCP server base for the protocol listeners (KT, memcached).

Built on `asyncio.Protocol` callbacks rather than streams: a request is parsed and answered
inside `data_received`, with no coroutine switch, which is most of a small read's cost.

Each connection keeps a buffer and a `Session` (per-connection protocol state). The
session's `run(buf)` is a generator: each step does a bounded slice of work (one small
request, or a slice of a big one) and yields the reply bytes ready so far; it returns —
True to close — once the buffer holds no complete request. The connection runs a few steps
per loop turn and schedules the rest with `call_soon`, so one connection's huge request
(a binary get_bulk of a million keys) never holds the event loop: every other connection
is served between its slices. Replies are written in request order, so pipelining works.
While a request is being worked on, the connection stops reading once its buffer is large.
Back-pressure: a connection's transport buffers at most `WRITE_HIGH_WATER` bytes of
replies the client has not taken; above it (asyncio's `pause_writing`) the run is not
stepped and nothing is read until the buffer drains (`resume_writing`). A reply is
produced only as it is taken: a run yields a big reply in pieces (`reads/replystream.py`),
so what a connection holds is bounded by the high-water mark, one turn's bytes and one
piece (a piece is at most one value plus a little), whatever its request asks for.

Limits (`ListenerLimits`, one per listener; the cap and the deadlines are `net/budget.py`'s,
the rules every listener applies): a connection cap (at it, a newcomer evicts the
connection longest without an answer — idle, or with a request still arriving; never one
being answered or with replies left to write; a peer over its share first — and only when
none may go is the newcomer refused with the protocol's busy reply, if any; a listener
whose busy reply depends on the protocol the client speaks — KT: HTTP or binary on one
port — holds the refused connection, outside the count, up to `REFUSE_WAIT` for its first
byte, `MAX_REFUSING` of them at most, others answered at once), a header timeout (a
request's head must arrive within it from its first byte), a body timeout (the whole
request within it), a minimum rate of a partial request after a grace
(`net.budget.BodyRate`), an idle timeout (no request for that long), and a write timeout (a
client that reads none of its replies for that long). One sweep per second checks every
connection and samples the bytes queued for writing; metrics
`mercury_listener_connections{listener}`,
`mercury_listener_refused_total{listener, reason}` (what was refused, evicted or closed and
why) and `mercury_listener_write_queued_bytes{listener}` /
`mercury_listener_write_queued_max_bytes{listener}`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from core.addr import UnixAddr
from core.commitgate import CommitGate
from net import fastconn, handover
from net.budget import (
    TCP_LABELS,
    BodyRate,
    Budget,
    Deadlines,
    Principal,
    Reason,
    peer_principal,
)
from net.metrics import (
    LISTENER_COMMIT_WAITS,
    LISTENER_CONNECTIONS,
    LISTENER_HELD_REFUSED,
    LISTENER_QUEUED,
    LISTENER_QUEUED_MAX,
    LISTENER_REFUSED,
    READ_ERRORS,
    budget_hooks,
)
from net.unsent import Held, to_drop

log = logging.getLogger(__name__)

#: Replies (small requests) a connection answers per loop turn before the others go; a
#: slice of a big request (a step yielding b"") always ends the turn.
STEPS_PER_TURN = 16
#: Reply bytes a connection hands its transport per turn (then backpressure can act).
TURN_BYTES = 256 << 10
#: Reply bytes a transport buffers before the connection stops producing more (asyncio
#: calls `pause_writing` above it, `resume_writing` once it is down to `WRITE_LOW_WATER`).
WRITE_HIGH_WATER = 256 << 10
WRITE_LOW_WATER = 64 << 10
#: While a request is being worked on, stop reading once this much is buffered.
MAX_BUFFER_WHILE_BUSY = 1 << 20
#: A connection buffering more than this counts against its listener's
#: `max_buffered_bytes` (smaller buffers are bounded by the connection cap alone).
BIG_BUFFER = 1 << 20
#: A connection whose partial request began this long ago may be evicted at the cap (none:
#: as `net.http_bounds.STALLED_BODY_S`).
STALLED_S = 0.0
#: How often every connection's timeouts are checked.
SWEEP_SECONDS = 1.0
#: How long a connection refused at the cap is held for its first byte when its busy reply
#: depends on it (`TcpService.busy_reply_to`); the header timeout when that is shorter.
REFUSE_WAIT = 1.0
#: Refused connections held at once for their first byte; beyond it one is answered at
#: once, as one that sent nothing would be.
MAX_REFUSING = 64

#: A session's run: yields reply bytes (b"" = a slice of work done, nothing to send yet),
#: returns True when the connection must close after what was written.
Run = Generator[bytes, None, bool]


class Abort(Exception):
    """Raised by a session's run to drop its connection at once — not a bug (no traceback):
    part of a reply went out and the rest cannot be sent (`reads.replystream.Cut`).
    `reason` labels `mercury_read_errors_total`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Wait(bytes):
    """An empty step of a session's run that waits for `future` (a write's commit): the
    connection resumes the run once the future is done, not on the next loop turn."""

    future: asyncio.Future[Any]

    def __new__(cls, future: asyncio.Future[Any]) -> Wait:
        w = super().__new__(cls, b"")
        w.future = future
        return w


T = TypeVar("T")


def _consume(fut: asyncio.Future[Any]) -> None:
    """Retrieve an awaited outcome even when its connection went away first (else asyncio
    logs "exception was never retrieved")."""
    if not fut.cancelled():
        fut.exception()


def wait_for(coro: Coroutine[Any, Any, T]) -> Generator[bytes, None, T]:
    """Inside a session's run: run `coro` as a task, yield a `Wait` for it (the connection
    resumes the run once it is done) and return its result. How a listener's run awaits
    a write's durable commit without holding the event loop."""
    fut = asyncio.ensure_future(coro)
    fut.add_done_callback(_consume)
    while not fut.done():
        yield Wait(fut)
    return fut.result()


class Session(Protocol):
    """A connection's protocol state."""

    def run(self, buf: bytearray) -> Run:
        """Answer the complete requests at the front of `buf`, deleting them."""
        ...

    def phase(self, buf: bytearray) -> str:
        """Where the partial request in `buf` is: "header" or "body" (for the timeouts)."""
        ...


#: The busy reply to a connection refused at the cap, given the first byte it sent (None:
#: nothing within `REFUSE_WAIT`); None: close without a reply.
BusyReplyTo = Callable[[int | None], "bytes | None"]

#: A session's optional shortcut (its attribute `fast`): the reply to `data` when `data`,
#: received on an idle connection with nothing buffered, is exactly one small request the
#: session answers at once (a memcached `get` line); None sends it the usual way.
Fast = Callable[[bytes], "bytes | None"]


@dataclass(frozen=True)
class ListenerLimits:
    """Bounds of one TCP listener (flags `--listener-*`; see docs/reads.md)."""

    max_connections: int = 1024
    idle_timeout: float = 300.0
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    #: Reply bytes not taken by the client for this long close the connection.
    write_timeout: float = 60.0
    #: Reply bytes the listener's clients have not taken, at most (over the connections
    #: past their high-water mark): a piece can be a whole value of up to 25 MiB.
    max_unsent_bytes: int = 512 << 20
    #: Request bytes the listener's connections buffer, at most (over those buffering more
    #: than `BIG_BUFFER`): a memcached `set` may carry 32 MiB, a KT body 16 MiB.
    max_buffered_bytes: int = 512 << 20
    #: A partial request must average this many bytes a second from its first byte once
    #: `body_grace` seconds have passed (`net.budget.BodyRate`; 0: no rate).
    min_body_rate: float = 1024.0
    body_grace: float = 5.0
    #: The part of a full listener one peer address may hold (`net.budget.share_cap`).
    principal_share: float = 0.25

    def deadlines(self) -> Deadlines:
        """The listener's clocks (`net.budget`): the head clock starts at a request's first
        byte, the body clock too (the whole request within it); a connection whose partial
        request began `STALLED_S` ago may be evicted at the cap (the longest first)."""
        return Deadlines(
            head=self.header_timeout,
            body=self.body_timeout,
            idle=self.idle_timeout,
            write=self.write_timeout,
            stalled_body=STALLED_S,
        )

    def body_rate(self) -> BodyRate:
        """The minimum rate of a partial request (its deadlines are `deadlines`)."""
        return BodyRate(self.min_body_rate, self.body_grace, None)


def add_listener_flags(p: argparse.ArgumentParser) -> None:
    """The `--listener-*` flags bounding the KT and memcached listeners."""
    d = ListenerLimits()
    p.add_argument(
        "--listener-max-connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help=f"connections each KT/memcached listener serves at once; at the cap a newcomer "
        f"evicts the one longest without an answer (idle, or with a request still "
        f"arriving), or is refused when none may go (default {d.max_connections})",
    )
    for name, what in (
        ("idle", "with no request in progress"),
        ("header", "for a request's head (HTTP headers, binary header, command line)"),
        ("body", "for a whole request (its body)"),
        ("write", "for a client to take any of its replies"),
    ):
        default = getattr(d, f"{name}_timeout")
        p.add_argument(
            f"--listener-{name}-timeout-s",
            type=float,
            default=default,
            metavar="S",
            help=f"KT/memcached: close a connection after S seconds {what} (default {default:g})",
        )
    p.add_argument(
        "--listener-min-body-rate",
        type=float,
        default=d.min_body_rate,
        metavar="B",
        help="KT/memcached: a partial request must average at least B bytes a second from its "
        "first byte once --listener-body-grace-s has passed, else the connection closes "
        f"(0: no rate; default {d.min_body_rate:g})",
    )
    p.add_argument(
        "--listener-body-grace-s",
        type=float,
        default=d.body_grace,
        metavar="S",
        help=f"KT/memcached: seconds a request may take before its rate counts "
        f"(default {d.body_grace:g})",
    )
    p.add_argument(
        "--listener-principal-share",
        type=float,
        default=d.principal_share,
        metavar="F",
        help="KT/memcached: part of --listener-max-connections one peer address may hold "
        "once the cap is reached (at its share a newcomer only displaces that peer's own "
        f"connections; 1: no share; default {d.principal_share:g})",
    )
    p.add_argument(
        "--listener-max-unsent-bytes",
        type=int,
        default=d.max_unsent_bytes,
        metavar="B",
        help="KT/memcached: reply bytes each listener's clients have not taken, at most; "
        "past it the connections whose clients take nothing are closed first, the longest "
        f"waiting first (default {d.max_unsent_bytes})",
    )
    p.add_argument(
        "--listener-max-buffered-bytes",
        type=int,
        default=d.max_buffered_bytes,
        metavar="B",
        help="KT/memcached: request bytes each listener's connections buffer, at most; past "
        "it the connections whose partial request began longest ago are closed first "
        f"(default {d.max_buffered_bytes})",
    )


def listener_limits(args: argparse.Namespace) -> ListenerLimits:
    """`ListenerLimits` from the flags `add_listener_flags` added to the parser."""
    return ListenerLimits(
        max_connections=int(args.listener_max_connections),
        idle_timeout=float(args.listener_idle_timeout_s),
        header_timeout=float(args.listener_header_timeout_s),
        body_timeout=float(args.listener_body_timeout_s),
        write_timeout=float(args.listener_write_timeout_s),
        max_unsent_bytes=int(args.listener_max_unsent_bytes),
        max_buffered_bytes=int(args.listener_max_buffered_bytes),
        min_body_rate=float(args.listener_min_body_rate),
        body_grace=float(args.listener_body_grace_s),
        principal_share=float(args.listener_principal_share),
    )


if TYPE_CHECKING:
    _ConnBase = fastconn.ConnBase
else:
    _ConnBase = fastconn.BASE


class _Conn(_ConnBase, asyncio.Protocol):
    """One connection. `data_received` is `net/fastconn.py`'s (compiled when built): a
    whole request on an idle connection goes to the session's shortcut, the rest to
    `received_more`."""

    transport: asyncio.Transport | None
    fast: Fast | None
    work: Run | None

    def __init__(self, service: TcpService) -> None:
        super().__init__()
        self.service = service
        self.session = service.make_session()
        self.fast = getattr(self.session, "fast", None)
        self.write_paused_at: float | None = None
        #: Reply bytes the transport held when it passed its high-water mark.
        self.paused_size = 0
        self.scheduled = False
        self.waiting: asyncio.Future[Any] | None = None
        now = time.monotonic()
        self.active_at = now  # last byte received or request answered
        self.request_at = now  # first byte of the partial request in `buf`
        self.received = 0  # bytes received in all
        self.partial_id = -1  # `received - len(buf)` when the partial request began
        self.reading = True
        #: While refused at the cap and held for its first byte: the wait's timer.
        self.refusing: asyncio.TimerHandle | None = None
        #: Closed by a limit: its transport goes a loop turn later (`connection_lost`), and
        #: until then no other limit counts it again.
        self.aborted = False

    def abort(self) -> None:
        """Close now, dropping unsent replies and buffered requests (a limit's close)."""
        self.aborted = True
        if self.transport is not None:
            self.transport.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        t: asyncio.Transport = transport  # type: ignore[assignment]
        svc = self.service
        # At the cap: the closed ones leave, else the longest idle is evicted (an idle
        # socket must never lock a working client out), else the newcomer is refused.
        if not svc.budget.admit(self, peer_principal(transport.get_extra_info("peername"))):
            reply = svc.busy_reply
            if svc.busy_reply_to is not None:
                if len(svc.refusing) < MAX_REFUSING:
                    self._hold_refused(t)
                    return
                # Too many held already: answered at once, as one that sent nothing
                # (an HTTP client still gets its 503; only a binary one reads it wrong).
                reply = svc.busy_reply_to(None)
            if reply:
                t.write(reply)
            t.close()
            return
        self.transport = t
        t.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _hold_refused(self, t: asyncio.Transport) -> None:
        """Refused at the cap: wait (outside the count) up to `REFUSE_WAIT` for the first
        byte, which chooses the busy reply (`TcpService.busy_reply_to`)."""
        svc = self.service
        self.transport = t
        self.fast = None  # every byte goes to received_more, which answers the refusal
        svc.hold_refused(self)
        wait = min(REFUSE_WAIT, svc.limits.header_timeout)
        self.refusing = asyncio.get_running_loop().call_later(wait, self._answer_refused, None)

    def _answer_refused(self, first: int | None) -> None:
        """Send a held refused connection its busy reply (by `first`, its first byte, or
        None when none came in time) and close it."""
        if self.refusing is not None:
            self.refusing.cancel()
            self.refusing = None
        svc = self.service
        svc.release_refused(self)
        t = self.transport
        if t is None or t.is_closing():
            return
        assert svc.busy_reply_to is not None
        reply = svc.busy_reply_to(first)
        if reply:
            t.write(reply)
        t.close()

    # -- the budget's view (`net.budget.Member`) ------------------------------------------

    def idle(self) -> bool:
        """No request in progress (none being answered, none partly received) and nothing
        left to write: closing it now loses the client nothing."""
        t = self.transport
        return (
            t is not None
            and not t.is_closing()
            and self.work is None
            and self.waiting is None
            and not self.buf
            and self.write_paused_at is None
            and t.get_write_buffer_size() == 0
        )

    def idle_since(self) -> float | None:
        return self.active_at if self.idle() else None

    def stalled_since(self) -> float | None:
        # A partial request made no progress (nothing it sent was acted on) since it began.
        if self.buf and self.work is None and self.waiting is None and self.write_paused_at is None:
            return self.request_at
        return None

    def gone(self) -> bool:
        t = self.transport
        return t is None or (t.is_closing() and t.get_write_buffer_size() == 0)

    def evict(self) -> None:
        """Close this idle connection to make room (it has left the count already)."""
        if self.transport is not None:
            self.transport.close()

    def fast_failed(self) -> None:
        # As in _drive: a bug costs one connection, never the listener.
        log.exception("%s listener: request failed; closing", self.service.name)
        READ_ERRORS.labels(self.service.name, "internal").inc()
        if self.transport is not None:
            self.transport.close()

    def received_more(self, data: bytes) -> None:
        if self.refusing is not None:
            self._answer_refused(data[0])  # refused at the cap: its first byte is here
            return
        self.buf += data
        if len(self.buf) > BIG_BUFFER:
            self.service.note_buffered(self)
            if self.transport is None or self.transport.is_closing():
                return  # closed for the listener's buffer bound
        if self.work is None:
            self.work = self.session.run(self.buf)
            self._drive()
        elif len(self.buf) > MAX_BUFFER_WHILE_BUSY:
            self._pause_reading()

    def _wait_done(self, _fut: asyncio.Future[Any]) -> None:
        self.waiting = None
        if self.write_paused_at is None:
            self._schedule()

    def _drive(self) -> None:
        self.scheduled = False
        if self.waiting is not None:
            return  # the run waits for a future; _wait_done resumes it
        if self.write_paused_at is not None:
            return  # the client has not taken what it has: resume_writing resumes the run
        t = self.transport
        work = self.work
        if t is None or t.is_closing() or work is None:
            return
        out: list[bytes] = []
        close = False
        sliced = False
        try:
            size = 0
            for _ in range(STEPS_PER_TURN):
                chunk = next(work)
                if isinstance(chunk, Wait) and not chunk.future.done():
                    self.waiting = chunk.future
                    chunk.future.add_done_callback(self._wait_done)
                    break  # resumed by _wait_done
                if not chunk:
                    sliced = True
                    break  # a slice of a big request: other connections go first
                out.append(chunk)
                size += len(chunk)
                if size >= TURN_BYTES:
                    break  # and no more replies than this ahead of the transport
        except StopIteration as stop:
            self.work = None
            close = bool(stop.value)
        except Abort as stop:
            log.warning("%s listener: dropping a connection: %s", self.service.name, stop)
            READ_ERRORS.labels(self.service.name, stop.reason).inc()
            self.work = None
            t.abort()  # a cut reply must not pass for a whole one: no graceful end
            return
        except Exception:
            # A bug must cost one connection, never the listener or the process.
            log.exception("%s listener: request failed; closing the connection", self.service.name)
            READ_ERRORS.labels(self.service.name, "internal").inc()
            self.work = None
            t.close()
            return
        if out:
            t.write(b"".join(out))
        if close:
            t.close()
            return
        if self.work is not None:
            # More to do: let every other connection run first, and a commit in flight
            # finish first (its thread needs the GIL this work would hold).
            gate = self.service.yield_to
            idle = gate.idle() if sliced and gate is not None else None
            if idle is not None and self.waiting is None:
                LISTENER_COMMIT_WAITS.labels(self.service.name).inc()
                self.waiting = idle
                idle.add_done_callback(self._wait_done)
            elif self.write_paused_at is None:
                self._schedule()
            return
        self._idle_again()

    def _schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._drive)

    def _idle_again(self) -> None:
        """The buffer holds no complete request: note when a partial one began, read on."""
        now = time.monotonic()
        if not self.buf:
            self.active_at = now
        else:
            pid = self.received - len(self.buf)
            if pid != self.partial_id:  # a new request began since the last check
                self.partial_id = pid
                self.request_at = now
        if self.write_paused_at is None:
            self._resume_reading()

    def _pause_reading(self) -> None:
        if self.reading and self.transport is not None:
            self.reading = False
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self.reading and self.transport is not None and not self.transport.is_closing():
            self.reading = True
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused_at = time.monotonic()
        self._pause_reading()
        if self.transport is not None:
            self.paused_size = self.transport.get_write_buffer_size()
            self.service.unsent.add(self)
            self.service.hold_unsent_cap()

    def resume_writing(self) -> None:
        self.write_paused_at = None
        self.service.unsent.discard(self)
        if self.transport is None or self.transport.is_closing():
            return
        if self.work is not None:
            self._schedule()
        else:
            self._resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.unsent.discard(self)
        self.service.forget_buffered(self)
        if self.refusing is not None:
            self.refusing.cancel()
            self.refusing = None
            self.service.release_refused(self)
        self.service.budget.leave(self)
        self.transport = None
        self.work = None
        self.buf = bytearray()

    def expired(self, now: float) -> Reason | None:
        """The deadline this connection has run out of (`net.budget.Deadlines`), or None."""
        head = body = idle = None
        if self.write_paused_at is not None or self.work is not None:
            pass  # the write clock, or none while the server works on it: no phase to find
        elif self.buf:
            if self.session.phase(self.buf) == "header":
                head = self.request_at
            else:
                body = self.request_at
        else:
            idle = self.active_at
        reason = self.service.deadlines.overdue(
            now,
            write_paused_at=self.write_paused_at,
            working=self.work is not None,  # the server is working on it
            head_since=head,
            body_since=body,
            idle_since=idle,
        )
        if reason is None and (head is not None or body is not None):
            # The partial request's bytes since it began (`partial_id` is where it began).
            start = self.partial_id if self.partial_id >= 0 else self.received - len(self.buf)
            reason = self.service.rate.check(now, self.request_at, self.received - start)
        return reason


class TcpService:
    """Listen on host:port; each connection gets a fresh `Session` from `make_session()`.

    `busy_reply`: bytes sent to a connection refused over the cap (None: just close).
    `busy_reply_to`, instead, when the reply depends on the protocol the client speaks: a
    refused connection is held outside the count for its first byte (up to `REFUSE_WAIT`,
    `MAX_REFUSING` at once; beyond that it is answered at once as if it sent nothing) and
    answered `busy_reply_to(that byte)` (None when none came in time). Implements
    `core.service.Service`.
    """

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        make_session: Callable[[], Session],
        *,
        limits: ListenerLimits | None = None,
        busy_reply: bytes | None = None,
        busy_reply_to: BusyReplyTo | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.make_session = make_session
        self.limits = limits or ListenerLimits()
        self.busy_reply = busy_reply
        self.busy_reply_to = busy_reply_to
        self.deadlines = self.limits.deadlines()
        self.rate = self.limits.body_rate()
        gauge = LISTENER_CONNECTIONS.labels(name)
        count, on_size = budget_hooks(name, self.limits.max_connections, self.refuse, gauge.set)
        #: The listener's connections (`net.budget`): the cap and who is evicted at it.
        self.budget: Budget[_Conn] = Budget(
            self.limits.max_connections,
            count,
            on_size=on_size,
            stalled_body=self.deadlines.stalled_body,
            share=self.limits.principal_share,
        )
        #: Connections whose transports are past their high-water mark (the unsent cap).
        self.unsent: set[_Conn] = set()
        #: Connections that buffered more than `BIG_BUFFER`, with the bytes last counted
        #: for each, and their sum (`note_buffered`): a running total, made exact whenever
        #: it says the bound is passed.
        self.buffering: dict[_Conn, int] = {}
        self.buffered = 0
        #: Connections refused at the cap, held for their first byte (not in `conns`).
        self.refusing: set[_Conn] = set()
        #: Bind with SO_REUSEPORT, one of several reader processes on this address
        #: (`--read-workers`, reads/workers.py).
        self.reuse_port = False
        #: Listen on this unix socket instead of host:port (`--memcached-listen unix:`).
        self.unix: UnixAddr | None = None
        #: The commits this listener's bulk work gives way to (the root's store): between
        #: two slices of a big request, a connection waits until none is in flight
        #: (`core/commitgate.py`). None: slices follow each other on the loop's turns.
        self.yield_to: CommitGate | None = None
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    def hold_refused(self, c: _Conn) -> None:
        """`c`, refused at the cap, waits for its first byte (counted in the gauge)."""
        self.refusing.add(c)
        LISTENER_HELD_REFUSED.labels(self.name).inc()

    def release_refused(self, c: _Conn) -> None:
        """`c` no longer waits: answered or gone (once, whichever comes first)."""
        if c in self.refusing:
            self.refusing.discard(c)
            LISTENER_HELD_REFUSED.labels(self.name).dec()

    @property
    def conns(self) -> dict[_Conn, Principal]:
        """The connections counted now (the budget's members)."""
        return self.budget.members

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self.budget)

    def refuse(self, reason: Reason) -> None:
        """Count one connection refused or closed by a limit."""
        LISTENER_REFUSED.labels(self.name, TCP_LABELS[reason]).inc()

    def hold_unsent_cap(self) -> None:
        """Past `max_unsent_bytes` over the connections past their high-water mark, close
        some (`net.unsent`); their unsent replies are dropped."""
        held = [
            Held(c, c.transport.get_write_buffer_size(), c.write_paused_at or 0.0, c.paused_size)
            for c in self.unsent
            if c.transport is not None and not c.aborted
        ]
        for h in to_drop(held, self.limits.max_unsent_bytes):
            self.unsent.discard(h.conn)
            self.budget.count(Reason.UNSENT_CAP)
            log.info(
                "%s listener: closing a connection holding %d reply bytes its client has not "
                "taken (over the cap of %d)",
                self.name,
                h.unsent,
                self.limits.max_unsent_bytes,
            )
            h.conn.abort()

    def note_buffered(self, conn: _Conn) -> None:
        """`conn` buffers more than `BIG_BUFFER`: count it, and past `max_buffered_bytes`
        close connections, the one whose partial request began longest ago first (a client
        sending most of a big request and then stopping would hold it until the body
        timeout; many of them, the process's memory). Their buffers are dropped."""
        n = len(conn.buf)
        self.buffered += n - self.buffering.get(conn, 0)
        self.buffering[conn] = n
        cap = self.limits.max_buffered_bytes
        if self.buffered <= cap:
            return
        # Exact now: buffers consumed since they were counted count what they hold.
        live = {c: len(c.buf) for c in self.buffering if c.transport is not None and not c.aborted}
        self.buffering = {c: k for c, k in live.items() if k > BIG_BUFFER}
        self.buffered = sum(self.buffering.values())
        for c in sorted(self.buffering, key=lambda c: c.request_at):
            if self.buffered <= cap:
                break
            self.budget.count(Reason.BUFFER_CAP)
            log.info(
                "%s listener: closing a connection buffering %d request bytes (over the cap of %d)",
                self.name,
                self.buffering[c],
                cap,
            )
            self.forget_buffered(c)
            c.abort()

    def forget_buffered(self, conn: _Conn) -> None:
        self.buffered -= self.buffering.pop(conn, 0)

    async def start(self) -> None:
        """Bind and listen; returns once connections are accepted."""
        loop = asyncio.get_running_loop()
        # The process's socket of this name (inherited on a hand-over, net/handover.py).
        addr = self.unix if self.unix is not None else (self.host, self.port)
        sock = handover.SOCKETS.listen(self.name, addr, reuse_port=self.reuse_port)
        self._server = await loop.create_server(lambda: _Conn(self), sock=sock)
        if self.port == 0 and self.unix is None:
            self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.call_later(SWEEP_SECONDS, self._sweep)

    def _sweep(self) -> None:
        now = time.monotonic()
        queued = biggest = 0
        for c in list(self.conns):
            if c.aborted:
                continue  # closed by a limit already, counted there
            reason = c.expired(now)
            if reason is not None and c.transport is not None:
                self.budget.count(reason)
                # Debug only: hostile clients cut by the thousand must not flood the log
                # (each is counted in the metrics).
                log.debug("%s listener: closing a connection (%s)", self.name, TCP_LABELS[reason])
                c.abort()  # unsent replies to a slow reader are dropped too
            elif c.transport is not None:
                n = c.transport.get_write_buffer_size()
                queued += n
                biggest = max(biggest, n)
        LISTENER_QUEUED.labels(self.name).set(queued)
        LISTENER_QUEUED_MAX.labels(self.name).set(biggest)
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    async def drain(self, bound: float) -> None:
        """A hand-over's stop: stop accepting (the new process accepts on the same socket),
        let every request in progress be answered, closing each connection as soon as
        nothing of it is in progress (no partial or unanswered request, no reply unsent),
        for at most `bound` seconds; `stop` closes what is left. These protocols have no
        way to ask a client to reconnect: one that sends on an idle connection as it is
        closed sees it closed."""
        if self._server is None:
            return
        self._server.close()
        deadline = time.monotonic() + bound
        while True:
            for c in list(self.conns):
                t = c.transport
                if t is None or c.aborted or t.is_closing():
                    continue
                idle = c.work is None and not c.buf and c.waiting is None
                if idle and t.get_write_buffer_size() == 0:
                    t.close()
            if not self.conns or time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop listening and close every open connection."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is None:
            return
        self._server.close()
        for c in list(self.refusing):
            if c.transport is not None:
                c.transport.close()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 5)
        self._server = None


def drain(run: Run) -> tuple[bytes, bool]:
    """Run a session step to its end at once: (all reply bytes, close). For tests and
    tools that call a handler directly, without a connection."""
    out: list[bytes] = []
    while True:
        try:
            out.append(next(run))
        except StopIteration as stop:
            return b"".join(out), bool(stop.value)
