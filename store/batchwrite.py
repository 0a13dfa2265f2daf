"""The root's write path: one batch of ops -> ONE LMDB write transaction.

The transaction holds the data changes (decided op by op by `codec.apply_ops`), their log
record (one seq per change, hash chain), the usage counters and, when the caller asks, the
idempotency answers built from the real results (stored and logged as the record's last
entries, so replicas hold them too) — all committed together (fsync unless the
store was opened with ``sync=False``). A batch that changes nothing but duplicate/throttled
counters writes nothing (`store.counters.DeferredCounters`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lmdb

from core import failpoints
from core.errors import CorruptionError
from store import chunks, codec, docs, expiry, layout, nodedocs, txlog
from store.counters import DeferredCounters, KeyspaceCounts, bump, read_keyspaces, write_usage
from store.layout import K_HASH_HEAD, K_LAST_SEQ, U64
from store.lmdberrors import translate, writing
from store.ops import ApplyResult, Op, Result
from store.usage import KsTable

#: Given a batch's real results, the (idempotency key, answer) records to store with it.
AnswersFn = Callable[[list[Result]], Iterable[tuple[bytes, bytes]]]


def now_us() -> int:
    """Wall clock in microseconds since the epoch (the log's commit time)."""
    return time.time_ns() // 1000


class BatchWriter:
    """Applies batches to one environment; one `apply` at a time (the caller's job)."""

    def __init__(self, path: str, env: Any, dbs: layout.Dbs, *, counted: bool, chain: int) -> None:
        self._path = path
        self._env = env
        self._dbs = dbs
        #: The store's chain hash code (`store/chainhash.py`).
        self._chain = chain
        #: Format 1 kept no usage counters (`mercury migrate` backfills them).
        self._counted = counted
        self.deferred = DeferredCounters()
        #: Keys/bytes per keyspace of the owners with several (`set_keyspaces`).
        self.by_keyspace = KeyspaceCounts()

    def apply(
        self,
        ops: Sequence[Op],
        *,
        throttled: Mapping[str, int] | None,
        answers: AnswersFn | None,
        time_us: int | None,
        doc_changes: docs.DocChanges | None = None,
    ) -> ApplyResult:
        """See `Store.apply`."""
        dbs = self._dbs
        doc_entries = docs.entries(doc_changes) if doc_changes else []
        try:
            # The data sub-database is the transaction's default: the per-op calls then
            # pass no keyword argument, which is most of their cost.
            txn = self._env.begin(write=True, db=dbs.data)
            try:
                meta = dbs.meta
                last = U64.unpack(txn.get(K_LAST_SEQ, db=meta))[0]
                head = bytes(txn.get(K_HASH_HEAD, db=meta))
                cur = txn.cursor()
                by_ks = self.by_keyspace
                ks_whole = by_ks.whole(ops) if self._counted and by_ks.table else None
                ks_prev = by_ks.before(ops, txn.get) if self._counted and not ks_whole else None
                results, entries, seq, delta = codec.apply_ops(
                    ops,
                    txn.get,
                    txn.put,
                    txn.delete,
                    last,
                    ValueChunks(txn, dbs.chunks, dbs.expiry),
                    bytes(cur.key()) if cur.last() else None,
                    Appender(cur),  # LMDB append mode for keys past the last one
                )
                if ks_whole is not None:
                    od = delta.get(ks_whole[0])
                    ks_delta = {ks_whole: [od[0], od[1]]} if od else {}
                for owner_name, n in (throttled or {}).items():
                    if n:
                        bump(delta, owner_name, 5, n)
                # Replicated documents follow the batch's changes in its log record.
                for _op, _owner, dkey, dvalue in doc_entries:
                    seq += 1
                    docs.apply_entry(txn, dbs, seq, dkey, dvalue)
                    entries.append((_op, _owner, dkey, dvalue))
                stamp = time_us or now_us()
                # Idempotency answers close the record: logged, so every node that applies
                # it holds them byte for byte (`store/nodedocs.py`).
                if answers is not None:
                    for ikey, answer in answers(results):
                        seq += 1
                        ent = nodedocs.answer_entry(ikey, stamp, answer)
                        nodedocs.apply_answer(txn, dbs, ent[2], ent[3])
                        entries.append(ent)
                if not entries and self.deferred.defer(delta):
                    txn.abort()  # nothing but counters changed: write nothing now
                    return ApplyResult(0, 0, head, results)
                put = txn.put
                if entries:
                    payload, head = codec.pack_entries(last + 1, entries, head, self._chain)
                    txlog.put_batch(txn, dbs, last + 1, len(entries), stamp, head, payload)
                    put(K_LAST_SEQ, U64.pack(seq), db=meta)
                    put(K_HASH_HEAD, head, db=meta)
                taken = self.deferred.take()
                try:
                    for owner_name, d in taken.items():
                        for i, n in enumerate(d):
                            bump(delta, owner_name, i, n)
                    if self._counted:
                        write_usage(txn, meta, delta)
                        if by_ks.table and entries:
                            if ks_whole is None:
                                ks_delta = by_ks.delta(ops, results, ks_prev) if ks_prev else {}
                            by_ks.write(txn, meta, ks_delta, seq)
                    failpoints.hit("store.apply.before_commit")
                    txn.commit()
                except BaseException:
                    self.deferred.restore(taken)
                    raise
            except BaseException:
                txn.abort()
                raise
        except lmdb.Error as err:
            raise translate(err, self._path, "applying a batch") from err
        if not entries:
            return ApplyResult(0, 0, head, results)
        return ApplyResult(last + 1, seq, head, results)

    def flush_counters(self) -> None:
        """Commit deferred duplicate/throttle counters now (a no-op when there are none)."""
        if not self._counted:
            return
        taken = self.deferred.take()
        if not taken:
            return
        try:
            with (
                writing(self._path, "committing usage counters"),
                self._env.begin(write=True) as txn,
            ):
                write_usage(txn, self._dbs.meta, taken)
        except BaseException:
            self.deferred.restore(taken)
            raise

    def set_keyspaces(self, table: KsTable) -> list[str]:
        """Track keys/bytes per keyspace for `table`'s owners from now on, recounting
        (one scan of their keyspaces, in one write transaction) those whose stored figures
        are not known exact. The owners recounted."""
        self.by_keyspace.set_table(table)
        if not self._counted or not table:
            return []
        with (
            writing(self._path, "counting keys per keyspace"),
            self._env.begin(write=True) as txn,
        ):
            last = U64.unpack(txn.get(K_LAST_SEQ, db=self._dbs.meta))[0]
            return self.by_keyspace.recount_stale(txn, self._dbs.data, self._dbs.meta, last)

    def keyspace_usage(self, owner: str) -> dict[str, tuple[int, int]]:
        """(keys, stored bytes) per keyspace of a tracked `owner` (empty for others)."""
        if owner not in self.by_keyspace.table:
            return {}
        with self._env.begin() as txn:
            got = read_keyspaces(txn, self._dbs.meta, owner)
        return {ks.decode(): v for ks, v in got.items()}


class Appender:
    """`applyloop.apply_ops`'s `append`: runs of records whose keys are past the data's
    last one, put in LMDB's append mode by one `putmulti` (its loop in C: no Python call
    and argument parsing per op)."""

    def __init__(self, cur: Any) -> None:
        self._putmulti = cur.putmulti

    def __call__(self, items: list[tuple[bytes, bytes]]) -> None:
        _, added = self._putmulti(items, append=True)
        if added != len(items):  # apply_ops hands only keys past the last: never happens
            raise CorruptionError(
                f"LMDB refused {len(items) - added} of {len(items)} appends past the last key"
            )


class ValueChunks:
    """`applyloop.Rare` over one write transaction: the chunked-value and deadline paths
    of apply."""

    def __init__(self, txn: Any, db: Any, expiry_db: Any) -> None:
        self._txn = txn
        self._db = db
        self._expiry = expiry_db

    def deadline(self, key: bytes) -> int:
        return expiry.get(self._txn, self._expiry, key)

    def set_deadline(self, key: bytes, deadline_us: int) -> None:
        expiry.put(self._txn, self._expiry, key, deadline_us)

    def clear_deadline(self, key: bytes) -> None:
        expiry.clear(self._txn, self._expiry, key)

    def chunked_equal(self, seq: int, vlen: int, value: bytes) -> bool:
        return chunks.get(self._txn, self._db, chunks.VALUE_NS, seq, vlen) == value

    def put_chunks(self, seq: int, value: bytes | memoryview) -> None:
        chunks.put(self._txn, self._db, chunks.VALUE_NS, seq, value)

    def drop_chunks(self, seq: int, vlen: int) -> None:
        chunks.delete(self._txn, self._db, chunks.VALUE_NS, seq, vlen)
