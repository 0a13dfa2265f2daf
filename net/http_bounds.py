"""Bounds of every HTTP listener (the root's gateway, a replica's read API and each of its
read worker processes, the standalone read server `python -m mercury.readserve`): idle and header
timeouts, a header size cap and a connection cap, over uvicorn's httptools protocol as
`net/uvicorn_http.py` presents it (or a subclass of it: the read servers' point-get
protocol). In `net` so that `mercury/` and `reads/` (which may not import `mercury/`) bound
their listeners with the one protocol and the one set of ``--http-*`` flags. The cap, who is
evicted at it and the deadlines are `net/budget.py`'s, the rules the KT/memcached listeners
and TLS handshakes follow too; what is HTTP's own is here: what idle means for a connection
(waiting for a request head, even one arriving in pieces), the head size bound, the 431.

uvicorn alone closes an idle keep-alive connection only after it has answered a request on
it: a socket that connects and sends nothing (or a header line every few seconds) is kept
for ever, and it counts no connections, so 20,000 idle sockets exhaust the descriptors of
the process that also runs the store and the replication source (or a replica's reads).
Here every connection has
a deadline for its next complete request head (from its opening, then from each response):
bytes trickling in do not move it. A request body must keep arriving at a minimum rate
after a grace and be whole within a deadline (`net.budget.BodyRate`), else 408 and close.
At the connection cap a new connection evicts the connection that has held its slot
longest without an answer — waiting for a request head, or with a request still arriving
— unauthenticated ones first and those of a principal over its share before them
(`net.budget`; the application names a connection's principal, `authenticated`), so
neither idle sockets nor bodies dribbled a byte at a time can lock a producer out; only
when every connection is being answered is the newcomer closed.

A request head is bounded however it arrives: in pieces while the connection waits, in one
segment (its parsed line and headers are counted), or while an earlier request is still
being answered (a pipelined head that never ends). And a malformed request behind one
being answered does not destroy that answer: uvicorn answered 400 at once and closed, so a
committed PUT's 200 never reached its client; the 400 now follows the answers before it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import socket
import ssl
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from prometheus_client import Counter, Gauge

from core.problems import problem_document
from net import asgibody, uvicorn_http
from net.budget import (
    HTTP_LABELS,
    BodyRate,
    Budget,
    Deadlines,
    Principal,
    Reason,
    cert_principal,
    peer_principal,
)
from net.metrics import budget_hooks
from net.unsent import Held, to_drop
from net.uvicorn_http import HttpProtocol

log = logging.getLogger(__name__)

CONNECTIONS = Gauge("mercury_http_connections", "Open connections of this process's HTTP listener")
CLOSED = Counter(
    "mercury_http_connections_closed_total",
    "Connections this process's HTTP listener closed itself, by reason "
    "(idle: no request head in time; evicted: idle or with a stalled body at the "
    "connection cap; refused: at the cap with none such; header_too_large; "
    "write_timeout: a client that took too little of its answer for too long; "
    "unsent_cap: over the listener's cap on answer bytes its clients have not taken)",
    ("reason",),
)


#: A connection whose request is arriving (its head read, its body not whole) may be
#: evicted at the cap however recently it began, the longest without an answer first: any
#: grace would let a flood of trickled bodies that reconnect as they are cut keep every
#: slot unevictable by being young (an honest request, begun after them, goes after them).
STALLED_BODY_S = 0.0


def authenticated(scope: MutableMapping[str, Any], principal: Principal) -> None:
    """The application authenticated the request of `scope` as `principal` (a token or a
    certificate it verified): its connection holds its slot for that principal from now
    on (`net.budget.Budget.tag`). Nothing for a request that came another way."""
    conn = scope.get("extensions", {}).get(uvicorn_http.CONNECTION)
    if conn is not None:
        conn.authenticated(principal)


def streaming(scope: MutableMapping[str, Any]) -> tuple[Any, Principal] | None:
    """The request of `scope` is answered with an endless stream (a watch): its connection
    leaves the listener's connection budget, so streams never take the slots requests need
    (the stream endpoint admits it to a budget of streams instead, and its answer is the
    last on the connection). The connection (its `transport`, `write_paused()`) and the
    principal it held its slot for; None for a request that came another way."""
    conn = scope.get("extensions", {}).get(uvicorn_http.CONNECTION)
    if conn is None:
        return None
    principal = conn.streaming()
    return None if principal is None else (conn, principal)


def _count(reason: Reason) -> None:
    CLOSED.labels(HTTP_LABELS[reason]).inc()


def too_large_answer(max_header_bytes: int) -> bytes:
    """The whole 431 answer to a request head over `max_header_bytes`: a problem+json that
    names the bound, then the connection closes (the rest of the head is never read)."""
    body = json.dumps(
        problem_document(
            431,
            f"the request head (request line and headers) is over {max_header_bytes} bytes",
            hint="send smaller headers; the node's bound is --http-max-header-bytes",
        ),
        separators=(",", ":"),
    ).encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/problem+json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    ) + body


def timeout_answer(detail: str, hint: str) -> bytes:
    """The whole 408 answer to a request whose body broke the listener's rate or deadline:
    a problem+json, then the connection closes."""
    body = json.dumps(problem_document(408, detail, hint=hint), separators=(",", ":")).encode()
    return (
        b"HTTP/1.1 408 Request Timeout\r\n"
        b"content-type: application/problem+json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    ) + body


def _principal(transport: asyncio.BaseTransport) -> Principal:
    """A new connection's principal: its verified client certificate's, else its peer
    address (unauthenticated until its application names a token, `authenticated`)."""
    tls = transport.get_extra_info("ssl_object")
    if tls is not None:
        der = tls.getpeercert(binary_form=True)
        if der:
            return cert_principal(der)
    return peer_principal(transport.get_extra_info("peername"))


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the head being parsed is over the bound."""


@dataclass(frozen=True, slots=True)
class HttpBounds:
    """`idle_timeout_s`: longest wait for a complete request head, from the connection's
    opening or its last response (a keep-alive connection idle that long is closed too).
    `max_connections`: open connections at most. `max_header_bytes`: the largest request
    head (request line + headers). `write_timeout_s`: longest a connection's answer may
    stay over the transport's high-water mark (its client not taking it) before the
    connection is aborted. `max_unsent_bytes`: answer bytes the listener's clients have not
    taken, at most, over the connections past their high-water mark.
    `max_body_bytes_held`: request body bytes the process holds at once while they arrive
    (`net.asgibody.BodyBudget`). `min_body_rate`, `body_grace_s`, `body_timeout_s`: a
    request body must average `min_body_rate` bytes a second from its head on once
    `body_grace_s` have passed, and be whole within `body_timeout_s` (`net.budget.BodyRate`),
    else 408 and the connection closes. `principal_share`: the part of the connection cap
    one principal (token, client certificate, or else peer address) may hold when full."""

    idle_timeout_s: float = 15.0
    max_connections: int = 1000
    max_header_bytes: int = 64 << 10
    write_timeout_s: float = 60.0
    max_unsent_bytes: int = 512 << 20
    max_body_bytes_held: int = 1 << 30
    min_body_rate: float = 1024.0
    body_grace_s: float = 5.0
    body_timeout_s: float = 60.0
    principal_share: float = 0.25

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> HttpBounds:
        """The bounds from the ``--http-*`` flags (`add_flags`)."""
        return cls(
            idle_timeout_s=float(args.http_idle_timeout),
            max_connections=int(args.http_max_connections),
            max_header_bytes=int(args.http_max_header_bytes),
            write_timeout_s=float(args.http_write_timeout),
            max_unsent_bytes=int(args.http_max_unsent_bytes),
            max_body_bytes_held=int(args.http_max_body_bytes_held),
            min_body_rate=float(args.http_min_body_rate),
            body_grace_s=float(args.http_body_grace),
            body_timeout_s=float(args.http_body_timeout),
            principal_share=float(args.http_principal_share),
        )

    def body_rate(self) -> BodyRate:
        """The rule every request body of the listener follows (`net.budget.BodyRate`)."""
        return BodyRate(self.min_body_rate, self.body_grace_s, self.body_timeout_s)

    def deadlines(self) -> Deadlines:
        """The listener's clocks (`net.budget`): the head clock starts when a connection
        begins to wait for a request (its opening, or its last answer), so the head and
        idle deadlines are one; a body follows `body_rate`, and a connection whose request
        has been arriving for `STALLED_BODY_S` without an answer may be evicted at the cap."""
        return Deadlines(
            head=self.idle_timeout_s, write=self.write_timeout_s, stalled_body=STALLED_BODY_S
        )


def add_flags(p: argparse.ArgumentParser) -> None:
    """The ``--http-*`` flags of `mercury root`, `mercury replica` and `python -m
    mercury.readserve` (the same names, defaults and meaning on all: each bounds that process's
    HTTP listener)."""
    d = HttpBounds()
    p.add_argument(
        "--http-idle-timeout",
        type=float,
        default=d.idle_timeout_s,
        help="close an HTTP connection that sends no complete request head within S "
        f"seconds of opening or of its last response (default {d.idle_timeout_s:g})",
    )
    p.add_argument(
        "--http-max-connections",
        type=int,
        default=d.max_connections,
        help="open HTTP connections at most (per process); at the cap the one longest "
        "without an answer (idle, or with a request still arriving) is closed "
        f"(default {d.max_connections})",
    )
    p.add_argument(
        "--http-max-header-bytes",
        type=int,
        default=d.max_header_bytes,
        help=f"largest request head in bytes (default {d.max_header_bytes})",
    )
    p.add_argument(
        "--http-write-timeout",
        type=float,
        default=d.write_timeout_s,
        help="abort an HTTP connection whose client has not taken its answer (the answer's "
        f"unsent bytes over the high-water mark) for S seconds (default {d.write_timeout_s:g})",
    )
    p.add_argument(
        "--http-max-unsent-bytes",
        type=int,
        default=d.max_unsent_bytes,
        help="answer bytes clients have not taken, at most (per process); past it the "
        "connections whose clients take nothing are aborted first, the longest waiting "
        f"first (default {d.max_unsent_bytes})",
    )
    p.add_argument(
        "--http-max-body-bytes-held",
        type=int,
        default=d.max_body_bytes_held,
        help="request body bytes held at once while they arrive (per process); a body whose "
        "next piece would pass it is answered 503 with Retry-After "
        f"(default {d.max_body_bytes_held})",
    )
    p.add_argument(
        "--http-min-body-rate",
        type=float,
        default=d.min_body_rate,
        metavar="B",
        help="a request body must average at least B bytes a second from its head on, once "
        "--http-body-grace has passed, else 408 and the connection closes (0: no rate; "
        f"default {d.min_body_rate:g})",
    )
    p.add_argument(
        "--http-body-grace",
        type=float,
        default=d.body_grace_s,
        metavar="S",
        help=f"seconds a request body may take before its rate counts (default {d.body_grace_s:g})",
    )
    p.add_argument(
        "--http-body-timeout",
        type=float,
        default=d.body_timeout_s,
        metavar="S",
        help="a request body must be whole within S seconds of its head, else 408 and the "
        f"connection closes (default {d.body_timeout_s:g})",
    )
    p.add_argument(
        "--http-principal-share",
        type=float,
        default=d.principal_share,
        metavar="F",
        help="part of --http-max-connections one principal (bearer token, client "
        "certificate, else peer address) may hold once the cap is reached: at its share a "
        "newcomer only displaces its own principal's connections (1: no share; "
        f"default {d.principal_share:g})",
    )


def protocol_class(
    bounds: HttpBounds, base: type[HttpProtocol] = HttpProtocol
) -> type[HttpProtocol]:
    """An httptools protocol class enforcing `bounds` (uvicorn's ``http=`` takes a class)
    over `base`: `net.uvicorn_http`'s protocol, or a subclass of it (the replica's
    point-get protocol, `reads.fasthttp`). One class per listener: its connection budget
    and the connections over their high-water mark (the unsent cap) are the class's."""
    d = bounds.deadlines()
    count, on_size = budget_hooks("http", bounds.max_connections, _count, CONNECTIONS.set)
    budget: Budget[_BoundedProtocol] = Budget(
        bounds.max_connections,
        count,
        on_size=on_size,
        stalled_body=d.stalled_body,
        share=bounds.principal_share,
    )
    attrs = {
        "limits": bounds,
        "deadlines": d,
        "rate": bounds.body_rate(),
        "budget": budget,
        "unsent": set(),
    }
    return type(f"Bounded{base.__name__}", (_BoundedProtocol, base), attrs)


def uvicorn_options(bounds: HttpBounds, base: type[HttpProtocol] = HttpProtocol) -> dict[str, Any]:
    """`uvicorn.Config`'s ``http`` and ``timeout_keep_alive`` under `bounds`: the bounded
    protocol over `base`, and uvicorn's own keep-alive timer set to the idle timeout (in
    whole seconds, at least 1; uvicorn's default would close idle keep-alive connections
    after 5 s whatever `--http-idle-timeout` says). Also sets the process's request body
    budget (`net.asgibody.BODIES`): every HTTP listener of a process takes the same flags."""
    asgibody.BODIES.limit = bounds.max_body_bytes_held
    return {
        "http": protocol_class(bounds, base),
        "timeout_keep_alive": max(1, int(bounds.idle_timeout_s)),
    }


async def start_tls(
    server: uvicorn.Server, sockets: list[socket.socket], context: ssl.SSLContext
) -> None:
    """Start `server` (its config's protocol bounded here) on `net.tlsconn`'s transport,
    with as many handshakes in progress as the listener takes connections
    (`--http-max-connections`): a flood of peers that never finish theirs evicts its own
    oldest."""
    from net.tlsconn import HANDSHAKE_TIMEOUT_S, MAX_HANDSHAKES

    limits = getattr(uvicorn_http.protocol_class(server.config), "limits", None)
    cap = limits.max_connections if isinstance(limits, HttpBounds) else MAX_HANDSHAKES
    share = limits.principal_share if isinstance(limits, HttpBounds) else 1.0
    await uvicorn_http.start_tls_server(server, sockets, context, HANDSHAKE_TIMEOUT_S, cap, share)


class _BoundedProtocol(HttpProtocol):
    limits: HttpBounds
    deadlines: Deadlines
    #: The listener's connections (`net.budget`): the cap and who is evicted at it.
    budget: Budget[_BoundedProtocol]
    #: The rule every request body follows.
    rate: BodyRate
    #: The listener's connections whose transports are over their high-water mark.
    unsent: set[_BoundedProtocol]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: monotonic time since which this connection waits for a request head, or None
        #: while a request is being read or answered (the head clock, `Deadlines.head`).
        self.waiting_since: float | None = None
        self._head_bytes = 0
        #: a request's head was parsed and its body has not all arrived: bytes received
        #: now are that body, even after its answer was sent (an early 403 or 413 leaves
        #: the rest of the body to arrive, which the parser discards), never a head.
        self._body_pending = False
        #: One timer per connection, moved lazily (`_head_expired`): arming a timer per
        #: request would cost as much as a point get answered in the protocol.
        self._deadline: asyncio.TimerHandle | None = None
        #: Counts the waits for a head (a segment that completes one and starts the next is
        #: not counted into the next head's bytes).
        self._waits = 0
        #: The parser is inside a request head (from its first byte to its last).
        self._in_head = False
        #: Bytes of the head being parsed, as parsed (line and headers) and as received
        #: while another request is answered.
        self._parsed_head = 0
        self._ahead_bytes = 0
        #: When the request being received began (its head read) and its body bytes
        #: received since, for the body rate (`rate`), with the rate's timer.
        self._body_since = 0.0
        self._body_bytes = 0
        self._body_timer: asyncio.TimerHandle | None = None
        #: Since when this connection has had no answer (its opening, or its last answer).
        self._progress_at = time.monotonic()
        #: A 400 for a malformed request that waits for the answers before it.
        self._deferred: bytes | None = None
        #: Since when the transport is over its high-water mark (None: under it), with its
        #: unsent bytes then, and the timer of the write deadline.
        self._write_paused_at: float | None = None
        self._paused_size = 0
        self._write_timer: asyncio.TimerHandle | None = None

    # -- the budget's view (`net.budget.Member`) ------------------------------------------

    def idle_since(self) -> float | None:
        # Waiting for a head, even one arriving in pieces: nothing it sent is acted on.
        return self.waiting_since

    def stalled_since(self) -> float | None:
        # A request arriving (however fast its bytes come) made no progress until it is
        # whole: the slot has been held without an answer since the last one.
        return self._progress_at if self._body_pending and self.waiting_since is None else None

    def gone(self) -> bool:
        t = self.transport
        return t.is_closing() and t.get_write_buffer_size() == 0

    def evict(self) -> None:
        self.close_now()

    # -- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.budget.admit(self, _principal(transport)):
            self.forget()
            transport.close()
            return
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self._cancel_body_timer()
        self._writable()
        self.waiting_since = None
        super().connection_lost(exc)
        self.budget.leave(self)

    def close_now(self) -> None:
        """Close this connection (it is idle, or its request's body stalled: nothing it
        sent was acted on, so no answer of it is lost)."""
        self._cancel_deadline()
        self._cancel_body_timer()
        self.waiting_since = None
        self.budget.leave(self)
        self.forget()
        if not self.transport.is_closing():
            self.transport.close()

    def abort_now(self, reason: Reason) -> None:
        """Drop this connection and whatever of its answer its client has not taken."""
        self.budget.count(reason)
        self._cancel_deadline()
        self._cancel_body_timer()
        self._writable()
        self.waiting_since = None
        self.budget.leave(self)
        self.forget()
        self.transport.abort()

    # -- answers the client does not take -------------------------------------------------
    # An answer is written to the transport whole (a value of up to 25 MiB, a get_bulk's
    # JSON): a client that never reads would hold it for as long as it keeps the
    # connection open, and a thousand of them the process's memory. The transport says when
    # its buffer passes the high-water mark and when it is back under the low one.

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_paused_at is not None or self.transport.is_closing():
            return
        self._write_paused_at = time.monotonic()
        self._paused_size = self.transport.get_write_buffer_size()
        self.unsent.add(self)
        if self._write_timer is None:
            # One timer per connection, moved lazily (`_write_expired`), like the head
            # deadline: a streamed answer pauses and resumes many times a second.
            self._write_timer = self.loop.call_later(
                self.deadlines.due(Reason.WRITE, 0.0), self._write_expired
            )
        self._hold_unsent_cap()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_paused_at = None
        self.unsent.discard(self)

    def _writable(self) -> None:
        self._write_paused_at = None
        self.unsent.discard(self)
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_expired(self) -> None:
        self._write_timer = None
        since = self._write_paused_at
        if since is None:
            return  # taken since: the next pause arms it again
        left = self.deadlines.due(Reason.WRITE, since) - time.monotonic()
        if left > 0:  # paused again after the timer was armed
            self._write_timer = self.loop.call_later(left, self._write_expired)
            return
        # Also when closing: a transport closed with unsent bytes keeps them until taken.
        self.abort_now(Reason.WRITE)

    def _hold_unsent_cap(self) -> None:
        """Past `max_unsent_bytes` over the listener's paused connections, abort some
        (`net.unsent`)."""
        held = [
            Held(c, c.transport.get_write_buffer_size(), c._write_paused_at or 0.0, c._paused_size)
            for c in self.unsent
        ]
        for h in to_drop(held, self.limits.max_unsent_bytes):
            log.info(
                "HTTP listener: aborting a connection holding %d bytes its client has not "
                "taken (over the cap of %d)",
                h.unsent,
                self.limits.max_unsent_bytes,
            )
            h.conn.abort_now(Reason.UNSENT_CAP)

    # -- request heads -------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._deferred is not None:
            return  # a malformed request was read: nothing after it is a request
        waits = self._waits
        waiting = self.waiting_since is not None and not self._body_pending
        in_head = self._in_head  # a head already begun: this segment continues it
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._body_pending and self._body_timer is None and self.waiting_since is None:
            self._arm_body_timer()
        if waiting and self.waiting_since is not None and waits == self._waits:
            # still no complete head (bytes after a head answered within this segment
            # are not counted: at most one segment, as when a pipelined head follows)
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._too_large()
        elif not waiting and in_head and self._in_head:
            # a head that began while another request is answered (a watch stream): no
            # wait counts it, so its bytes do (from the segment after the one it began
            # in, which may also hold the end of a body: at most one segment uncounted)
            self._ahead_bytes += len(data)
            if self._ahead_bytes > self.limits.max_header_bytes:
                self._too_large()

    def head_begun(self) -> None:
        self._in_head = True
        self._parsed_head = 0
        self._ahead_bytes = 0

    def head_bytes(self, n: int) -> None:
        self._parsed_head += n
        if self._parsed_head > self.limits.max_header_bytes:
            raise _HeadTooLarge  # the parser's error path: `malformed`

    def head_done(self) -> None:
        self.waiting_since = None  # the deadline, if armed, finds no wait and lapses
        self._in_head = False
        self._body_pending = True
        self._body_since = time.monotonic()
        self._body_bytes = 0

    def body_received(self, n: int) -> None:
        self._body_bytes += n  # the body rate's count (`_body_check`)

    def message_done(self) -> None:
        self._body_pending = False

    def malformed(self, msg: str) -> bool:
        """uvicorn's answer to a request it cannot parse (or to a head over the bound,
        raised from a callback): after the answers of the requests before it, never
        instead of them."""
        if self.transport.is_closing():
            return True
        if self._parsed_head > self.limits.max_header_bytes:
            self._too_large()
            return True
        if self.answering():
            body = msg.encode("ascii", "replace")
            self._deferred = (
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: "
                + str(len(body)).encode()
                + b"\r\nconnection: close\r\n\r\n"
                + body
            )
            return True
        return False

    def response_done(self, pipelined: bool) -> None:
        if self.transport.is_closing():
            return
        if self._deferred is not None and not pipelined:
            # the last request before the malformed one is answered (with one pipelined,
            # uvicorn has just started it: its answer comes first)
            self.transport.write(self._deferred)
            self.close_now()
            return
        if not pipelined:
            self._await_head()

    def authenticated(self, principal: Principal) -> None:
        self.budget.tag(self, principal)

    def streaming(self) -> Principal | None:
        # Its slot goes back to the requests; the stream's budget counts it from now on.
        # Its head/idle deadline does not run while it answers, the write deadline and the
        # unsent cap still apply.
        principal = self.budget.principal_of(self)
        if principal is None:
            principal = peer_principal(self.transport.get_extra_info("peername"))
        self.budget.leave(self)
        return principal

    def request_answered(self) -> None:
        """A request answered by the protocol itself, outside uvicorn's request-response
        cycle (`reads.fasthttp`'s point gets): the connection now waits for its next head,
        under the same deadline as after any other answer (it stands for that subclass's
        own keep-alive timer)."""
        if not self.transport.is_closing():
            self._await_head()

    # -- helpers -------------------------------------------------------------------------

    def _too_large(self) -> None:
        self.budget.count(Reason.HEADER_TOO_LARGE)
        self.transport.write(too_large_answer(self.limits.max_header_bytes))
        self.close_now()

    # -- request bodies ------------------------------------------------------------------

    def _arm_body_timer(self) -> None:
        now = time.monotonic()
        due = self.rate.next_check(now, self._body_since, self._body_bytes)
        if due != math.inf:
            self._body_timer = self.loop.call_later(due - now, self._body_check)

    def _body_check(self) -> None:
        self._body_timer = None
        if not self._body_pending or self.transport.is_closing():
            return  # whole since (the next body arms the timer again)
        now = time.monotonic()
        reason = self.rate.check(now, self._body_since, self._body_bytes)
        if reason is None:
            self._arm_body_timer()  # in time: look again when it next could break it
        elif self.flow.read_paused and reason is Reason.SLOW_BODY:
            # Its application is not taking the body (uvicorn stopped reading): the client
            # cannot send it; look again later.
            self._body_timer = self.loop.call_later(1.0, self._body_check)
        else:
            self._slow_body(reason, now - self._body_since)

    def _slow_body(self, reason: Reason, elapsed: float) -> None:
        """The request's body broke the rate or its deadline: 408 (when nothing of its
        answer went out) and close; its application sees a disconnect."""
        self.budget.count(reason)
        rate = self.rate
        if reason is Reason.BODY:
            detail = f"the request body was not whole within {rate.total:g} s"
            hint = "the node's bound is --http-body-timeout"
        else:
            detail = (
                f"the request body arrived at {self._body_bytes / max(elapsed, 1e-9):.0f} "
                f"bytes/s; at least {rate.min_rate:g} bytes/s are required"
            )
            hint = "send the body at once; the node's bound is --http-min-body-rate"
        # Debug only: a flood of trickled bodies must not flood the log (each is counted).
        log.debug("HTTP listener: closing a connection: %s", detail)
        if self.abandon_request():
            self.transport.write(timeout_answer(detail, hint))
        self.close_now()

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _await_head(self) -> None:
        self._progress_at = time.monotonic()
        self.waiting_since = self._progress_at
        self._head_bytes = 0
        self._waits += 1
        if self._deadline is None:
            self._deadline = self.loop.call_later(
                self.deadlines.due(Reason.HEAD, 0.0), self._head_expired
            )

    def _head_expired(self) -> None:
        self._deadline = None
        since = self.waiting_since
        if since is None or self.transport.is_closing():
            return  # a request is being read or answered: its answer starts a new wait
        left = self.deadlines.due(Reason.HEAD, since) - time.monotonic()
        if left > 0:  # the wait started after this timer was armed
            self._deadline = self.loop.call_later(left, self._head_expired)
            return
        self.budget.count(Reason.HEAD)
        self.close_now()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
