"""A replica's write path: a source's log records, checked and applied byte-identical.

Each record is checked for its CRC, seq continuity with this store, entries a store
accepts (numbering, op, key and value sizes: `InvalidRecordError` otherwise) and the hash
chain from this store's head to the record's head — one compiled pass over the payload
(`codec.scan_entries`) — then its entries are applied straight from the payload
(`codec.apply_entries`: no `Entry` objects, chunked values handed to LMDB as views) and the
record is stored as it came, so every node's log and hash head are identical. Consecutive
records can share one transaction (a catching-up replica); all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cramjam

from core.errors import ChainError, CorruptionError, InvalidRecordError
from store import codec, docs, filtered, layout, txlog
from store.batchwrite import ValueChunks
from store.counters import Delta, write_usage
from store.format import log_crc_ok
from store.layout import K_HASH_HEAD, K_LAST_SEQ, U64
from store.lmdberrors import writing
from store.ops import LogRecord

#: What an operator does about a record no store accepts.
INVALID_HINT = (
    "the source sent a record no store accepts; replication stopped. Check the "
    "source's version and integrity, then re-bootstrap this replica"
)


def apply_records(
    path: str,
    env: Any,
    dbs: layout.Dbs,
    recs: Sequence[LogRecord],
    *,
    counted: bool,
    chain: int,
    crc_checked: bool = False,
) -> None:
    """Apply consecutive `recs` in ONE write transaction (see `Store.apply_log_records`;
    `chain`: the store's chain hash code; `crc_checked`: the caller checked each record's
    CRC over these bytes)."""
    raws = [payload(rec, crc_checked) for rec in recs]
    with (
        writing(path, "applying a replicated batch"),
        env.begin(write=True, db=dbs.data) as txn,
    ):
        last = U64.unpack(txn.get(K_LAST_SEQ, db=dbs.meta))[0]
        head = bytes(txn.get(K_HASH_HEAD, db=dbs.meta))
        delta: Delta = {}
        target = _Target(txn, dbs, chain)
        for rec, raw in zip(recs, raws, strict=True):
            _apply_record(target, rec, raw, last, head, delta)
            last, head = rec.last_seq, rec.hash_head
        if counted:
            write_usage(txn, dbs.meta, delta)
        txn.put(K_LAST_SEQ, U64.pack(last), db=dbs.meta)
        txn.put(K_HASH_HEAD, head, db=dbs.meta)


class _Target:
    """What applying records needs of one write transaction, bound once for all of them.

    Like the root's apply, a set of a key past the data sub-database's last one skips the
    lookup and goes in with LMDB's append mode (`max_key` follows the records)."""

    def __init__(self, txn: Any, dbs: layout.Dbs, chain: int) -> None:
        self.txn = txn
        self.dbs = dbs
        self.chain = chain
        self.rare = ValueChunks(txn, dbs.chunks, dbs.expiry)
        cur = txn.cursor()  # the data sub-database: the transaction's default
        self.append = cur.put
        self.max_key: bytes | None = bytes(cur.key()) if cur.last() else None

    def doc(self, seq: int, key: bytes, value: bytes) -> None:
        docs.apply_entry(self.txn, self.dbs, seq, key, value)


def payload(rec: LogRecord, crc_checked: bool = False) -> memoryview:
    """The checked, decompressed payload of `rec` (CorruptionError when it is not)."""
    if not crc_checked and not log_crc_ok(rec.header, rec.payload):
        raise CorruptionError(f"log record at seq {rec.first_seq} fails its CRC")
    try:
        return memoryview(cramjam.snappy.decompress_raw(rec.payload))
    except Exception as err:  # snappy raises its own error types on garbage
        raise CorruptionError(f"log record at seq {rec.first_seq}: bad payload") from err


def _apply_record(
    t: _Target,
    rec: LogRecord,
    raw: Any,
    last: int,
    head: bytes,
    delta: Delta,
) -> None:
    """Check one record against (last, head) and apply it inside `t`'s transaction."""
    if rec.first_seq != last + 1:
        raise ChainError(
            f"seq gap: store is at seq {last}, record starts at {rec.first_seq}",
            seq=last,
            hint="resume replication from the store's last seq",
        )
    try:
        if filtered.is_filtered(rec.header):
            # A keyspace-filtered record: its skip items carry the source's chain across
            # the entries this node does not hold (`store/filtered.py`).
            new_head, raw = filtered.scan(raw, head, rec.first_seq, rec.num_entries, t.chain)
        else:
            new_head = codec.scan_entries(raw, head, rec.first_seq, rec.num_entries, t.chain)
    except filtered.SkipMismatch as err:
        raise ChainError(
            f"hash chain mismatch in record at seq {rec.first_seq}: {err}",
            seq=rec.first_seq,
            hint="re-bootstrap this replica from a snapshot",
        ) from err
    except ValueError as err:
        raise InvalidRecordError(
            f"invalid log record at seq {rec.first_seq}: {err}",
            seq=rec.first_seq,
            hint=INVALID_HINT,
        ) from err
    if new_head != rec.hash_head:
        raise ChainError(
            f"hash chain mismatch in record at seq {rec.first_seq}: the source's "
            "log differs from this store's",
            seq=rec.first_seq,
            hint="re-bootstrap this replica from a snapshot",
        )
    txn = t.txn
    t.max_key = codec.apply_entries(
        raw, txn.get, txn.put, txn.delete, t.rare, t.doc, delta, t.max_key, t.append
    )
    txlog.put_record(txn, t.dbs, rec.first_seq, rec.header, rec.payload)
