"""The cache node's HTTP read API: a raw ASGI app (docs/api.md, "Cache nodes").

The same point and bulk reads as a replica's (`GET|HEAD /v1/kv/{key}`, `POST
/v1/get_bulk`), with the same headers, plus ``X-Mercury-Cache`` (hit, negative_hit, miss).
``X-Mercury-Seq`` is the seq the answer was read at on the source; ``X-Mercury-Applied-Seq``
the cache's applied seq. Ranges and watches need every key of a range, which a cache does
not hold: `GET /v1/range` and `/v1/watch` answer 421 naming the cache's sources — read
ranges from a replica. A miss that cannot be answered (no source, source behind) is 503
with Retry-After; so is every read while the cache lags past --max-lag with
--refuse-when-lagging.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cache.node import CacheNode, TooLarge, Unavailable
from core import strictjson
from core.problems import NO_SUCH_KEY, NO_SUCH_ROUTE, PROBLEM_JSON, no_route_detail
from reads import bulkbody
from reads.pointget import if_none_match, key_of
from reads.problems import problem_body
from replicator.invalidation import MAX_FETCH_KEYS
from store.format import MAX_KEY

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
_PROBLEM = PROBLEM_JSON.encode()
_JSON = b"application/json"
#: Seconds a client is told to wait before retrying a 503.
RETRY_AFTER = b"1"


class CacheApp:
    """ASGI app over a `CacheNode`."""

    def __init__(self, node: CacheNode, *, refuse_when_lagging: bool = False) -> None:
        self.node = node
        self.refuse_when_lagging = refuse_when_lagging

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = scope.get("raw_path") or scope["path"].encode()
        path = raw.split(b"?", 1)[0]
        method = scope["method"]
        if path.startswith(b"/v1/kv/"):
            if method not in ("GET", "HEAD"):
                await _problem(
                    send,
                    405,
                    "read-only",
                    "cache nodes serve reads only; nothing was changed",
                    [(b"allow", b"GET, HEAD")],
                    hint="write through the gateway on the root (PUT /v1/kv/{key} there)",
                )
                return
            if not await self._lag_ok(send):
                return
            await self._point(key_of(path), scope, send, head=method == "HEAD")
        elif path == b"/v1/get_bulk" and method == "POST":
            if not await self._lag_ok(send):
                return
            await self._bulk(scope, receive, send)
        elif path in (b"/v1/range", b"/v1/watch"):
            sources = ", ".join(f"{h}:{p}" for h, p in self.node.sources)
            await _problem(
                send,
                421,
                "range-on-cache",
                f"a cache node holds only the keys it was asked for, so it serves no "
                f"{path.decode()[4:]} reads; its sources are {sources} (replication "
                "addresses): read ranges and watches from a replica",
                title="Range reads are served by replicas",
            )
        elif path == b"/v1/status" and method == "GET":
            await _send(send, 200, orjson.dumps(self.node.status()), [(b"content-type", _JSON)])
        elif path == b"/healthz" and method == "GET":
            body = {"status": "ok", "role": "cache", "seq": self.node.state.applied}
            await _send(send, 200, orjson.dumps(body), [(b"content-type", _JSON)])
        elif path == b"/metrics" and method == "GET":
            await _send(
                send, 200, generate_latest(), [(b"content-type", CONTENT_TYPE_LATEST.encode())]
            )
        else:
            await _problem(
                send,
                404,
                NO_SUCH_ROUTE,
                no_route_detail(method, path.decode("utf-8", "replace")),
                title="No such route",
            )

    async def _lag_ok(self, send: Send) -> bool:
        if not (self.refuse_when_lagging and self.node.lagging()):
            return True
        await _problem(
            send,
            503,
            "cache-lagging",
            f"this cache is more than {self.node.max_lag:g} s behind its root (lag "
            f"{self.node.lag()}); it serves nothing until it catches up",
            [(b"retry-after", RETRY_AFTER)],
            title="Cache lagging",
        )
        return False

    async def _point(self, key: bytes, scope: dict[str, Any], send: Send, head: bool) -> None:
        if not 1 <= len(key) <= MAX_KEY:
            await _problem(send, 400, "invalid-read", f"key must be 1 to {MAX_KEY} bytes")
            return
        try:
            (a,) = await self.node.get([key])
        except Unavailable as err:
            await _unavailable(send, str(err))
            return
        applied = self.node.state.applied
        common = hit_headers(None, a.read_seq, applied, a.served)
        if a.value is None:
            text = key.decode("utf-8", "backslashreplace")
            await _problem(
                send, 404, NO_SUCH_KEY, f"key {text!r} is not stored", common, title="No such key"
            )
            return
        etag = b'"%d"' % a.version
        headers = hit_headers(a.version, a.read_seq, applied, a.served)
        inm = if_none_match(scope["headers"])
        if inm is not None and (
            inm.strip() == b"*" or etag in [v.strip() for v in inm.split(b",")]
        ):
            await _send(send, 304, b"", headers, length=False)
            return
        headers.append((b"content-length", b"%d" % len(a.value)))
        await _send(send, 200, b"" if head else a.value, headers, length=False)

    async def _bulk(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        length = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value.decode("latin-1")
        try:
            raw = await bulkbody.read(receive, length)
        except bulkbody.BodyRefused as err:
            await _problem(
                send, err.status, "invalid-read", err.detail, [(b"connection", b"close")]
            )
            return
        try:
            body = bulkbody.decode(raw)
            text_keys = [k.encode() for k in body.keys]
            b64_keys = [base64.b64decode(k, validate=True) for k in body.keys_b64]
        except (strictjson.AmbiguousJsonError, ValueError, binascii.Error) as err:
            await _problem(send, 400, "invalid-read", f"body: {err}")
            return
        keys = [*text_keys, *b64_keys]
        if len(keys) > MAX_FETCH_KEYS:
            await _problem(
                send,
                400,
                "invalid-read",
                f"at most {MAX_FETCH_KEYS} keys per get_bulk on a cache node, got {len(keys)}",
            )
            return
        if any(not 1 <= len(k) <= MAX_KEY for k in keys):
            await _problem(send, 400, "invalid-read", f"keys must be 1 to {MAX_KEY} bytes")
            return
        try:
            answers = await self.node.get(keys)
        except Unavailable as err:
            await _unavailable(send, str(err))
            return
        except TooLarge as err:
            await _problem(send, 413, "read-too-large", str(err), title="Reply too large")
            return
        values: dict[str, str | None] = {}
        values_b64: dict[str, str | None] = {}
        for name, a in zip(body.keys, answers[: len(text_keys)], strict=True):
            if a.value is None:
                values[name] = None
            else:
                try:
                    values[name] = a.value.decode()
                except UnicodeDecodeError:
                    values_b64[name] = base64.b64encode(a.value).decode()
        for name, a in zip(body.keys_b64, answers[len(text_keys) :], strict=True):
            values_b64[name] = None if a.value is None else base64.b64encode(a.value).decode()
        doc: dict[str, Any] = {"values": values}
        if values_b64:
            doc["values_b64"] = values_b64
        # The oldest read seq among the answers: every value is at least that recent.
        low = min((a.read_seq for a in answers), default=self.node.state.applied)
        await _send(
            send,
            200,
            orjson.dumps(doc),
            [
                (b"content-type", _JSON),
                (b"x-mercury-seq", b"%d" % low),
                (b"x-mercury-applied-seq", b"%d" % self.node.state.applied),
            ],
        )


def hit_headers(
    version: int | None, read_seq: int, applied: int, served: str
) -> list[tuple[bytes, bytes]]:
    """The headers of a point get's answer (`version` None: an absence), before its
    content-length: this app's and the fast path's (`cache.fasthttp`) alike."""
    common = [
        (b"x-mercury-cache", served.encode()),
        (b"x-mercury-seq", b"%d" % read_seq),
        (b"x-mercury-applied-seq", b"%d" % applied),
    ]
    if version is None:
        return common
    return [
        (b"content-type", b"application/octet-stream"),
        (b"etag", b'"%d"' % version),
        (b"x-mercury-version", b"%d" % version),
        *common,
    ]


async def _send(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]], length: bool = True
) -> None:
    if length:
        headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _problem(
    send: Send,
    status: int,
    slug: str,
    detail: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    **extra: Any,
) -> None:
    body = problem_body(status, slug, detail, **extra)
    await _send(send, status, body, [(b"content-type", _PROBLEM), *(headers or [])])


async def _unavailable(send: Send, detail: str) -> None:
    await _problem(
        send,
        503,
        "source-unavailable",
        f"this cache does not hold the key and cannot fetch it now: {detail}",
        [(b"retry-after", RETRY_AFTER)],
        title="Source unavailable",
        hint="retry after the Retry-After delay; hits are still served",
    )
