"""The transaction log in LMDB: writing one record per batch, reading, retention GC.

Log records (format in `store/format.py`) live in the ``log`` sub-database under their
first seq (u64 big-endian); a record whose compressed payload exceeds one chunk keeps only
its header there and its payload in page-sized chunks (`store/chunks.py`). The hash chain
and seq bookkeeping in ``meta`` are the callers' (batch writer, replica apply).
"""

from __future__ import annotations

from typing import Any

import snappy

from core import failpoints
from core.errors import CorruptionError, InvalidOpError, LogRetentionError
from store import chunks, layout
from store.format import LOG_HEADER, MAX_LOG_RECORD, decode_log_header, encode_log_header
from store.layout import BE64, K_LAST_SEQ, K_LOG_BASE_HASH, K_LOG_FIRST, U64
from store.ops import LogRecord

_LOG_HDR = LOG_HEADER.size


def put_batch(
    txn: Any,
    dbs: layout.Dbs,
    first: int,
    count: int,
    time_us: int,
    head: bytes,
    payload: bytes,
) -> None:
    """Compress a batch's entry payload and store it as the log record at `first`."""
    comp = snappy.compress(payload)
    if LOG_HEADER.size + len(comp) > MAX_LOG_RECORD:  # no replica could ever take it
        raise InvalidOpError(
            f"batch of {count} entries makes a {LOG_HEADER.size + len(comp)}-byte log record; "
            f"at most {MAX_LOG_RECORD} (the replication frame limit)"
        )
    header = encode_log_header(0, first, count, time_us, head, comp)
    put_record(txn, dbs, first, header, comp)
    failpoints.hit("store.apply.log_written")


def put_record(txn: Any, dbs: layout.Dbs, first: int, header: bytes, comp: bytes) -> None:
    """Store a log record (header + compressed payload) byte-identical, appended."""
    if chunks.is_chunked(len(comp)):
        chunks.put(txn, dbs.chunks, chunks.LOG_NS, first, comp)
        txn.put(BE64.pack(first), header, db=dbs.log, append=True)
    else:
        txn.put(BE64.pack(first), header + comp, db=dbs.log, append=True)


def read(
    txn: Any,
    dbs: layout.Dbs,
    from_seq: int,
    *,
    max_records: int,
    max_bytes: int,
    within: bool = False,
) -> list[LogRecord]:
    """Log records from the one holding `from_seq` on (see `Store.read_log`). `within`:
    never more than `max_bytes` of payload, even if that means no record at all (a record
    is sized from its header before its chunks are reassembled)."""
    out: list[LogRecord] = []
    first = U64.unpack(txn.get(K_LOG_FIRST, db=dbs.meta))[0]
    if from_seq < first:
        raise LogRetentionError(
            f"seq {from_seq} is no longer retained (log starts at {first})",
            seq=from_seq,
            hint="bootstrap from a snapshot",
        )
    cur = txn.cursor(db=dbs.log)
    if not cur.set_range(BE64.pack(from_seq)):
        positioned = cur.last()  # from_seq may sit inside the last record
    elif BE64.unpack(cur.key())[0] > from_seq:
        positioned = cur.prev() or cur.first()  # ... or inside the previous one
    else:
        positioned = True
    if not positioned:
        return out
    size = 0
    for k, v in cur:
        if within:
            h = decode_log_header(bytes(v[:_LOG_HDR]))
            if h.first_seq + h.num_entries - 1 < from_seq:
                continue
            if size + h.plen > max_bytes:
                break
        rec = record(txn, dbs, k, v)
        if rec.last_seq < from_seq:
            continue
        out.append(rec)
        size += len(rec.payload)
        if len(out) >= max_records or size >= max_bytes:
            break
    return out


def record(txn: Any, dbs: layout.Dbs, k: bytes, v: bytes) -> LogRecord:
    """The LogRecord stored under key `k` with stored value `v` (chunks reassembled)."""
    header = bytes(v[:_LOG_HDR])
    h = decode_log_header(header)
    if len(v) == _LOG_HDR and h.plen > 0:
        payload = chunks.get(txn, dbs.chunks, chunks.LOG_NS, h.first_seq, h.plen)
        if payload is None:
            raise CorruptionError(f"log record at seq {h.first_seq} lost chunks")
    else:
        payload = bytes(v[_LOG_HDR:])
    return LogRecord(h.first_seq, h.num_entries, h.time_us, h.hash_head, header, payload)


def oldest_time_us(txn: Any, dbs: layout.Dbs) -> int | None:
    """The root's commit time (µs) of the oldest retained record, None for an empty log:
    only its header is read (a payload can be 256 MiB)."""
    cur = txn.cursor(db=dbs.log)
    if not cur.first():
        return None
    return int(decode_log_header(bytes(cur.value()[:_LOG_HDR])).time_us)


def gc(
    txn: Any,
    dbs: layout.Dbs,
    *,
    keep_entries: int | None,
    keep_seconds: float | None,
    min_entries: int,
    max_records: int,
    now_us: int,
) -> int:
    """Drop the oldest records beyond the retention policy inside `txn` (see
    `Store.gc_log`); return the entries dropped."""
    meta = dbs.meta
    last = U64.unpack(txn.get(K_LAST_SEQ, db=meta))[0]
    cur = txn.cursor(db=dbs.log)
    n = dropped = 0
    new_first, base = None, None
    while cur.first() and n < max_records:
        h = decode_log_header(cur.value()[:_LOG_HDR])
        last_of = h.first_seq + h.num_entries - 1
        remaining = last - last_of
        old_by_count = keep_entries is not None and remaining >= keep_entries
        old_by_age = keep_seconds is not None and h.time_us < now_us - keep_seconds * 1e6
        if not (old_by_count or old_by_age) or remaining < min_entries:
            break
        if len(cur.value()) == _LOG_HDR and h.plen > 0:
            chunks.delete(txn, dbs.chunks, chunks.LOG_NS, h.first_seq, h.plen)
        cur.delete()
        dropped += h.num_entries
        new_first, base = last_of + 1, h.hash_head
        n += 1
    if new_first is not None and base is not None:
        txn.put(K_LOG_FIRST, U64.pack(new_first), db=meta)
        txn.put(K_LOG_BASE_HASH, base, db=meta)
    return dropped
