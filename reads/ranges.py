"""Range reads: bounds, opaque cursors and pages (pure logic over a store `Reader`).

A range is a prefix, or ``[start, end)``, or everything. A page holds at most `limit` keys
in key order; its cursor names the last key it returned, so the next page starts strictly
after it. Each page is read in its own short read transaction, so a paged (or streamed)
walk is not one snapshot, but every key that exists during the whole walk is returned
exactly once and in order, whatever writes land in between: keys only ever resume after
the last one returned.

Cursor bytes (then base64url without padding)::

    0   1   version = 1
    1   8   BLAKE2b-64 of the range bounds (a cursor is refused on another range)
    9   K   last key returned (1..500 bytes)

A read token may restrict a range to its keyspaces (`--read-auth`): `KeyspaceReader` wraps
the store reader so that every scan (pages, streams and the "more?" probe alike) only
visits the parts of the asked range inside those keyspaces. The cursor still binds the
asked bounds and names the last key returned, which is always inside a keyspace, so a
range across several keyspaces pages like any other and never names a key outside them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from core.errors import InvalidCursorError, InvalidReadError
from store.format import MAX_KEY
from store.ops import Value

CURSOR_VERSION = 1
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
#: A page (or a streamed chunk) ends once its keys and values reach this many bytes.
MAX_PAGE_BYTES = 16 << 20
#: ASGI scope key set by `reads.auth.ReadAuth` on a read it let through: the token's
#: keyspaces, to which the app restricts its scans (the root's gateway checks the same key
#: by name on its point reads).
READ_KEYSPACES = "mercury.read_keyspaces"


class RangeReader(Protocol):
    """What a page needs from the store (`store.store.Reader`)."""

    def scan(
        self,
        *,
        start: bytes = b"",
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> Iterator[tuple[bytes, Value | None]]: ...


@dataclass(frozen=True, slots=True)
class RangeSpec:
    """Bounds of a range: keys `k` with ``start <= k < end`` (end None = unbounded) and,
    when `prefix` is set, ``k.startswith(prefix)``."""

    start: bytes = b""
    end: bytes | None = None
    prefix: bytes | None = None

    def digest(self) -> bytes:
        """8 bytes binding a cursor to these bounds."""
        h = hashlib.blake2b(digest_size=8)
        for part in (self.prefix, self.start, self.end):
            if part is None:
                h.update(b"\x00")
            else:
                h.update(b"\x01" + len(part).to_bytes(4, "big") + part)
        return h.digest()


def make_spec(
    *, prefix: bytes | None = None, start: bytes | None = None, end: bytes | None = None
) -> RangeSpec:
    """Validate request bounds: a prefix, or start and/or end, or nothing (everything).

    Raises InvalidReadError for a prefix combined with start/end, an empty prefix, or
    ``end <= start``.
    """
    if prefix is not None and (start is not None or end is not None):
        raise InvalidReadError("give either prefix or start/end, not both")
    if prefix is not None:
        if not prefix:
            raise InvalidReadError("prefix must not be empty (omit it to read every key)")
        return RangeSpec(start=prefix, end=prefix_end(prefix), prefix=prefix)
    s = start or b""
    if end is not None and end <= s:
        raise InvalidReadError("end must be greater than start")
    return RangeSpec(start=s, end=end)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def clip(
    spaces: tuple[bytes, ...], start: bytes, end: bytes | None
) -> list[tuple[bytes, bytes | None]]:
    """The parts of ``[start, end)`` inside the keyspaces `spaces`, in key order, disjoint.

    A keyspace inside another adds nothing (its keys are the outer one's), so only the
    outermost keyspaces count; their ranges are then disjoint. An empty keyspace is all
    keys.
    """
    outer = sorted({s for s in spaces if not any(s != o and s.startswith(o) for o in spaces)})
    parts: list[tuple[bytes, bytes | None]] = []
    for s in outer:
        s_end = prefix_end(s)
        lo = max(start, s)
        hi = s_end if end is None else (end if s_end is None else min(end, s_end))
        if hi is None or lo < hi:
            parts.append((lo, hi))
    return parts


class KeyspaceReader:
    """A `RangeReader` that sees only the keys inside `spaces` (a read token's keyspaces)."""

    def __init__(self, reader: RangeReader, spaces: tuple[bytes, ...]) -> None:
        self.reader = reader
        self.spaces = spaces

    def scan(
        self,
        *,
        start: bytes = b"",
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> Iterator[tuple[bytes, Value | None]]:
        """The inner reader's scan restricted to the keyspaces, part by part in key order."""
        if prefix is not None:
            # Keys starting with `prefix` are exactly [prefix, prefix_end(prefix)).
            p_end = prefix_end(prefix)
            start = max(start, prefix)
            end = p_end if end is None else (end if p_end is None else min(end, p_end))
            if end is not None and start >= end:
                return
        left = limit
        for lo, hi in clip(self.spaces, start, end):
            if left is not None and left <= 0:
                return
            for item in self.reader.scan(start=lo, end=hi, limit=left, keys_only=keys_only):
                yield item
                if left is not None:
                    left -= 1


def encode_cursor(spec: RangeSpec, last_key: bytes) -> str:
    """The opaque cursor resuming `spec` strictly after `last_key`."""
    raw = bytes([CURSOR_VERSION]) + spec.digest() + last_key
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(spec: RangeSpec, cursor: str) -> bytes:
    """The last key named by `cursor`; InvalidCursorError when it is malformed, of another
    version, or was issued for other bounds."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError) as err:
        raise InvalidCursorError("cursor is not valid base64url") from err
    if len(raw) < 10 or raw[0] != CURSOR_VERSION:
        raise InvalidCursorError("cursor is malformed or from another version")
    if raw[1:9] != spec.digest():
        raise InvalidCursorError(
            "cursor was issued for another range", hint="send the same prefix/start/end"
        )
    key = raw[9:]
    if len(key) > MAX_KEY:
        raise InvalidCursorError("cursor is malformed")
    return key


def resume_start(spec: RangeSpec, after: bytes | None) -> bytes:
    """Where a page starts: the range start, or the smallest key after `after`."""
    if after is None:
        return spec.start
    nxt = after + b"\x00"  # the immediate successor of `after` in byte order
    return max(nxt, spec.start)


def check_limit(limit: int | None) -> int:
    """The page size to use: DEFAULT_LIMIT when None; InvalidReadError outside 1..MAX_LIMIT."""
    if limit is None:
        return DEFAULT_LIMIT
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidReadError(f"limit must be between 1 and {MAX_LIMIT}")
    return limit


def read_page(
    reader: RangeReader,
    spec: RangeSpec,
    after: bytes | None,
    limit: int,
    keys_only: bool,
    *,
    max_bytes: int = MAX_PAGE_BYTES,
) -> tuple[list[tuple[bytes, Value | None]], bool]:
    """Up to `limit` items of `spec` after key `after`, and whether more follow.

    A page also ends once its keys and values reach `max_bytes` (it always holds at least
    one item), so a page of large values stays bounded in memory; the value after the page
    is never read (a keys-only probe says whether more follow).
    Raises CRCError (from the reader) when a value fails its CRC.
    """
    start = resume_start(spec, after)
    if spec.end is not None and start >= spec.end:
        return [], False
    items: list[tuple[bytes, Value | None]] = []
    size = 0
    for k, v in reader.scan(
        start=start, end=spec.end, prefix=spec.prefix, limit=limit, keys_only=keys_only
    ):
        items.append((k, v))
        size += len(k) + (len(v.value) if v is not None else 0)
        if size >= max_bytes:
            break
    if not items:
        return [], False
    nxt = resume_start(spec, items[-1][0])
    if spec.end is not None and nxt >= spec.end:
        return items, False
    probe = reader.scan(start=nxt, end=spec.end, prefix=spec.prefix, limit=1, keys_only=True)
    return items, next(iter(probe), None) is not None
