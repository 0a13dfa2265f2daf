"""Reply bytes of a point read straight from a stored record: the pure-Python reference.

The hot read paths (memcached `get`, HTTP `GET /v1/kv/{key}`) answer a hit on an inline
value from its stored record (`store/format.py`: header, owner, value; CRC over key,
header and value) in one step: check the record's CRC and write the protocol's reply
around the value, with no `Value` object in between. `reads/_fastget.pyx` compiles the same
two functions (the servers call `MC_VALUE` and `HTTP_VALUE`); this module is the reference
it must agree with byte for byte (`tests/property/test_fastget_agree.py`).

Both return None for a record they do not answer — chunked (a large value, reassembled by
the store's reader), malformed, or failing its CRC — and the caller then takes the full
path, which reassembles the value or reports the failure (`CRCError`, counted): a bad
value is never served.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType

from store.format import FLAG_CHUNKED, RECORD_FIXED, RECORD_HEADER, RECORD_TAG, record_crc

_OCTET_HEAD = b"content-type: application/octet-stream\r\netag: "


def _inline(key: bytes, rec: bytes) -> tuple[int, bytes] | None:
    """(seq, value) of an inline record whose CRC holds; None otherwise."""
    if len(rec) < RECORD_FIXED or rec[0] != RECORD_TAG:
        return None
    _tag, flags, seq, vlen, crc = RECORD_HEADER.unpack_from(rec, 0)
    if flags & FLAG_CHUNKED:
        return None
    off = RECORD_FIXED + rec[18]
    if len(rec) != off + vlen:
        return None
    value = rec[off:]
    if record_crc(key, rec[:14], rec[18:off], value) != crc:
        return None
    return seq, value


def mc_value(key: bytes, rec: bytes, with_cas: bool, flags_in_value: bool) -> bytes | None:
    """`VALUE <key> <flags> <bytes>[ <cas>]\\r\\n<data>\\r\\n` of a hit (as
    `memcached_protocol.encode_values` writes one; the caller adds `END`), or None."""
    got = _inline(key, rec)
    if got is None:
        return None
    seq, value = got
    flags = 0
    if flags_in_value and len(value) >= 4:
        flags = int.from_bytes(value[-4:], "big")
        value = value[:-4]
    if with_cas:
        return b"VALUE %s %d %d %d\r\n%s\r\n" % (key, flags, len(value), seq, value)
    return b"VALUE %s %d %d\r\n%s\r\n" % (key, flags, len(value), value)


def http_value(
    head: bytes, key: bytes, rec: bytes, applied: int, head_only: bool, close: bool
) -> bytes | None:
    """The whole HTTP/1.1 200 answer of `GET|HEAD /v1/kv/{key}` for a hit, or None.

    `head` is the status line and the server's default headers, as uvicorn writes them;
    the headers after it are those of `reads.pointget.point_get`, in its order, then
    `connection: close` when `close`, then the value (none for HEAD)."""
    got = _inline(key, rec)
    if got is None:
        return None
    seq, value = got
    tail = b"connection: close\r\n\r\n" if close else b"\r\n"
    return b'%s%s"%d"\r\nx-mercury-version: %d\r\nx-mercury-seq: %d\r\n' % (
        head,
        _OCTET_HEAD,
        seq,
        seq,
        applied,
    ) + b"x-mercury-applied-seq: %d\r\ncontent-length: %d\r\n%s%s" % (
        applied,
        len(value),
        tail,
        b"" if head_only else value,
    )


def _load() -> ModuleType:
    this = sys.modules[__name__]
    if os.environ.get("MERCURY_PURE") == "1":
        return this  # the whole node on the pure-Python references (tests)
    try:
        from reads import _fastget  # type: ignore[attr-defined]
    except ImportError:  # not built (`make build`): the reference serves, slower
        if os.environ.get("MERCURY_REQUIRE_CYTHON") == "1":
            raise
        return this
    return _fastget  # type: ignore[no-any-return]


#: The implementation the servers call: the compiled module when built, else this one.
IMPL = _load()
MC_VALUE: Callable[[bytes, bytes, bool, bool], bytes | None] = IMPL.mc_value
HTTP_VALUE: Callable[[bytes, bytes, bytes, int, bool, bool], bytes | None] = IMPL.http_value
