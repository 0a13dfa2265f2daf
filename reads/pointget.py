"""`GET|HEAD /v1/kv/{key}`: the answer of one point read, independent of the server.

Both HTTP paths answer point gets with this function — the raw-ASGI handler of
`reads.http_app.ReadApp` (taken when the request reaches the ASGI app) and the protocol
fast path of `reads.fasthttp` (taken on a plain keep-alive GET, before any ASGI scope is
built) — so their answers cannot drift apart: same status, same headers in the same
order, same body, for the same request and the same store.
"""

from __future__ import annotations

import time
from urllib.parse import unquote_to_bytes

from core import ttl
from core.errors import CRCError
from core.problems import NO_SUCH_KEY, PROBLEM_JSON
from reads import keyspaces, readstats
from reads.fastobserve import BatchedObserve
from reads.metrics import READ_ERRORS, READ_SECONDS
from reads.problems import problem_body
from store.format import MAX_KEY
from store.store import Store

KV_PREFIX = b"/v1/kv/"
_OCTET = b"application/octet-stream"
_PROBLEM = PROBLEM_JSON.encode()
#: mercury_read_seconds{op="http_get"}, bound once (both HTTP paths observe it).
OBSERVE = BatchedObserve(READ_SECONDS, "http_get")

Headers = list[tuple[bytes, bytes]]


def key_of(raw_path: bytes) -> bytes:
    """The key a `/v1/kv/...` raw path names (percent-decoded to bytes)."""
    raw = raw_path[len(KV_PREFIX) :]
    return raw if b"%" not in raw else unquote_to_bytes(raw)


def point_get(
    store: Store, key: bytes, if_none_match: bytes | None, head: bool
) -> tuple[int, Headers, bytes]:
    """(status, headers, body) of a point get of `key`; the body is empty for HEAD but
    `content-length` is the GET's. Never raises for a bad key or a corrupt value: those are
    problem+json answers (400, 500), as a missing key is (404)."""
    t0 = time.perf_counter()
    status = 200
    headers: Headers
    body = b""
    if not 1 <= len(key) <= MAX_KEY:
        status = 400
        body = problem_body(
            400, "invalid-read", f"key must be 1 to {MAX_KEY} bytes", title="Invalid read request"
        )
        headers = [(b"content-type", _PROBLEM)]
    else:
        try:
            found = store.get(key)
            applied = store.last_seq()  # read after the value: always >= its seq
            outside = keyspaces.outside_key_body(key) if found is None else None
            if outside is not None:  # not held here, which a 404 would deny
                status = 421
                body = outside
                headers = [(b"content-type", _PROBLEM)]
            elif found is None:
                status = 404
                body = problem_body(
                    404,
                    NO_SUCH_KEY,
                    f"key {key.decode('utf-8', 'backslashreplace')!r} is not stored",
                    title="No such key",
                )
                headers = [(b"content-type", _PROBLEM)]
            else:
                readstats.note_read(key)  # unused-key analytics (reads/readstats.py)
                etag = b'"%d"' % found.seq
                headers = [
                    (b"content-type", _OCTET),
                    (b"etag", etag),
                    (b"x-mercury-version", b"%d" % found.seq),
                ]
                # A deadline, as the log says: a key past it is served until the root's
                # expiry reaches this node (every node removes it at the same seq).
                for name, value in ttl.headers(found.expires_us).items():
                    headers.append((name.lower().encode(), value.encode()))
                if if_none_match is not None and _matches(if_none_match, etag):
                    status = 304
                else:
                    body = found.value
            applied_b = b"%d" % applied
            headers.append((b"x-mercury-seq", applied_b))
            headers.append((b"x-mercury-applied-seq", applied_b))
        except CRCError as err:
            READ_ERRORS.labels("http_get", "crc").inc()
            status = 500
            body = problem_body(
                500,
                "corrupt-value",
                err.message,
                title="Stored value failed its CRC",
                hint=err.hint,
            )
            headers = [(b"content-type", _PROBLEM)]
    if status != 304:  # a 304's Content-Length would have to be the 200's (RFC 9110)
        headers.append((b"content-length", b"%d" % len(body)))
    OBSERVE(time.perf_counter() - t0)
    return status, headers, b"" if head else body


def if_none_match(headers: Headers) -> bytes | None:
    """The first `If-None-Match` header's value (names lower-cased, as ASGI gives them)."""
    for name, value in headers:
        if name == b"if-none-match":
            return value
    return None


def _matches(value: bytes, etag: bytes) -> bool:
    return value.strip() == b"*" or etag in [v.strip() for v in value.split(b",")]
