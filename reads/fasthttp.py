"""The HTTP read server's protocol: point gets answered in the parser's callback.

uvicorn's httptools protocol builds an ASGI scope, a request-response cycle and an asyncio
task for every request, and the answer then crosses two `await send(...)`s: on a point get
that framework work costs more than the read itself. `FastReadProtocol` is that same
protocol with one shortcut: when a request's head is complete and it is a plain
`GET|HEAD /v1/kv/{key}` (no body, no `Expect`, no query string, nothing of the connection's
still being answered, the transport taking writes), the answer is made right there
(`reads.pointget.point_get`, the very function the ASGI app's point get calls) and written
to the transport in one call, with uvicorn's own status line and default headers (`date`,
`server`) and its `connection: close` rule. Every other request — and any point get that
does not qualify — goes through uvicorn to the ASGI app as before. So the answers are the
same bytes on both paths; `tests/reads/test_fasthttp.py` compares them.

With `--read-auth`, the shortcut is taken only for a request whose bearer token is known and
may read the key; every refusal (401, 403) is the ASGI middleware's own answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from reads import fastget, pointget, readstats
from reads.auth import TokenIndex, allowed, bearer
from store.format import MAX_KEY
from store.layout import K_LAST_SEQ
from store.store import Store

log = logging.getLogger(__name__)
_KV = pointget.KV_PREFIX
_OBSERVE = pointget.OBSERVE
_http_value = fastget.HTTP_VALUE
_http_request = fastget.HTTP_REQUEST
_http_get = fastget.HTTP_GET
#: Request headers that make a point get leave the shortcut (a body, a 100-continue, an
#: upgrade): uvicorn's full cycle handles them.
_SLOW_HEADERS = frozenset((b"content-length", b"transfer-encoding", b"expect", b"upgrade"))


class _Answered:
    """Stands for the request-response cycle of a request answered by the shortcut: the
    base protocol's later callbacks (`on_body`, `on_message_complete`, `connection_lost`,
    `shutdown`) see a complete response and leave it alone."""

    response_complete = True
    disconnected = False
    keep_alive = True

    class message_event:  # mirrors the cycle's attribute
        @staticmethod
        def set() -> None:
            return None


_ANSWERED: Any = _Answered()


class FastReadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the point-get shortcut (module docstring). A
    subclass per server binds the store (`fast_read_protocol`)."""

    store: Store
    tokens: TokenIndex | None = None
    #: The parser is inside a request (from its first byte to its end): segments then go
    #: to it, never to the pre-parse.
    _in_message = False

    def data_received(self, data: bytes) -> None:
        if not self._in_message and self.tokens is None:
            # A whole plain point get in one segment between requests: answered before
            # the parser sees it (`fastget.http_request` accepts only requests the parser
            # takes and that need nothing but the key); any doubt goes to the parser.
            got = _http_request(data, MAX_KEY)
            if got is not None and self._answer_plain(got[0], got[1]):
                return
        super().data_received(data)

    def _answer_plain(self, key: bytes, head_only: bool) -> bool:
        """Answer a pre-parsed keep-alive point get that hits an inline value; False (the
        parser then takes the request) for anything else."""
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            return False
        transport: asyncio.Transport = self.transport
        if self.flow.write_paused or transport.is_closing():
            return False
        t0 = time.perf_counter()
        store = self.store
        reply = _http_get(
            store.env, store.dbs.data, store.dbs.meta, K_LAST_SEQ, self._head_200(), key, head_only
        )
        if reply is None:
            return False
        readstats.note_read(key)
        _OBSERVE(time.perf_counter() - t0)
        self._unset_keepalive_if_required()  # as uvicorn's data_received does first
        transport.write(reply)
        self.cycle = _ANSWERED
        self.server_state.total_requests += 1
        self.request_answered()
        return True

    def request_answered(self) -> None:
        """After each answer of the shortcut. The listener always runs this protocol under
        `net/http_bounds.py`, whose override arms the deadline for the next request head
        (closing an idle keep-alive connection): uvicorn's own timer is armed only after
        the answers it writes itself."""

    def on_message_begin(self) -> None:
        self._in_message = True
        # uvicorn builds the request's ASGI scope here; a point get answered by the
        # shortcut never needs one, so it is built in on_headers_complete when it is.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_headers_complete(self) -> None:
        if self._shortcut():
            return
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()  # the scope, as uvicorn makes it (it resets these three)
        self.url, self.expect_100_continue = url, expect
        self.headers = self.scope["headers"] = headers
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = False
        if self.cycle is not _ANSWERED:
            super().on_message_complete()

    def _shortcut(self) -> bool:
        try:
            return self._answer()
        except Exception:
            # Never uvicorn's 400 for our failure (an exception out of a parser callback
            # is taken for a malformed request): the ASGI path answers it as it would.
            log.exception("point-get shortcut failed; answering through ASGI")
            return False

    def _answer(self) -> bool:
        url: bytes = self.url
        if not url.startswith(_KV) or b"?" in url or b"#" in url:
            return False
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            return False  # an earlier request of this connection is still being answered
        if self.flow.write_paused or self.transport.is_closing():
            return False  # the client is not taking replies: the cycle waits for it
        parser = self.parser
        method = parser.get_method()
        if method != b"GET" and method != b"HEAD":
            return False
        headers: list[tuple[bytes, bytes]] = self.headers
        inm: bytes | None = None
        for name, value in headers:
            if name in _SLOW_HEADERS:
                return False
            if name == b"if-none-match" and inm is None:
                inm = value
        key = pointget.key_of(url)
        if self.tokens is not None:
            token = bearer({"headers": headers})
            spaces = self.tokens.keyspaces(token) if token is not None else None
            if spaces is None or not allowed(spaces, key):
                return False  # the middleware answers the refusal
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        head_only = method == b"HEAD"
        reply = None
        if inm is None and 1 <= len(key) <= MAX_KEY:
            # A hit on an inline value: the whole answer from the stored record, CRC checked
            # (reads/fastget.py); anything else is point_get's.
            t0 = time.perf_counter()
            rec, applied = self.store.record(key)
            if rec is not None:
                reply = _http_value(self._head_200(), key, rec, applied, head_only, not keep_alive)
                if reply is not None:
                    readstats.note_read(key)
                    _OBSERVE(time.perf_counter() - t0)
        if reply is None:
            status, reply_headers, body = pointget.point_get(self.store, key, inm, head_only)
            out = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                out += (name, b": ", value, b"\r\n")
            for name, value in reply_headers:
                out += (name, b": ", value, b"\r\n")
            if not keep_alive:
                out.append(b"connection: close\r\n")
            out.append(b"\r\n")
            out.append(body)
            reply = b"".join(out)
        transport: asyncio.Transport = self.transport
        transport.write(reply)
        self.cycle = _ANSWERED
        self.server_state.total_requests += 1
        if not keep_alive:
            transport.close()
        else:
            self.request_answered()
        return True

    def _head_200(self) -> bytes:
        """uvicorn's status line of a 200 and its default headers (`date` changes every
        second: uvicorn then puts a new list in `server_state`)."""
        defaults = self.server_state.default_headers
        cached = _HEAD_200[0]
        if cached[0] is not defaults:
            head = STATUS_LINE[200] + b"".join(n + b": " + v + b"\r\n" for n, v in defaults)
            cached = _HEAD_200[0] = (defaults, head)
        return cached[1]


#: (uvicorn's default-headers list, the 200 head made of it) — one per process.
_HEAD_200: list[tuple[object, bytes]] = [(None, b"")]


def fast_read_protocol(store: Store, tokens: TokenIndex | None = None) -> type[FastReadProtocol]:
    """A `FastReadProtocol` class serving point gets of `store`; with `tokens`
    (`--read-auth`), only for requests whose token may read the key. Served under
    `net.http_bounds` (its `uvicorn_options` wraps it): the bounds close idle
    connections, this class alone never does."""
    return type("BoundFastReadProtocol", (FastReadProtocol,), {"store": store, "tokens": tokens})
