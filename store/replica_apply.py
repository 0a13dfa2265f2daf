"""A replica's write path: a source's log records, checked and applied byte-identical.

Each record is checked for its CRC, seq continuity with this store, contiguous entries and
the hash chain from this store's head to the record's head; then its entries are applied
and the record is stored as it came, so every node's log and hash head are identical.
Consecutive records can share one transaction (a catching-up replica); all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cramjam

from core.errors import ChainError, CorruptionError
from store import chunks, codec, docs, layout, txlog
from store.applyloop import forget
from store.batchwrite import ValueChunks
from store.counters import Delta, bump, write_usage
from store.format import OP_DOC, OP_SET, log_crc_ok
from store.layout import K_HASH_HEAD, K_LAST_SEQ, U64
from store.lmdberrors import writing
from store.ops import LogRecord
from store.usage import stored_bytes


def apply_records(
    path: str,
    env: Any,
    dbs: layout.Dbs,
    recs: Sequence[LogRecord],
    *,
    counted: bool,
    crc_checked: bool = False,
) -> None:
    """Apply consecutive `recs` in ONE write transaction (see `Store.apply_log_records`;
    `crc_checked`: the caller checked each record's CRC over these bytes)."""
    raws = [payload(rec, crc_checked) for rec in recs]
    with (
        writing(path, "applying a replicated batch"),
        env.begin(write=True, db=dbs.data) as txn,
    ):
        last = U64.unpack(txn.get(K_LAST_SEQ, db=dbs.meta))[0]
        head = bytes(txn.get(K_HASH_HEAD, db=dbs.meta))
        delta: Delta = {}
        for rec, raw in zip(recs, raws, strict=True):
            _apply_record(txn, dbs, rec, raw, last, head, delta)
            last, head = rec.last_seq, rec.hash_head
        if counted:
            write_usage(txn, dbs.meta, delta)
        txn.put(K_LAST_SEQ, U64.pack(last), db=dbs.meta)
        txn.put(K_HASH_HEAD, head, db=dbs.meta)


def payload(rec: LogRecord, crc_checked: bool = False) -> memoryview:
    """The checked, decompressed payload of `rec` (CorruptionError when it is not)."""
    if not crc_checked and not log_crc_ok(rec.header, rec.payload):
        raise CorruptionError(f"log record at seq {rec.first_seq} fails its CRC")
    try:
        return memoryview(cramjam.snappy.decompress_raw(rec.payload))
    except Exception as err:  # snappy raises its own error types on garbage
        raise CorruptionError(f"log record at seq {rec.first_seq}: bad payload") from err


def _apply_record(
    txn: Any,
    dbs: layout.Dbs,
    rec: LogRecord,
    raw: Any,
    last: int,
    head: bytes,
    delta: Delta,
) -> None:
    """Check one record against (last, head) and apply it inside `txn`."""
    if rec.first_seq != last + 1:
        raise ChainError(
            f"seq gap: store is at seq {last}, record starts at {rec.first_seq}",
            seq=last,
            hint="resume replication from the store's last seq",
        )
    try:
        entries, new_head = codec.unpack_entries(raw, head)
    except ValueError as err:
        raise CorruptionError(f"log record at {rec.first_seq}: {err}") from err
    if new_head != rec.hash_head:
        raise ChainError(
            f"hash chain mismatch in record at seq {rec.first_seq}: the source's "
            "log differs from this store's",
            seq=rec.first_seq,
            hint="re-bootstrap this replica from a snapshot",
        )
    if len(entries) != rec.num_entries or any(
        e.seq != rec.first_seq + i for i, e in enumerate(entries)
    ):
        raise ChainError(f"log record at {rec.first_seq}: entries not contiguous")
    get, put = txn.get, txn.put
    rare = ValueChunks(txn, dbs.chunks)
    for e in entries:
        if e.op == OP_DOC:  # a replicated document, never a user key
            docs.apply_entry(txn, dbs, e.seq, e.key, e.value)
            continue
        old = get(e.key)
        if old is not None:
            forget(codec.decode_record_header(old), len(e.key), delta, rare)
        if e.op == OP_SET:
            owner = e.owner.encode()
            big = chunks.is_chunked(len(e.value))
            if big:
                chunks.put(txn, dbs.chunks, chunks.VALUE_NS, e.seq, e.value)
            put(e.key, codec.encode_record(e.key, e.seq, owner, e.value, big))
            d = delta.get(e.owner)
            if d is None:
                d = delta[e.owner] = [0, 0, 0, 0, 0, 0]
            d[0] += 1
            d[1] += stored_bytes(len(e.key), len(e.value), len(owner))
            d[2] += 1
        else:
            txn.delete(e.key)
            bump(delta, e.owner, 3, 1)
    txlog.put_record(txn, dbs, rec.first_seq, rec.header, rec.payload)
