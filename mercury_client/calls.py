"""The requests of the SDK and how their answers read (pure: no sockets).

`Client` and `AsyncClient` send the same `Call`s and decode the answers with the same
functions, so the two differ only in how they wait for the network.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import httpx

from mercury_client import wire
from mercury_client.errors import (
    MercuryClientError,
    ServerError,
    Unavailable,
    from_answer,
    key_absent,
)

WRITE = "write"
READ = "read"


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request: on the write node (`WRITE`, the root) or the read node (`READ`)."""

    node: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None


#: Seconds a connection may take to open (a dead host may never refuse it; with several
#: URLs the next one is tried).
CONNECT_TIMEOUT_S = 5.0

#: Redirects one call follows: an HA standby's 307 to its leader (a longer chain means the
#: group is moving; the call then fails as the last answer says).
MAX_REDIRECTS = 3


def node_urls(url: str | Sequence[str]) -> list[str]:
    """The write node's URLs: one, several comma-separated (``"http://a,http://b"``, as the
    CLI's ``--url`` takes them), or a list (every candidate of an HA group)."""
    parts = url.split(",") if isinstance(url, str) else [p for u in url for p in u.split(",")]
    out = [p.strip().rstrip("/") for p in parts if p.strip()]
    if not out:
        raise ValueError("no URL given")
    for u in out:
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"not an http(s) URL: {u!r}")
    return out


def origin(url: str) -> str:
    """``scheme://host:port`` of `url`."""
    u = httpx.URL(url)
    return str(u.copy_with(path="/", query=None, fragment=None)).rstrip("/")


@dataclass(slots=True)
class Route:
    """Where a node's calls go: one of `urls` (the client's, in order), starting with the
    one that answered last; or the leader an HA standby's 307 named, when it is none of
    them (advertised under another name).

    A call that meets a refused connection or a 502/503/504 moves on to the next URL at
    once; only once every URL failed since the last wait (`failed` says so) does it wait
    before the next round. So a dead leader costs one refused connection, not a backoff,
    and the client keeps to the leader it found (no extra hop through a standby per call).
    """

    urls: list[str]
    current: int = 0
    leader: str | None = None
    #: URLs that failed since the last wait or answer
    _failures: int = 0

    def base(self) -> str:
        """The URL the next try goes to (paths are appended)."""
        return self.leader if self.leader is not None else self.urls[self.current]

    def answered(self, url: str) -> None:
        """`url` answered the call: the next calls start there."""
        o = origin(url)
        if o in self.urls:
            self.current, self.leader = self.urls.index(o), None
        else:
            self.leader = o
        self._failures = 0

    def failed(self) -> bool:
        """The try failed in a way another node may not: move on. True when every URL has
        failed since the last wait (wait, then try them again)."""
        if self.leader is not None:
            self.leader = None  # back to the given URLs, from the one that led us there
            return False
        self._failures += 1
        self.current = (self.current + 1) % len(self.urls)
        return self._failures >= len(self.urls)

    def waited(self) -> None:
        """A wait between rounds passed: every URL may be tried again."""
        self._failures = 0


def unavailable(err: httpx.TransportError) -> Unavailable:
    """A request that got no answer, naming the URL it was for (with several URLs, which
    one failed last is what a caller needs to know)."""
    what = str(err) or "connection failed"
    with contextlib.suppress(RuntimeError):  # an httpx error without its request
        what = f"{err.request.url}: {what}"
    return Unavailable(0, type(err).__name__, what)


def bearer(token: str | None, what: str = "token") -> dict[str, str]:
    """The Authorization header of `token` (none for None or empty). Surrounding whitespace
    is dropped (a token read from its file ends in a newline); a token with whitespace or a
    control character inside is a ValueError, not a request that fails as unavailable."""
    if not token:
        return {}
    t = token.strip()
    if not t or any(c.isspace() or not c.isprintable() for c in t):
        raise ValueError(f"{what} holds whitespace or control characters: not a Mercury token")
    return {"Authorization": f"Bearer {t}"}


def success(r: httpx.Response, ok404: bool) -> bool:
    """Whether `r` is an answer the call returns: a 2xx, or "no such key" when `ok404`.
    Any other answer (a redirect not followed, a 404 for a path no route serves) is an
    error: its body is no value or result."""
    return 200 <= r.status_code < 300 or (ok404 and absent(r))


def redirect(r: httpx.Response) -> str | None:
    """Where a 307 or 308 answer sends the same request (method, body and token kept), or
    None: another answer, no Location, or a Location that would leave HTTPS."""
    if r.status_code not in (307, 308) or not r.headers.get("location"):
        return None
    target = r.request.url.join(r.headers["location"])
    if r.request.url.scheme == "https" and target.scheme != "https":
        return None  # the token would travel in clear
    return str(target)


def new_idempotency_key() -> str:
    """A fresh random Idempotency-Key (one per logical write)."""
    return uuid.uuid4().hex


def idem_headers(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key} if idempotency_key else {}


def condition(if_seq: int | None, if_absent: bool) -> dict[str, str]:
    """Condition headers: the key's current seq must be `if_seq` (If-Match), or the key
    must be absent (If-None-Match: *)."""
    if if_seq is not None and if_absent:
        raise ValueError("give if_seq or if_absent, not both")
    if if_absent:
        return {"If-None-Match": "*"}
    return {"If-Match": f'"{int(if_seq)}"'} if if_seq is not None else {}


#: What `put(..., ttl=)` takes: a duration string (``"90s"``, ``"5m"``, ``"1h30m"``), a
#: number of seconds, or a `timedelta`.
Ttl = str | int | float | timedelta


def expiry_query(ttl: Ttl | None, expires_at: str | datetime | None) -> str:
    """The ``?ttl=`` / ``?expires_at=`` query of a PUT ("" when neither); the root checks
    the bounds (1 s to one year) and answers 400 naming the one passed."""
    if ttl is not None and expires_at is not None:
        raise ValueError("give ttl or expires_at, not both")
    if ttl is not None:
        if isinstance(ttl, timedelta):
            ttl = ttl.total_seconds()
        text = ttl if isinstance(ttl, str) else f"{float(ttl):g}"
        return "?" + urlencode({"ttl": text})
    if expires_at is not None:
        if isinstance(expires_at, datetime):
            if expires_at.tzinfo is None:
                raise ValueError("expires_at needs a timezone (an aware datetime)")
            expires_at = expires_at.isoformat()
        return "?" + urlencode({"expires_at": expires_at})
    return ""


def put(
    key: wire.Key,
    value: str | bytes,
    idempotency_key: str | None,
    cond: dict[str, str] | None = None,
    query: str = "",
) -> Call:
    return Call(
        WRITE,
        "PUT",
        wire.kv_path(key) + query,
        {
            "Content-Type": "application/octet-stream",
            **idem_headers(idempotency_key),
            **(cond or {}),
        },
        wire.as_bytes(value),
    )


def delete(key: wire.Key, idempotency_key: str | None, cond: dict[str, str] | None = None) -> Call:
    return Call(
        WRITE, "DELETE", wire.kv_path(key), {**idem_headers(idempotency_key), **(cond or {})}
    )


def delete_prefix(prefix: wire.Key, idempotency_key: str | None) -> Call:
    """``DELETE /v1/kv?prefix=P``: one batch's worth of the keys under P."""
    q = wire.range_query(prefix, None, None)
    return Call(WRITE, "DELETE", f"/v1/kv?{q}", idem_headers(idempotency_key))


#: Requests of a prefix delete that may delete nothing in a row (the open batch holds the
#: keyspace's delete guard) before it fails: each waits `PREFIX_PAUSE_S`, a batch window.
PREFIX_IDLE_TRIES = 20
PREFIX_PAUSE_S = 0.5


def get(key: wire.Key) -> Call:
    return Call(READ, "GET", wire.kv_path(key))


#: Keys per `POST /v1/get_bulk` (the read API's limit).
BULK_KEYS = 10_000


def get_bulk(keys: list[bytes]) -> Call:
    """``POST /v1/get_bulk``: UTF-8 keys as text, the others in ``keys_b64``."""
    text: list[str] = []
    b64: list[str] = []
    for k in keys:
        try:
            text.append(k.decode())
        except UnicodeDecodeError:
            b64.append(base64.b64encode(k).decode())
    body = json.dumps({"keys": text, "keys_b64": b64}, separators=(",", ":")).encode()
    return Call(READ, "POST", "/v1/get_bulk", {"Content-Type": "application/json"}, body)


def bulk_values(keys: list[bytes], doc: dict[str, Any]) -> dict[bytes, bytes | None]:
    """The values of a get_bulk answer by key (None for an absent key)."""
    values: dict[str, Any] = doc.get("values") or {}
    values_b64: dict[str, Any] = doc.get("values_b64") or {}
    out: dict[bytes, bytes | None] = {}
    for k in keys:
        try:
            name = k.decode()
        except UnicodeDecodeError:
            name = base64.b64encode(k).decode()
            v = values_b64.get(name)
            out[k] = None if v is None else base64.b64decode(v)
            continue
        if values.get(name) is not None:
            out[k] = str(values[name]).encode()
        elif values_b64.get(name) is not None:
            out[k] = base64.b64decode(values_b64[name])
        else:
            out[k] = None
    return out


def batch(body: dict[str, Any], idempotency_key: str | None) -> Call:
    return Call(
        WRITE,
        "POST",
        "/v1/batch",
        {"Content-Type": "application/json", **idem_headers(idempotency_key)},
        json.dumps(body, separators=(",", ":")).encode(),
    )


def range_page(query: str) -> Call:
    return Call(READ, "GET", "/v1/range?" + query)


def range_stream(query: str) -> Call:
    return Call(READ, "GET", "/v1/range?" + query, {"Accept": "application/x-ndjson"})


def watch(prefix: wire.Key, from_seq: int | None) -> Call:
    """``GET /v1/watch``; without `from_seq` the node starts at its current position."""
    q = wire.range_query(prefix, None, None)
    if from_seq is not None:
        q += f"&from_seq={int(from_seq)}"
    return Call(READ, "GET", f"/v1/watch?{q}", {"Accept": wire.NDJSON})


def replayed(r: httpx.Response) -> bool:
    return str(r.headers.get("idempotent-replayed", "")).lower() == "true"


def versioned(r: httpx.Response) -> wire.Versioned:
    """A GET answer's value and the key's seq from its ETag (``"<seq>"``)."""
    tag = str(r.headers.get("etag", "")).removeprefix("W/").strip('"')
    if not tag.isdigit():
        raise ServerError(0, "No version", f"the answer has no usable ETag: {tag!r}")
    return wire.Versioned(r.content, int(tag))


def write_result(r: httpx.Response) -> wire.WriteResult:
    doc = r.json()
    return wire.WriteResult(int(doc.get("seq") or 0), str(doc.get("status")), replayed(r))


def ndjson(line: str) -> dict[str, Any]:
    """One line of an NDJSON answer; `ServerError` for a line that is not a JSON object
    (a node fault, never passed on as data)."""
    try:
        doc = json.loads(line)
    except ValueError as err:
        raise ServerError(0, "Malformed stream", f"not JSON: {line[:200]!r}") from err
    if not isinstance(doc, dict):
        raise ServerError(0, "Malformed stream", f"not a JSON object: {line[:200]!r}")
    return doc


def range_item(doc: dict[str, Any]) -> wire.Item:
    """A streamed range line as an Item (an ``error`` line ends the stream as ServerError)."""
    if "error" in doc:
        raise ServerError(500, "Range stream failed", str(doc["error"]), doc)
    try:
        return wire.item(doc)
    except (ValueError, TypeError) as err:
        raise ServerError(0, "Malformed stream", str(err)) from err


def watch_change(doc: dict[str, Any]) -> wire.Change | None:
    """A watch line as a Change (None for a heartbeat)."""
    try:
        return wire.change(doc)
    except (ValueError, TypeError) as err:
        raise ServerError(0, "Malformed stream", str(err)) from err


def watch_line(line: str, resume: wire.Resume) -> wire.Change | None:
    """One line of a watch stream: the Change to deliver, or None (a heartbeat, noted in
    `resume`; a change already delivered before a reconnection; an error line, after
    which the node ends the stream and the watch resumes)."""
    doc = ndjson(line)
    hb = wire.heartbeat_seq(doc)
    if hb is not None:
        resume.heartbeat(hb)
        return None
    c = watch_change(doc)
    return c if c is not None and resume.fresh(c) else None


def absent(r: httpx.Response) -> bool:
    """A GET of a key answered "no such key" (a 404 of another kind raises, see `error`)."""
    return key_absent(r.status_code, r.content)


def error(r: httpx.Response) -> MercuryClientError:
    """The typed exception of an error answer (its body already read)."""
    return from_answer(r.status_code, r.headers, r.content)


def ssl_context(verify: bool | str, cert: str | tuple[str, str] | None) -> ssl.SSLContext | bool:
    """What httpx verifies the server with: `verify` False (no check), True (system CAs) or
    a CA bundle path; `cert` a client certificate file (key inside) or (cert, key) paths."""
    if verify is False:
        if cert is not None:
            raise ValueError("a client certificate needs a verified server (verify=True or a CA)")
        return False
    ctx = (
        ssl.create_default_context(cafile=verify)
        if isinstance(verify, str)
        else ssl.create_default_context()
    )
    if isinstance(cert, tuple):
        ctx.load_cert_chain(cert[0], cert[1])
    elif cert is not None:
        ctx.load_cert_chain(cert)
    return ctx
