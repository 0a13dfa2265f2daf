"""The cache node's HTTP protocol: a hit answered in the parser's callback.

As a replica's (`reads/fasthttp.py`): uvicorn builds an ASGI scope, a cycle and a task for
every request, which costs more than a hit itself. A plain `GET|HEAD /v1/kv/{key}` (no
query, no body, no `If-None-Match`) of a key the cache holds with a value is answered
here from the same headers the ASGI app sends (`cache.http.hit_headers`), after uvicorn's
status line and default headers; a miss, a negative entry, a lagging refusal and anything
else go through uvicorn to `cache.http.CacheApp` as before.
"""

from __future__ import annotations

from cache.http import CacheApp, hit_headers
from net.uvicorn_http import STATUS_LINE, HttpProtocol
from reads.pointget import KV_PREFIX, key_of
from store.format import MAX_KEY

#: Request headers that leave the shortcut (as the replica's).
_SLOW_HEADERS = frozenset(
    (b"content-length", b"transfer-encoding", b"expect", b"upgrade", b"if-none-match")
)


class CacheFastProtocol(HttpProtocol):
    """uvicorn's protocol with the hit shortcut; a subclass per server binds the app."""

    app_: CacheApp
    answers_heads = True

    def answer_head(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], keep_alive: bool
    ) -> bytes | None:
        if not url.startswith(KV_PREFIX) or b"?" in url or b"#" in url:
            return None
        if method != b"GET" and method != b"HEAD":
            return None
        for name, _value in headers:
            if name in _SLOW_HEADERS:
                return None
        app = self.app_
        node = app.node
        if app.refuse_when_lagging and node.lagging():
            return None
        key = key_of(url)
        held = node.state.held.get(key)
        if held is None or held.negative or not 1 <= len(key) <= MAX_KEY:
            return None
        got = node.store.get(key)
        if got is None or got[1] is None:
            return None
        node.state.lookup(key)  # counted and promoted as the ASGI path's hit is
        value = got[1]
        out = [STATUS_LINE[200]]
        for name, v in self.default_headers():
            out += (name, b": ", v, b"\r\n")
        for name, v in hit_headers(held.version, held.read_seq, node.state.applied, "hit"):
            out += (name, b": ", v, b"\r\n")
        out += (b"content-length: ", b"%d" % len(value), b"\r\n")
        if not keep_alive:
            out.append(b"connection: close\r\n")
        out.append(b"\r\n")
        if method == b"GET":
            out.append(value)
        return b"".join(out)


def cache_fast_protocol(app: CacheApp) -> type[CacheFastProtocol]:
    """A `CacheFastProtocol` class answering hits of `app`'s node."""
    return type("BoundCacheFastProtocol", (CacheFastProtocol,), {"app_": app})
