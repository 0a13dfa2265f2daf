"""Every use of uvicorn's internals, in one place, for one tested range of uvicorn.

The HTTP listeners (the root's gateway, a replica's read API, `python -m mercury.readserve`)
run uvicorn's httptools protocol, but need more than its public interface: bounds on the
request head and a deadline for it (`net/http_bounds.py`), point gets answered inside the
protocol (`reads/fasthttp.py`), HTTPS on `net/tlsconn.py`'s transport. All of that reaches
into uvicorn's private `HttpToolsProtocol` (its parser callbacks, its request-response
`cycle`, its `pipeline`, its `flow` control, its keep-alive timer, its `server_state`) and
into `uvicorn.Server` (its signal capture, its `startup`). Those are not an interface
uvicorn keeps: a minor release may rename any of them, and a listener would then misbehave
quietly (a deadline never armed, an answer written twice). So they are touched here only,
and this module refuses to load under a uvicorn outside `TESTED_RANGE` (the range
`pyproject.toml` pins): moving to a new uvicorn is reading its httptools protocol and its
server against this file, then widening both.

What the others see is `HttpProtocol`, uvicorn's protocol with named hooks (`head_begun`,
`head_bytes`, `head_done`, `body_received`, `message_done`, `malformed`, `response_done`,
`request_answered`, `authenticated`), questions (`answering`, `write_paused`), one action
(`abandon_request`), the scope extension naming the connection (`CONNECTION`), plus, for a
subclass that answers some requests itself, `answer_segment` and `answer_head`. Its `transport` and
`loop` are the connection's, as on any asyncio protocol. And `Server`, uvicorn's server
leaving the signals to its caller, with HTTPS on a transport of the caller's choice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from net.budget import Principal

#: The uvicorn versions this module was checked against (as pinned in pyproject.toml).
TESTED_RANGE = ">=0.55,<0.56"
_LOWEST = (0, 55)
_BELOW = (0, 56)


class UnsupportedUvicorn(ImportError):
    """uvicorn's version is outside the range this module's use of its internals was tested
    with."""


def check_version(version: str) -> None:
    """Raise `UnsupportedUvicorn` unless `version` (uvicorn's ``__version__``) is in
    `TESTED_RANGE`."""
    m = re.match(r"(\d+)\.(\d+)", version)
    got = (int(m.group(1)), int(m.group(2))) if m else None
    if got is None or not _LOWEST <= got < _BELOW:
        raise UnsupportedUvicorn(
            f"Mercury's HTTP listeners need uvicorn {TESTED_RANGE} (net.uvicorn_http uses "
            f"uvicorn's private httptools protocol, tested with that range only), but uvicorn "
            f"{version} is installed: install 'uvicorn[standard]{TESTED_RANGE}', or check "
            "net/uvicorn_http.py against the new uvicorn and widen TESTED_RANGE and the pin"
        )


check_version(uvicorn.__version__)

# Only now: under another version these may not even exist.
from uvicorn.protocols.http.httptools_impl import (  # noqa: E402
    STATUS_LINE as _STATUS_LINE,
)
from uvicorn.protocols.http.httptools_impl import (  # noqa: E402
    HttpToolsProtocol,
)

log = logging.getLogger(__name__)

#: uvicorn's status lines (b"HTTP/1.1 200 OK\r\n"), by status: answers made outside its
#: request-response cycle use the very bytes it writes.
STATUS_LINE: dict[int, bytes] = _STATUS_LINE


class _Answered:
    """Stands for the request-response cycle of a request the protocol answered itself:
    uvicorn's later callbacks (`on_body`, `on_message_complete`, `connection_lost`,
    `shutdown`) see a complete response and leave it alone."""

    response_complete = True
    disconnected = False
    keep_alive = True

    class message_event:  # mirrors the cycle's attribute
        @staticmethod
        def set() -> None:
            return None


_ANSWERED: Any = _Answered()


#: The ASGI scope extension holding the `HttpProtocol` a request came on.
CONNECTION = "mercury.connection"


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with named hooks (module docstring). The hooks do
    nothing here; `net.http_bounds` overrides them to bound the connection, a subclass
    setting `answers_heads` (`reads.fasthttp`) answers requests itself."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    #: `answer_segment` and `answer_head` may answer requests; uvicorn then builds a
    #: request's ASGI scope only once its head is complete and not answered here.
    answers_heads = False
    #: The parser is inside a request (from its first byte to its end): segments then go
    #: to it, never to `answer_segment`.
    _in_message = False
    #: Between a request's first byte and its end (any protocol, unlike `_in_message`).
    _mid_request = False
    #: The server drains (`Server.drain`): every answer closes its connection.
    _draining = False
    _drain_timer: asyncio.TimerHandle | None = None

    # -- hooks (for the subclasses) --------------------------------------------------------

    def head_begun(self) -> None:
        """The parser met the first byte of a request."""

    def head_bytes(self, n: int) -> None:
        """`n` bytes of the request head were parsed (its target, or a header line). An
        exception raised here is taken for a malformed request (`malformed`)."""

    def head_done(self) -> None:
        """The request's head is complete (its body, if any, is to come)."""

    def body_received(self, n: int) -> None:
        """`n` bytes of the request's body were parsed (also those of a body whose answer
        went out early, which uvicorn discards)."""

    def message_done(self) -> None:
        """The whole request (head and body) was received."""

    def malformed(self, msg: str) -> bool:
        """uvicorn is about to answer 400 (`msg`) and close; True: handled here instead."""
        return False

    def response_done(self, pipelined: bool) -> None:
        """uvicorn finished an answer (`pipelined`: a request already read starts now)."""

    def request_answered(self) -> None:
        """A request was answered by this protocol itself (`answer_segment`, `answer_head`)
        and the connection stays open."""

    def authenticated(self, principal: Principal) -> None:
        """The application authenticated a request of this connection as `principal`
        (`net.http_bounds.authenticated`, through the scope's `CONNECTION` extension)."""

    def streaming(self) -> Principal | None:
        """The application answers this connection's request with an endless stream (a
        watch, `net.http_bounds.streaming`): the principal the connection holds its slot
        for (None: no budget here)."""
        return None

    def answer_segment(self, data: bytes) -> bytes | None:
        """With `answers_heads`: the whole answer to `data`, a segment received between
        requests with nothing being answered, when it is exactly one request answered
        here; None sends it to the parser."""
        return None

    def answer_head(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], keep_alive: bool
    ) -> bytes | None:
        """With `answers_heads`: the whole answer to the request whose head is complete
        (nothing of the connection's being answered), or None for uvicorn's cycle."""
        return None

    # -- questions ---------------------------------------------------------------------

    def answering(self) -> bool:
        """An earlier request of this connection is still being answered, or read and
        queued behind one (pipelined)."""
        cycle = self.cycle
        return (cycle is not None and not cycle.response_complete) or bool(self.pipeline)

    def write_paused(self) -> bool:
        """The transport is over its high-water mark (the client is not taking answers)."""
        return bool(self.flow.write_paused)

    def default_headers(self) -> list[tuple[bytes, bytes]]:
        """The server's default answer headers (`date`, `server`): a new list each time
        `date` changes."""
        return self.server_state.default_headers

    def abandon_request(self) -> bool:
        """The request being read is given up (its body broke a bound): its application
        sees a disconnect and whatever it sends is dropped. True when nothing of its
        answer was sent yet (the bound's own answer may be)."""
        cycle = self.cycle
        if cycle is None or cycle is _ANSWERED or cycle.response_complete:
            return not self.answering()
        started = bool(cycle.response_started)
        cycle.disconnected = True
        cycle.message_event.set()
        return not started

    def forget(self) -> None:
        """Take this connection out of uvicorn's own set (closed or refused by the bounds;
        uvicorn's shutdown no longer waits for it)."""
        self.connections.discard(self)

    # -- uvicorn's callbacks, through the hooks ---------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.answers_heads and not self._in_message and not self._draining:
            if self.answering() or self.flow.write_paused or self.transport.is_closing():
                reply = None
            else:
                reply = self.answer_segment(data)
            if reply is not None:
                self._unset_keepalive_if_required()  # as uvicorn's data_received does first
                self.transport.write(reply)
                self._answered_here()
                self.request_answered()
                return
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        if not self.malformed(msg):
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        self._mid_request = True
        if self._drain_timer is not None:
            self._drain_timer.cancel()  # its request came: answered, then closed
            self._drain_timer = None
        self.head_begun()
        if not self.answers_heads:
            super().on_message_begin()
            return
        self._in_message = True
        # uvicorn builds the request's ASGI scope here; a request answered in the protocol
        # never needs one, so it is built in on_headers_complete when it is.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_url(self, url: bytes) -> None:
        self.head_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.head_done()
        if self.answers_heads:
            if self._answer_head():
                return
            url, headers, expect = self.url, self.headers, self.expect_100_continue
            super().on_message_begin()  # the scope, as uvicorn makes it (it resets these)
            self.url, self.expect_100_continue = url, expect
            self.headers = self.scope["headers"] = headers
        # How the application names the connection its request came on (`authenticated`).
        self.scope["extensions"] = {CONNECTION: self}  # type: ignore[dict-item]
        super().on_headers_complete()
        if self._draining and self.cycle is not None and self.cycle is not _ANSWERED:
            self.cycle.keep_alive = False  # answered with `connection: close`, then closed

    def on_body(self, body: bytes) -> None:
        self.body_received(len(body))
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._mid_request = False
        self.message_done()
        self._in_message = False
        if self.cycle is not _ANSWERED:
            super().on_message_complete()

    # -- answers made here ----------------------------------------------------------------

    def _answer_head(self) -> bool:
        if self.answering() or self.flow.write_paused or self.transport.is_closing():
            return False  # the cycle answers in order, and waits for a slow client
        parser = self.parser
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        keep_alive = keep_alive and not self._draining
        try:
            reply = self.answer_head(parser.get_method(), self.url, self.headers, keep_alive)
        except Exception:
            # Never uvicorn's 400 for our failure (an exception out of a parser callback
            # is taken for a malformed request): the ASGI path answers it as it would.
            log.exception("answering a request in the protocol failed; answering through ASGI")
            return False
        if reply is None:
            return False
        self.transport.write(reply)
        self._answered_here()
        if not keep_alive:
            self.transport.close()
        else:
            self.request_answered()
        return True

    def shutdown(self) -> None:
        """The server stops. Plainly (uvicorn's way) an idle keep-alive connection is
        closed at once, which races a request its client is sending that moment: the
        client sees a reset. Draining (`Server.drain`), an idle connection instead stays
        open for its next request, which is answered with ``connection: close``; one
        idle through the whole grace is closed then (the race remains only for it)."""
        grace = getattr(self.server_state, "drain_grace", None)
        if grace is None:
            super().shutdown()
            return
        self._draining = True
        if self._mid_request or (self.cycle is not None and not self.cycle.response_complete):
            if self.cycle is not None and self.cycle is not _ANSWERED:
                self.cycle.keep_alive = False
            return
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        self._drain_timer = self.loop.call_later(grace, self._close_idle)

    def _close_idle(self) -> None:
        self._drain_timer = None
        if not self._mid_request and not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # a request already read starts now
        super().on_response_complete()
        self.response_done(pipelined)

    def _answered_here(self) -> None:
        self.cycle = _ANSWERED
        self.server_state.total_requests += 1


#: Starts a server's HTTPS listener on `sockets` with `context` (`Server.tls_listener`).
TlsStart = Callable[["Server", list[socket.socket], ssl.SSLContext], Awaitable[None]]


class Server(uvicorn.Server):
    """uvicorn's server without its own signal capture (it re-raises SIGTERM after serving,
    which would skip the caller's cleanup: the caller's loop handlers set `should_exit`
    instead), serving HTTPS through `tls_listener` when that names one."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()

    #: `drain` was asked for (the stop is a hand-over's).
    draining = False

    def drain(self, grace: float, bound: float) -> None:
        """Stop gracefully: stop accepting, answer every request in flight, give each idle
        keep-alive connection `grace` seconds for one more request (answered with
        ``connection: close``), and stop waiting after `bound` seconds in all."""
        self.server_state.drain_grace = grace  # type: ignore[attr-defined]
        self.config.timeout_graceful_shutdown = max(1, round(bound))
        self.draining = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if not self.draining:
            await super().shutdown(sockets)
            return
        # uvicorn's shutdown, polling every 5 ms instead of its fixed 100 ms sleeps: after
        # a root's hand-over every writer waits for this process to end.
        state = self.server_state
        # Logged just before this stops accepting and tells each connection (no await in
        # between): from this line on, every answer closes its connection.
        log.info("draining %d connections", len(state.connections))
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(state.connections):
            connection.shutdown()
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                while (state.connections or state.tasks) and not self.force_exit:
                    await asyncio.sleep(0.005)
        except TimeoutError:
            log.error("drain bound reached: cancelling %d requests", len(state.tasks))
            for t in state.tasks:
                t.cancel(msg="drain bound reached")
        if not self.force_exit:
            await self.lifespan.shutdown()

    def tls_listener(self) -> TlsStart | None:
        """What starts the HTTPS listener instead of the loop's TLS layer (None: the
        loop's, as uvicorn does)."""
        return None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        ctx = self.config.ssl
        start = self.tls_listener() if ctx is not None and sockets else None
        if start is None or ctx is None or not sockets:
            await super().startup(sockets)
            return
        await start(self, sockets, ctx)


async def start_tls_server(
    server: uvicorn.Server,
    sockets: list[socket.socket],
    context: ssl.SSLContext,
    handshake_timeout: float,
    max_handshakes: int,
    share: float = 1.0,
) -> None:
    """`uvicorn.Server.startup` serving `sockets` over `net.tlsconn.TlsServer` (TLS on the
    socket, driven by readiness) instead of the loop's TLS layer: what uvicorn's own
    startup does, with that server in place of `loop.create_server`'s."""
    from net.tlsconn import TlsServer

    await server.lifespan.startup()  # (lifespan="off": nothing, kept for uvicorn's order)
    config, loop = server.config, asyncio.get_running_loop()

    def create_protocol() -> asyncio.Protocol:
        return config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=server.server_state, app_state=server.lifespan.state
        )

    tls = [
        TlsServer(loop, create_protocol, s, context, handshake_timeout, max_handshakes, share)
        for s in sockets
    ]
    server.servers = tls  # type: ignore[assignment]
    server.started = True


def protocol_class(config: uvicorn.Config) -> type[asyncio.Protocol]:
    """The HTTP protocol class a loaded `config` serves with (its ``http=``)."""
    return config.http_protocol_class
