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

import time

from net.uvicorn_http import STATUS_LINE, HttpProtocol
from reads import fastget, pointget, readstats
from reads.auth import TokenIndex, allowed, bearer
from store.format import MAX_KEY
from store.layout import K_LAST_SEQ
from store.store import Store

_KV = pointget.KV_PREFIX
_OBSERVE = pointget.OBSERVE
_http_value = fastget.HTTP_VALUE
_http_request = fastget.HTTP_REQUEST
_http_get = fastget.HTTP_GET
#: Request headers that make a point get leave the shortcut (a body, a 100-continue, an
#: upgrade): uvicorn's full cycle handles them.
_SLOW_HEADERS = frozenset((b"content-length", b"transfer-encoding", b"expect", b"upgrade"))


class FastReadProtocol(HttpProtocol):
    """uvicorn's httptools protocol (through `net.uvicorn_http`, which writes the answers
    made here, under uvicorn's rules) with the point-get shortcut (module docstring). A
    subclass per server binds the store (`fast_read_protocol`)."""

    store: Store
    tokens: TokenIndex | None = None
    answers_heads = True

    def answer_segment(self, data: bytes) -> bytes | None:
        """A whole plain keep-alive point get in one segment between requests that hits an
        inline value: answered before the parser sees it (`fastget.http_request` accepts
        only requests the parser takes and that need nothing but the key); any doubt
        (None) goes to the parser."""
        if self.tokens is not None:
            return None
        got = _http_request(data, MAX_KEY)
        if got is None:
            return None
        key, head_only = got
        t0 = time.perf_counter()
        store = self.store
        reply = _http_get(
            store.env, store.dbs.data, store.dbs.meta, K_LAST_SEQ, self._head_200(), key, head_only
        )
        if reply is None:
            return None
        readstats.note_read(key)
        _OBSERVE(time.perf_counter() - t0)
        return reply

    def answer_head(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], keep_alive: bool
    ) -> bytes | None:
        """The answer to a plain point get whose head the parser completed (None: the ASGI
        app answers it)."""
        if not url.startswith(_KV) or b"?" in url or b"#" in url:
            return None
        if method != b"GET" and method != b"HEAD":
            return None
        inm: bytes | None = None
        for name, value in headers:
            if name in _SLOW_HEADERS:
                return None
            if name == b"if-none-match" and inm is None:
                inm = value
        key = pointget.key_of(url)
        if self.tokens is not None:
            token = bearer({"headers": headers})
            spaces = self.tokens.keyspaces(token) if token is not None else None
            if spaces is None or not allowed(spaces, key):
                return None  # the middleware answers the refusal
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
            for name, value in self.default_headers():
                out += (name, b": ", value, b"\r\n")
            for name, value in reply_headers:
                out += (name, b": ", value, b"\r\n")
            if not keep_alive:
                out.append(b"connection: close\r\n")
            out.append(b"\r\n")
            out.append(body)
            reply = b"".join(out)
        return reply

    def _head_200(self) -> bytes:
        """uvicorn's status line of a 200 and its default headers (`date` changes every
        second: uvicorn then puts a new list in `server_state`)."""
        defaults = self.default_headers()
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
    connections (its `request_answered` arms the deadline for the next request head after
    each answer made here), this class alone never does."""
    return type("BoundFastReadProtocol", (FastReadProtocol,), {"store": store, "tokens": tokens})
