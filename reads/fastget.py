"""Point reads answered straight from the stored record: the pure-Python reference.

The hot read paths (memcached `get`, HTTP `GET /v1/kv/{key}`) answer a hit on an inline
value from its stored record (`store/format.py`: header, owner, value; CRC over key,
header and value) in one step: check the record's CRC and write the protocol's reply
around the value, with no `Value` object in between (`mc_value`, `http_value`). Around
them, the request itself: `McGet` answers a memcached connection's lone one-key `get`
whole (parse, one read transaction, reply, counters), `http_request` recognises a plain
point get's HTTP head and `http_get` reads and answers it. `reads/_fastget.pyx` compiles
the same names (the servers call them through `MC_VALUE`, `HTTP_VALUE`, `MC_GET`,
`HTTP_REQUEST`, `HTTP_GET`); this module is the reference it must agree with
(`tests/property/test_fastget_agree.py`, `test_mcget_agree.py`, `test_httpget_agree.py`).

Each returns None (or hands the request to its fallback) for what it does not answer — a
chunked record (a large value, reassembled by the store's reader), a malformed one or one
failing its CRC, a miss where the full path words the answer, a request with anything
unusual — and the caller then takes the full path, which reassembles the value or reports
the failure (`CRCError`, counted): a bad value is never served.
"""

from __future__ import annotations

import sys
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable
from types import ModuleType
from typing import Any

from prometheus_client import Histogram

from core import compiled
from memcached import protocol as mc
from reads.fastobserve import BatchedObserve
from store.format import RECORD_FIXED, RECORD_HEADER, RECORD_TAG, record_crc

_OCTET_HEAD = b"content-type: application/octet-stream\r\netag: "


def _inline(key: bytes, rec: bytes) -> tuple[int, bytes] | None:
    """(seq, value) of an inline record whose CRC holds; None otherwise."""
    if len(rec) < RECORD_FIXED or rec[0] != RECORD_TAG:
        return None
    _tag, flags, seq, vlen, crc = RECORD_HEADER.unpack_from(rec, 0)
    if flags:  # a chunked value, or a deadline whose `Expires` the full path reports
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


class SourcedObserve(BatchedObserve):
    """A `BatchedObserve` that compiled shortcuts (`McGet`) count into in C: before each
    fold into the histogram (every `FLUSH_EVERY` values, and before every scrape) it takes
    their pending counts (`fold`), so what a scrape sees is still every value observed."""

    def __init__(self, hist: Histogram, *labels: str) -> None:
        super().__init__(hist, *labels)
        #: Objects with `fold()`, held weakly (a handler gone takes its shortcut with it).
        self.sources: weakref.WeakSet[Any] = weakref.WeakSet()

    def flush(self) -> None:
        for s in list(self.sources):
            s.fold()
        super().flush()


class McGet:
    """memcached's commonest request answered whole: called with the bytes a connection
    received (`net.tcp.Fast`), it answers a lone `get`/`gets` of one key
    (`memcached_protocol.lone_get`) from the stored record in one short read transaction
    on `db` of `env`: `END` for a miss, the `VALUE` block and `END` for an inline record
    whose CRC holds (`mc_value`). Anything else — another command, several keys, a partial
    line, a chunked or failing record — is handed to `fallback` (the handler's full path)
    and its answer returned. Counts `cmd_get`, `get_hits` and `get_misses` of what it
    answered itself, observes each answer's seconds with `observe` and counts each hit's
    key with `note_read` (unused-key analytics).

    The compiled twin (`reads/_fastget.pyx`) keeps the counters as C integers and the
    latency counts in C, handed to `observe` by `fold` (a `SourcedObserve` asks for them
    before each fold into the histogram); here `fold` has nothing to hand over."""

    def __init__(
        self,
        env: Any,
        db: Any,
        flags_in_value: bool,
        fallback: Callable[[bytes], bytes | None],
        observe: BatchedObserve,
        note_read: Callable[[bytes], None],
        max_key: int,
        max_line: int,
    ) -> None:
        self.env, self.db, self.flags_in_value = env, db, flags_in_value
        self.fallback, self.observe, self.note_read = fallback, observe, note_read
        self.max_key, self.max_line = max_key, max_line
        self.cmd_get = self.get_hits = self.get_misses = 0
        sources = getattr(observe, "sources", None)
        if sources is not None:
            sources.add(self)

    def bucket(self, v: float) -> int:
        """The histogram bucket `observe` counts `v` in (the compiled twin's is in C)."""
        return bisect_left(self.observe.bounds, v)

    def fold(self) -> None:
        """Hand pending latency counts to `observe` (none: each value went there)."""

    def __call__(self, data: bytes) -> bytes | None:
        got = mc.lone_get(data, self.max_line, self.max_key)
        if got is None:
            return self.fallback(data)
        key, with_cas = got
        t0 = time.perf_counter()
        txn = self.env.begin(self.db)
        try:
            rec = txn.get(key)
        finally:
            txn.abort()
        self.cmd_get += 1
        if rec is None:
            self.get_misses += 1
            self.observe(time.perf_counter() - t0)
            return mc.END
        block = mc_value(key, rec, with_cas, self.flags_in_value)
        if block is None:
            self.cmd_get -= 1  # the fallback answers and counts it
            return self.fallback(data)
        self.note_read(key)
        self.get_hits += 1
        self.observe(time.perf_counter() - t0)
        return block + mc.END


#: Longest request head the HTTP pre-parse (`http_request`) looks at.
MAX_HTTP_HEAD = 8192
#: Bytes a key may hold to be taken from the path as is (RFC 3986's unreserved and
#: sub-delims, ":", "@", "/"): a "%" escape, "?", "#", a space or a control leaves the
#: request to the HTTP parser.
_PATH_OK = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/"
)
_NAME_OK = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
#: Headers that leave the request to the parser and the full path: a body, a
#: 100-continue, an upgrade, a conditional get, connection rules, credentials.
_DECLINE = frozenset(
    (
        b"content-length",
        b"transfer-encoding",
        b"expect",
        b"upgrade",
        b"if-none-match",
        b"connection",
        b"authorization",
    )
)


def http_request(data: bytes, max_key: int) -> tuple[bytes, bool] | None:
    """(key, head_only) when `data` is exactly one complete plain HTTP/1.1 point get —
    `GET|HEAD /v1/kv/<key> HTTP/1.1`, header lines `Name: value` whose names are letters,
    digits and "-" and not one of `_DECLINE`, values printable ASCII or tabs, then the
    empty line ending `data` — with a key of 1 to `max_key` bytes of `_PATH_OK`. None for
    anything else (the HTTP parser then takes it: this accepts only what it accepts and
    answers the same way)."""
    if len(data) > MAX_HTTP_HEAD or data.find(b"\r\n\r\n") != len(data) - 4:
        return None
    lines = data[:-4].split(b"\r\n")
    req = lines[0]
    if req.startswith(b"GET /v1/kv/"):
        head_only, rest = False, req[11:]
    elif req.startswith(b"HEAD /v1/kv/"):
        head_only, rest = True, req[12:]
    else:
        return None
    if not rest.endswith(b" HTTP/1.1"):
        return None
    key = rest[:-9]
    if not 1 <= len(key) <= max_key or any(c not in _PATH_OK for c in key):
        return None
    for line in lines[1:]:
        colon = line.find(b":")
        if colon <= 0:
            return None
        name = line[:colon]
        if any(c not in _NAME_OK for c in name) or name.lower() in _DECLINE:
            return None
        if any(not (32 <= c < 127 or c == 9) for c in line[colon + 1 :]):
            return None
    return key, head_only


def http_get(
    env: Any,
    data_db: Any,
    meta_db: Any,
    seq_key: bytes,
    head: bytes,
    key: bytes,
    head_only: bool,
) -> bytes | None:
    """The whole 200 answer (`http_value`) of a point get of `key` on a keep-alive
    connection, from its record and the store's last seq (the u64 at `seq_key` in
    `meta_db`) read in one short transaction; None for a miss or a record `http_value`
    does not answer (the full path answers those)."""
    txn = env.begin(data_db)
    try:
        rec = txn.get(key)
        raw = txn.get(seq_key, None, meta_db)
    finally:
        txn.abort()
    if rec is None:
        return None
    if type(raw) is not bytes or len(raw) != 8:
        raise ValueError("the store's last seq is not a u64")
    return http_value(head, key, rec, int.from_bytes(raw, "little"), head_only, False)


def _load() -> ModuleType:
    """The compiled module, or this one where the reference serves (`core/compiled.py`)."""
    return compiled.load("reads._fastget") or sys.modules[__name__]


#: The implementation the servers call: the compiled module when built, else this one.
IMPL = _load()
MC_VALUE: Callable[[bytes, bytes, bool, bool], bytes | None] = IMPL.mc_value
HTTP_VALUE: Callable[[bytes, bytes, bytes, int, bool, bool], bytes | None] = IMPL.http_value
MC_GET: type[McGet] = IMPL.McGet
HTTP_REQUEST: Callable[[bytes, int], tuple[bytes, bool] | None] = IMPL.http_request
HTTP_GET: Callable[[Any, Any, Any, bytes, bytes, bytes, bool], bytes | None] = IMPL.http_get
