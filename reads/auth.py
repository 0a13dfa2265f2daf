"""Read authentication (`--read-auth`): every HTTP read names a bearer token, and sees only
the keyspaces that token may read.

Which reads: ``GET|HEAD /v1/kv/{key}``, ``POST /v1/get_bulk``, ``GET /v1/range`` (pages
and NDJSON) and ``GET /v1/watch``. Everything else (health, metrics, status, the root's
writes and admin routes, which check their own tokens) passes through untouched.

- no token, or one the node does not know (or expired): 401;
- a point get or a get_bulk naming a key outside the token's keyspaces: 403 (the caller
  named the key itself; the answer says nothing about whether it exists);
- a range: 403 when it touches none of the token's keyspaces; otherwise the app reads only
  the parts inside them (the request carries the keyspaces in its ASGI scope under
  `READ_KEYSPACES`, and the read app scans through `ranges.KeyspaceReader`), so a range
  over ``[a/, d)`` read with a token for ``a/`` and ``c/`` returns the keys of both and
  none of ``b/``, and its cursors name only those keys;
- a watch: narrowed to the token's keyspace when it reaches past it; 403 when it touches
  none of them, or several (a watch follows one prefix: watch each keyspace apart).

Tokens and their keyspaces come from a `TokenIndex`; `AclTokenIndex` reads the replicated
ACL document (`acl`), so producers' and consumers' tokens work on every replica and
a revoked token stops working as soon as the change is applied. The root passes its
gateway's own token index (which also knows the admin token), see `mercury/root.py`.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import parse_qsl, quote, quote_from_bytes, unquote_to_bytes

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from acl.model import DOC_NAME, Acl
from acl.principals import Principal, TokenResolver, bearer_token
from core.problems import PROBLEM_JSON
from net.budget import token_principal
from net.http_bounds import authenticated
from reads import bulkbody
from reads.problems import problem_body
from reads.ranges import READ_KEYSPACES, clip, prefix_end
from store.store import Store

KV_PREFIX = b"/v1/kv/"


class TokenIndex(Protocol):
    """Which keyspaces a bearer token may read."""

    def keyspaces(self, token: str) -> tuple[bytes, ...] | None:
        """The token's keyspaces; None when the token is unknown or expired."""


def wall_us() -> int:
    """Now, in µs since the epoch: the clock tokens' expiry is read on."""
    return time.time_ns() // 1000


class AclTokenIndex:
    """Tokens of the replicated ACL document in `store` (producers read their own
    keyspaces, consumers theirs), resolved by `acl.principals`; rebuilt when the
    document's version changes. The admin token reads nothing here: it is the root's."""

    def __init__(self, store: Store, clock: Callable[[], int] = wall_us) -> None:
        self.store = store
        #: µs since the epoch
        self.clock = clock
        self._version = -1
        self._resolver = TokenResolver()

    def _refresh(self) -> None:
        doc = self.store.get_doc(DOC_NAME)
        version = 0 if doc is None else doc.seq
        if version == self._version:
            return
        acl = Acl.from_json(json.loads(doc.body)) if doc is not None else None
        self._resolver, self._version = TokenResolver(acl), version

    def keyspaces(self, token: str) -> tuple[bytes, ...] | None:
        """See `TokenIndex`."""
        self._refresh()
        who = self._resolver.resolve_token(token, self.clock())
        return who.keyspaces if isinstance(who, Principal) else None


def bearer(scope: Scope) -> str | None:
    """The bearer token of a request, if any (the first ``Authorization`` header, read by
    the one parser, `acl.principals.bearer_token`); "" for a header naming no token."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bearer_token(bytes(value))
    return None


def allowed(spaces: tuple[bytes, ...], key: bytes) -> bool:
    """Whether `key` lies in one of `spaces`."""
    return any(key.startswith(s) for s in spaces)


def narrow(
    spaces: tuple[bytes, ...], start: bytes, end: bytes | None
) -> tuple[bytes, bytes | None] | None:
    """The part of [start, end) inside the token's keyspaces when that is one contiguous
    part (None: it touches none, or several)."""
    parts = clip(spaces, start, end)
    return parts[0] if len(parts) == 1 else None


class ReadAuth:
    """ASGI middleware enforcing read tokens in front of a read API (see module doc)."""

    def __init__(self, app: ASGIApp, index: TokenIndex, only: frozenset[str] | None = None) -> None:
        self.app = app
        self.index = index
        # The read kinds ("kv", "bulk", "range", "watch") this instance guards; None: all.
        self.only = only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        raw = scope.get("raw_path") or quote(scope["path"]).encode()
        path = raw.split(b"?", 1)[0]
        kind = _kind(method, path)
        if kind is None or (self.only is not None and kind not in self.only):
            await self.app(scope, receive, send)
            return
        token = bearer(scope)
        spaces = self.index.keyspaces(token) if token is not None else None
        if spaces is None:
            await _refuse(send, 401, "a valid read token is required (Authorization: Bearer)")
            return
        if token:
            # Its connection holds its slot for this token from now on (the listener's
            # share per principal, and unauthenticated connections go first at its cap).
            authenticated(scope, token_principal(token))
        if kind == "kv":
            if not allowed(spaces, unquote_to_bytes(path[len(KV_PREFIX) :])):
                await _refuse(send, 403, "this token may not read that key")
                return
            await self.app({**scope, READ_KEYSPACES: spaces}, receive, send)
        elif kind == "bulk":
            await self._bulk(scope, receive, send, spaces)
        else:
            await self._ranged(scope, receive, send, spaces, kind)

    async def _bulk(
        self, scope: Scope, receive: Receive, send: Send, spaces: tuple[bytes, ...]
    ) -> None:
        # Read whole to check its keys, under the read API's own bounds (reads/bulkbody.py).
        try:
            body = await bulkbody.read(receive, _header(scope, b"content-length"))
        except bulkbody.BodyRefused as err:
            await _refuse(send, err.status, err.detail)
            return
        # A body of more items than a get_bulk may name is not decoded here: the app
        # refuses it (400) before decoding too.
        keys = None if bulkbody.too_many_items(body) is not None else _bulk_keys(body)
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
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app({**scope, READ_KEYSPACES: spaces}, replay, send)

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
        if kind == "range":
            if prefix is not None:
                start, end = prefix, prefix_end(prefix)
            else:
                start, end = params.get("start") or b"", params.get("end")
            # Invalid bounds (an empty prefix, end <= start) reach the app for its 400; the
            # keyspaces travel with every range request, so nothing is read unfiltered.
            valid = prefix != b"" and (end is None or start < end)
            if valid and not clip(spaces, start, end):
                await _refuse(send, 403, "this token may read no key of this range")
                return
            await self.app({**scope, READ_KEYSPACES: spaces}, receive, send)
            return
        if prefix is not None and allowed(spaces, prefix):
            await self.app({**scope, READ_KEYSPACES: spaces}, receive, send)
            return
        lo_hi = (prefix, prefix_end(prefix)) if prefix else (b"", None)
        part = narrow(spaces, *lo_hi)
        if part is None:
            await _refuse(
                send,
                403,
                "this token may read this watch's prefix in none or several of its keyspaces",
                hint="a watch follows one prefix: watch each of the token's keyspaces apart",
            )
            return
        # Two prefix ranges meet only when one prefix starts the other: the part is the
        # token's keyspace, watched as a prefix.
        new = [("prefix", part[0]), *((k, v) for k, v in q if k != "prefix")]
        qs = "&".join(f"{k}={quote_from_bytes(v, safe='')}" for k, v in new).encode()
        await self.app({**scope, "query_string": qs, READ_KEYSPACES: spaces}, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for n, value in scope.get("headers", ()):
        if n == name:
            return bytes(value).decode("latin-1")
    return None


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
    """The keys a get_bulk body names, decoded by the read API's own model (`bulkbody`);
    None when it is not a well-formed body (the read API refuses it then)."""
    try:
        doc = bulkbody.decode(body)
        keys = [k.encode() for k in doc.keys]
        keys += [base64.b64decode(k, validate=True) for k in doc.keys_b64]
    except (ValidationError, ValueError, binascii.Error):  # a repeated member is a ValueError
        return None
    return keys


async def _refuse(send: Send, status: int, detail: str, hint: str | None = None) -> None:
    slug = {
        400: "invalid-read",
        401: "unauthorized",
        403: "forbidden",
        408: "request-timeout",
        413: "too-large",
        503: "busy",
    }[status]
    title = {
        400: "Invalid read request",
        401: "Read token required",
        403: "Outside the token's keyspaces",
        408: "Request body timed out",
        413: "Request too large",
        503: "Node busy",
    }[status]
    body = problem_body(status, slug, detail, title=title, **({"hint": hint} if hint else {}))
    headers = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", b"%d" % len(body))]
    if status in (400, 408, 413, 503):  # the rest of a refused body is not wanted: close after
        headers.append((b"connection", b"close"))
    if status == 503:
        headers.append((b"retry-after", b"1"))
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="mercury-reads"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
