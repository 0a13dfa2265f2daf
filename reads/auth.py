"""Read authentication (`--read-auth`): every HTTP read names a bearer token, and sees only
the keyspaces that token may read.

Which reads: ``GET|HEAD /v1/kv/{key}``, ``POST /v1/get_bulk``, ``GET /v1/range`` (pages
and NDJSON) and ``GET /v1/watch``. Everything else (health, metrics, status, the root's
writes and admin routes, which check their own tokens) passes through untouched.

- no token, or one the node does not know (or expired): 401;
- a point get or a get_bulk naming a key outside the token's keyspaces: 403 (the caller
  named the key itself; the answer says nothing about whether it exists);
- a range or watch: narrowed to the token's keyspace when it reaches past it (a range
  over ``app/`` read with a token for ``app/a/`` returns the keys of ``app/a/`` only, and
  its cursors name only those keys); 403 when it touches none of the token's keyspaces, or
  more than one of them (read each keyspace in its own request).

Tokens and their keyspaces come from a `TokenIndex`; `AclTokenIndex` reads the replicated
ACL document (`acl`), so producers' and consumers' tokens work on every replica and
a revoked token stops working as soon as the change is applied.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, quote_from_bytes, unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from acl.model import DOC_NAME, Acl, Consumer, Producer
from acl.tokens import hash_token
from reads.problems import PROBLEM_JSON, problem_body
from reads.ranges import prefix_end
from store.store import Store

KV_PREFIX = b"/v1/kv/"
#: A get_bulk body is read whole to check its keys; the read API's own bound is far below.
MAX_BULK_BODY = 16 << 20


class TokenIndex(Protocol):
    """Which keyspaces a bearer token may read."""

    def keyspaces(self, token: str) -> tuple[bytes, ...] | None:
        """The token's keyspaces; None when the token is unknown or expired."""


class AclTokenIndex:
    """Tokens of the replicated ACL document in `store` (producers read their own
    keyspaces, consumers theirs); rebuilt when the document's version changes."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._version = -1
        self._index: dict[str, tuple[tuple[bytes, ...], int | None]] = {}

    def _refresh(self) -> None:
        doc = self.store.get_doc(DOC_NAME)
        version = 0 if doc is None else doc.seq
        if version == self._version:
            return
        index: dict[str, tuple[tuple[bytes, ...], int | None]] = {}
        if doc is not None:
            acl = Acl.from_json(json.loads(doc.body))
            holders: list[Consumer | Producer] = [
                *acl.consumers.values(),
                *acl.producers.values(),
            ]
            for h in holders:
                spaces = tuple(k.encode() for k in h.keyspaces)
                for info in h.tokens.values():
                    index[info.hash] = (spaces, info.expires_us)
        self._index, self._version = index, version

    def keyspaces(self, token: str) -> tuple[bytes, ...] | None:
        """See `TokenIndex`."""
        self._refresh()
        found = self._index.get(hash_token(token))
        if found is None:
            return None
        spaces, expires_us = found
        if expires_us is not None and self.clock() * 1e6 >= expires_us:
            return None
        return spaces


def bearer(scope: Scope) -> str | None:
    """The bearer token of a request, if any."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = bytes(value).decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def allowed(spaces: tuple[bytes, ...], key: bytes) -> bool:
    """Whether `key` lies in one of `spaces`."""
    return any(key.startswith(s) for s in spaces)


def narrow(
    spaces: tuple[bytes, ...], start: bytes, end: bytes | None
) -> tuple[bytes, bytes | None] | None:
    """The part of [start, end) inside the token's keyspaces when that is one keyspace's
    (None: it touches none, or several)."""
    hits = []
    for s in spaces:
        s_end = prefix_end(s)
        lo = max(start, s)
        hi = s_end if end is None else (end if s_end is None else min(end, s_end))
        if hi is None or lo < hi:
            hits.append((lo, hi))
    return hits[0] if len(hits) == 1 else None


class ReadAuth:
    """ASGI middleware enforcing read tokens in front of a read API (see module doc)."""

    def __init__(self, app: ASGIApp, index: TokenIndex) -> None:
        self.app = app
        self.index = index

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        raw = scope.get("raw_path") or quote(scope["path"]).encode()
        path = raw.split(b"?", 1)[0]
        kind = _kind(method, path)
        if kind is None:
            await self.app(scope, receive, send)
            return
        token = bearer(scope)
        spaces = self.index.keyspaces(token) if token is not None else None
        if spaces is None:
            await _refuse(send, 401, "a valid read token is required (Authorization: Bearer)")
            return
        if kind == "kv":
            if not allowed(spaces, unquote_to_bytes(path[len(KV_PREFIX) :])):
                await _refuse(send, 403, "this token may not read that key")
                return
            await self.app(scope, receive, send)
        elif kind == "bulk":
            await self._bulk(scope, receive, send, spaces)
        else:
            await self._ranged(scope, receive, send, spaces, kind)

    async def _bulk(
        self, scope: Scope, receive: Receive, send: Send, spaces: tuple[bytes, ...]
    ) -> None:
        body = bytearray()
        more = True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > MAX_BULK_BODY:
                await _refuse(send, 413, f"get_bulk body over {MAX_BULK_BODY} bytes")
                return
        keys = _bulk_keys(bytes(body))
        if keys is not None and not all(allowed(spaces, k) for k in keys):
            await _refuse(send, 403, "this token may not read some of these keys")
            return
        # Malformed bodies go on to the app, which answers its usual 400/422.
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _ranged(
        self, scope: Scope, receive: Receive, send: Send, spaces: tuple[bytes, ...], kind: str
    ) -> None:
        q = [
            (k, v.encode("latin-1"))
            for k, v in parse_qsl(
                scope.get("query_string", b"").decode("latin-1"),
                keep_blank_values=True,
                encoding="latin-1",
            )
        ]
        params = dict(q)
        prefix = params.get("prefix")
        if kind == "watch" or prefix is not None:
            if prefix is not None and allowed(spaces, prefix):
                await self.app(scope, receive, send)
                return
            start, end = (prefix, prefix_end(prefix)) if prefix else (b"", None)
        else:
            start, end = params.get("start") or b"", params.get("end")
            if end is not None and end <= start:
                await self.app(scope, receive, send)  # the app's 400
                return
        part = narrow(spaces, start, end)
        if part is None:
            await _refuse(
                send,
                403,
                "this token may read this range in none or several of its keyspaces",
                hint="read each of the token's keyspaces in its own request",
            )
            return
        lo, hi = part
        keep = [(k, v) for k, v in q if k not in ("prefix", "start", "end")]
        if kind == "watch" or (prefix is not None and hi == prefix_end(lo)):
            # The narrowed range is exactly one keyspace: as a prefix (watch takes only that).
            new = [("prefix", lo), *keep]
        else:
            new = [("start", lo), *([("end", hi)] if hi is not None else []), *keep]
        qs = "&".join(f"{k}={quote_from_bytes(v, safe='')}" for k, v in new).encode()
        await self.app({**scope, "query_string": qs}, receive, send)


def _kind(method: str, path: bytes) -> str | None:
    if method in ("GET", "HEAD") and path.startswith(KV_PREFIX):
        return "kv"
    if method == "POST" and path == b"/v1/get_bulk":
        return "bulk"
    if method == "GET" and path == b"/v1/range":
        return "range"
    if method == "GET" and path == b"/v1/watch":
        return "watch"
    return None


def _bulk_keys(body: bytes) -> list[bytes] | None:
    """The keys a get_bulk body names; None when it is not a well-formed body."""
    try:
        doc: Any = json.loads(body)
        keys = [k.encode() for k in doc.get("keys", [])]
        keys += [base64.b64decode(k, validate=True) for k in doc.get("keys_b64", [])]
    except (ValueError, AttributeError, TypeError, binascii.Error):
        return None
    return keys


async def _refuse(send: Send, status: int, detail: str, hint: str | None = None) -> None:
    slug = {401: "unauthorized", 403: "forbidden", 413: "too-large"}[status]
    title = {401: "Read token required", 403: "Outside the token's keyspaces"}.get(
        status, "Request too large"
    )
    body = problem_body(status, slug, detail, title=title, **({"hint": hint} if hint else {}))
    headers = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", b"%d" % len(body))]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="mercury-reads"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
