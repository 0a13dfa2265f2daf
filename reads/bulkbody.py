"""The body of `POST /v1/get_bulk`: bounded before it is read, and its number of items
bounded before it is decoded.

A get_bulk names at most `MAX_BULK_KEYS` keys, so its body never needs more than
`MAX_BULK_BODY` bytes: a body that says it is larger (Content-Length) is refused before a
byte of it is read, and a chunked one as soon as it grows past the bound. A body within
the bound may still hold millions of tiny items (``"a",`` is 4 bytes): decoding them all
costs tens of times the body in memory and seconds of the read process's event loop, so
`too_many_items` counts the body's separators first, stopping as soon as the count is
past what `MAX_BULK_KEYS` keys can have. The read API (`reads/http_app.py`) and the read
token middleware (`reads/auth.py`) both read get_bulk bodies here: one rule, over the one
bounded body reader of every HTTP face (`net/asgibody.py`, the gateway's too), and decode
them with `decode` (a member named twice in one object is refused, `core/strictjson.py`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from core import strictjson
from core.errors import BadRequestError, OverloadedError, TooLargeError
from core.problems import classify
from net.asgibody import read_body
from store.format import MAX_KEY

#: Keys one get_bulk may name (`keys` and `keys_b64` together).
MAX_BULK_KEYS = 10_000
#: The JSON text of one key at its longest: MAX_KEY bytes that are all control characters,
#: each written ``\u00XX`` (6 bytes), its two quotes, and a comma with whitespace after it
#: (a base64 key, 4/3 of MAX_KEY, is far shorter).
MAX_KEY_JSON = 6 * MAX_KEY + 16
#: The largest get_bulk body: MAX_BULK_KEYS of the longest keys, plus the object around
#: them and its whitespace.
MAX_BULK_BODY = MAX_BULK_KEYS * MAX_KEY_JSON + (64 << 10)
#: Separators (commas outside strings) a body of MAX_BULK_KEYS keys may have: between its
#: keys, between its two members, and room for a few unknown members (ignored).
MAX_SEPARATORS = MAX_BULK_KEYS + 64


class GetBulkBody(BaseModel):
    """`POST /v1/get_bulk` body: keys as text, and/or base64 keys for non-UTF-8 ones. The
    read API and the read token middleware both decode it with this model (one parser: a
    body the two read differently could pass the keyspace check naming other keys than
    the ones the read API then serves)."""

    keys: list[str] = Field(default_factory=list)
    keys_b64: list[str] = Field(default_factory=list)


def decode(body: bytes) -> GetBulkBody:
    """The get_bulk body as the read API serves it: `GetBulkBody` from its JSON, and no
    object of it naming a member twice (``{"keys": [...], "keys": [...]}`` means one list
    to a reader keeping the last and another to one keeping the first). Raises
    pydantic's `ValidationError` for a body that is not JSON or not the model, and
    `core.strictjson.AmbiguousJsonError` (a ValueError) for a repeated member."""
    doc = GetBulkBody.model_validate_json(body)
    strictjson.check(body)
    return doc


class BodyRefused(Exception):
    """The body was refused before it was decoded: `status` 413 (too large), 408 (stalled),
    400 (bad Content-Length, or the client left mid-body), 503 (the process holds as many
    request bodies as it may: retry after a second)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


async def read(receive: Any, content_length: str | None) -> bytes:
    """The whole body from ASGI `receive`, at most `MAX_BULK_BODY` bytes (refused from its
    Content-Length before reading, else as soon as a chunked body passes the bound; 408
    after `net.asgibody.BODY_IDLE_TIMEOUT_S` without data)."""
    try:
        return await read_body(receive, content_length, MAX_BULK_BODY, "a get_bulk body")
    except (BadRequestError, TooLargeError, OverloadedError) as err:  # 400/408, 413, 503
        status = classify(err).status
        why = f"{MAX_BULK_KEYS} keys of at most {MAX_KEY} bytes never need more"
        raise BodyRefused(status, f"{err} ({why})" if status == 413 else str(err)) from err


def too_many_items(body: bytes, limit: int = MAX_SEPARATORS) -> int | None:
    """None when `body` holds at most `limit` separators (commas outside its strings: by
    default what `MAX_BULK_KEYS` keys have); else how many it holds, counted up to the
    first past `limit` (so it holds more values than that many keys).
    A few passes over the body at C speed, the last one stopping as soon as the count is
    past the bound."""
    if body.count(b",") <= limit:
        return None  # (commas inside strings only over-count)
    # Escaped backslashes, then escaped quotes, out (pairs from the left, as JSON reads
    # them): every quote left opens or closes a string. (No regex over the escapes: a
    # body of millions of them would hold the event loop for seconds.)
    text = body.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in body else body
    seps = 0
    pos = 0
    while True:
        start = text.find(b'"', pos)
        seps += text.count(b",", pos, len(text) if start < 0 else start)
        if seps > limit:
            return seps
        if start < 0:
            return None
        end = text.find(b'"', start + 1)
        if end < 0:
            return None  # an unterminated string: not JSON (the decoder says so)
        pos = end + 1
