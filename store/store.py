"""The store: one LMDB environment holding data, log and meta, changed only by batches.

Contract:

- `apply()` turns a batch of ops into ONE write transaction holding the data changes, their
  log record (one seq per change, snappy payload, hash chain) and the usage counters. LMDB
  commits it atomically and durably (fsync) unless the store was opened with ``sync=False``.
- `apply_log_record()` is the replica's apply: a source's log record, checked for seq
  continuity, CRC and the hash chain, applied in one transaction, stored byte-identical.
- Readers (`get`, `reader()`) use short read transactions and never wait for the writer
  (LMDB MVCC), in this process or another one that opens the same directory.
- One writer at a time: LMDB serialises write transactions, across processes too.
- Errors: StoreFullError when the map is full (nothing of the batch applied), CRCError when a
  stored value fails its CRC (never returned), ChainError on a broken chain or seq gap.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import cramjam
import lmdb
import snappy

from core import failpoints
from core.errors import (
    ChainError,
    CorruptionError,
    CRCError,
    LogRetentionError,
    NewerFormatError,
    PendingMigrationsError,
    StoreError,
    StoreExistsError,
    StoreFullError,
)
from store import chunks, codec, layout
from store.applyloop import forget
from store.format import (
    FLAG_CHUNKED,
    LOG_HEADER,
    OP_SET,
    ZERO_HASH,
    check_chunked_record,
    decode_log_header,
    encode_log_header,
    log_crc_ok,
)
from store.layout import (
    BE64,
    K_CREATED,
    K_DB_ID,
    K_FORMAT,
    K_HASH_HEAD,
    K_LAST_SEQ,
    K_LOG_BASE_HASH,
    K_LOG_FIRST,
    U32,
    U64,
)
from store.metrics import CRC_FAILURES
from store.ops import ApplyResult, LogRecord, Op, Result, Value
from store.usage import USAGE_PREFIX, Usage, stored_bytes, usage_key

#: Longest time duplicate/throttle counters stay in memory before they are committed.
COUNTER_DEFER_S = 60.0
#: Format written by this code. Format 1 had no usage counters (see migrations/).
CURRENT_FORMAT = 2
#: Given a batch's real results, the (idempotency key, answer) records to store with it.
AnswersFn = Callable[[list[Result]], Iterable[tuple[bytes, bytes]]]
_LOG_HDR = LOG_HEADER.size


def now_us() -> int:
    """Wall clock in microseconds since the epoch (the log's commit time)."""
    return time.time_ns() // 1000


class Store:
    """An open store. Thread-safe for readers; one `apply` at a time per process is the
    caller's job (the gateway's batcher and the replica's applier are single writers)."""

    def __init__(self, path: str, env: Any, dbs: layout.Dbs, readonly: bool) -> None:
        self.path = path
        self.env = env
        self.dbs = dbs
        self.readonly = readonly
        self._listeners: list[Callable[[int], None]] = []
        self._deferred: dict[str, list[int]] = {}
        self._deferred_since: float | None = None
        self._deferred_lock = threading.Lock()
        with env.begin(db=dbs.meta) as txn:
            raw = txn.get(K_DB_ID)
            if raw is None:
                raise CorruptionError(f"store in {path!r} has no db id")
            self.db_id = str(uuid.UUID(bytes=bytes(raw)))
            self.format_version = int(U32.unpack(txn.get(K_FORMAT))[0])

    # --- lifecycle -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str,
        *,
        db_id: str | None = None,
        format_version: int = CURRENT_FORMAT,
        map_size: int = layout.DEFAULT_MAP_SIZE,
        sync: bool = True,
    ) -> Store:
        """Create an empty store in directory `path` (StoreExistsError if one is there)."""
        if layout.exists(path):
            raise StoreExistsError(
                f"a store already exists in {path!r}", hint="use another DATA_DIR or remove it"
            )
        env, dbs = layout.open_env(path, map_size=map_size, sync=sync, create=True)
        the_id = uuid.UUID(db_id) if db_id else uuid.uuid4()
        with env.begin(write=True, db=dbs.meta) as txn:
            txn.put(K_DB_ID, the_id.bytes)
            txn.put(K_FORMAT, U32.pack(format_version))
            txn.put(K_LAST_SEQ, U64.pack(0))
            txn.put(K_HASH_HEAD, ZERO_HASH)
            txn.put(K_LOG_FIRST, U64.pack(1))
            txn.put(K_LOG_BASE_HASH, ZERO_HASH)
            txn.put(K_CREATED, U64.pack(now_us()))
        return cls(path, env, dbs, readonly=False)

    @classmethod
    def open(
        cls,
        path: str,
        *,
        readonly: bool = False,
        map_size: int = layout.DEFAULT_MAP_SIZE,
        sync: bool = True,
        check_format: bool = True,
    ) -> Store:
        """Open an existing store.

        With `check_format` (the default) a store whose format is older than this code
        raises PendingMigrationsError (run `mercury migrate`), a newer one NewerFormatError.
        """
        version = read_format_version(path)
        if check_format:
            ensure_current_format(path, version)
        env, dbs = layout.open_env(path, readonly=readonly, map_size=map_size, sync=sync)
        return cls(path, env, dbs, readonly)

    def close(self) -> None:
        """Commit deferred counters and close the environment; the Store must not be used
        afterwards."""
        try:
            self.flush_counters()
        finally:
            self.env.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- meta ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """`{"db_id", "format_version", "seq", "hash_head", "log_first_seq"}` (SPEC §3.1)."""
        with self.env.begin(db=self.dbs.meta) as txn:
            return {
                "db_id": self.db_id,
                "format_version": U32.unpack(txn.get(K_FORMAT))[0],
                "seq": U64.unpack(txn.get(K_LAST_SEQ))[0],
                "hash_head": bytes(txn.get(K_HASH_HEAD)).hex(),
                "log_first_seq": U64.unpack(txn.get(K_LOG_FIRST))[0],
            }

    def last_seq(self) -> int:
        """Seq of the last committed change (0 for an empty store)."""
        with self.env.begin(db=self.dbs.meta) as txn:
            return int(U64.unpack(txn.get(K_LAST_SEQ))[0])

    def head(self) -> tuple[int, bytes]:
        """(last seq, hash head) read in one transaction."""
        with self.env.begin(db=self.dbs.meta) as txn:
            return U64.unpack(txn.get(K_LAST_SEQ))[0], bytes(txn.get(K_HASH_HEAD))

    # --- writes ----------------------------------------------------------------------

    def add_commit_listener(self, callback: Callable[[int], None]) -> None:
        """Call `callback(last_seq)` after every commit of this process that logged changes.

        Called in the committing thread, right after the commit; it must be quick and must
        not raise (a replication source uses it to wake its streams).
        """
        self._listeners.append(callback)

    def _committed(self, last_seq: int) -> None:
        for cb in self._listeners:
            cb(last_seq)

    def apply(
        self,
        ops: Sequence[Op],
        *,
        throttled: Mapping[str, int] | None = None,
        answers: AnswersFn | None = None,
        time_us: int | None = None,
    ) -> ApplyResult:
        """Apply `ops` in order in one write transaction; return one Result per op.

        A set whose value equals the stored one is a duplicate: not written, not logged.
        Conditional ops (`expect_seq`) are evaluated here, inside the transaction. Later ops
        see earlier ones of the same batch. `throttled` adds to owners' throttled counters.
        `answers`, when given, is called inside the transaction with the real results (one
        per op, in order) and returns the (idempotency key, answer) records to store in that
        same transaction: a saved answer is what the store did, durable with the batch.
        Raises InvalidOpError before touching anything, StoreFullError when the map is full.
        """
        dbs = self.dbs
        try:
            # The data sub-database is the transaction's default: the per-op calls then
            # pass no keyword argument, which is most of their cost.
            txn = self.env.begin(write=True, db=dbs.data)
            try:
                meta = dbs.meta
                last = U64.unpack(txn.get(K_LAST_SEQ, db=meta))[0]
                head = txn.get(K_HASH_HEAD, db=meta)
                cur = txn.cursor()
                results, entries, seq, delta = codec.apply_ops(
                    ops,
                    txn.get,
                    txn.put,
                    txn.delete,
                    last,
                    _Chunks(txn, dbs.chunks),
                    bytes(cur.key()) if cur.last() else None,
                    cur.put,  # LMDB append mode for keys past the last one
                )
                for owner_name, n in (throttled or {}).items():
                    if n:
                        _bump(delta, owner_name, 5, n)
                idem = list(answers(results)) if answers is not None else []
                if not entries and not idem and self._defer(delta):
                    txn.abort()  # nothing but counters changed: write nothing now
                    return ApplyResult(0, 0, bytes(head), results)
                put = txn.put
                if entries:
                    payload, head = codec.pack_entries(last + 1, entries, bytes(head))
                    self._put_log(txn, last + 1, len(entries), time_us or now_us(), head, payload)
                    put(K_LAST_SEQ, U64.pack(seq), db=meta)
                    put(K_HASH_HEAD, head, db=meta)
                deferred = self._take_deferred()
                try:
                    for owner_name, d in deferred.items():
                        for i, n in enumerate(d):
                            _bump(delta, owner_name, i, n)
                    self._write_usage(txn, delta)
                    for ikey, answer in idem:
                        put(ikey, U64.pack(now_us()) + answer, db=dbs.idem)
                    failpoints.hit("store.apply.before_commit")
                    txn.commit()
                except BaseException:
                    self._restore_deferred(deferred)
                    raise
            except BaseException:
                txn.abort()
                raise
        except lmdb.MapFullError as err:
            raise StoreFullError(
                "store is full: the LMDB map has no room for this batch",
                hint="raise the map size or free space; nothing of the batch was applied",
            ) from err
        except lmdb.Error as err:
            raise StoreError(f"LMDB error while applying a batch: {err}") from err
        first = last + 1 if entries else 0
        if entries:
            self._committed(seq)
        return ApplyResult(first, seq if entries else 0, bytes(head), results)

    # Counters that change without any data change (duplicates, throttling) are deferred:
    # a duplicate-only workload must write nothing to disk. They are committed with the
    # next batch that writes anything, by `flush_counters` (at most `COUNTER_DEFER_S`
    # late) or on close; a crash loses at most that much of these statistics, never data.

    def _defer(self, delta: dict[str, list[int]]) -> bool:
        """Keep `delta` in memory when it only holds duplicates/throttled counts."""
        if any(d[0] or d[1] or d[2] or d[3] for d in delta.values()):
            return False
        with self._deferred_lock:
            if self._deferred_since is not None and (
                time.monotonic() - self._deferred_since > COUNTER_DEFER_S
            ):
                return False  # long enough in memory: commit them with this batch
            for owner, d in delta.items():
                for i, n in enumerate(d):
                    if n:
                        _bump(self._deferred, owner, i, n)
                        if self._deferred_since is None:
                            self._deferred_since = time.monotonic()
        return True

    def _take_deferred(self) -> dict[str, list[int]]:
        with self._deferred_lock:
            out, self._deferred, self._deferred_since = self._deferred, {}, None
        return out

    def _restore_deferred(self, deferred: dict[str, list[int]]) -> None:
        with self._deferred_lock:
            for owner, d in deferred.items():
                for i, n in enumerate(d):
                    _bump(self._deferred, owner, i, n)
            if deferred and self._deferred_since is None:
                self._deferred_since = time.monotonic()

    def flush_counters(self) -> None:
        """Commit deferred duplicate/throttle counters now (a no-op when there are none)."""
        if self.readonly or self.format_version < 2:
            return
        deferred = self._take_deferred()
        if not deferred:
            return
        try:
            with self.env.begin(write=True) as txn:
                self._write_usage(txn, deferred)
        except BaseException:
            self._restore_deferred(deferred)
            raise

    def _write_usage(self, txn: Any, delta: dict[str, list[int]]) -> None:
        if self.format_version < 2:
            return  # format 1 kept no counters; `mercury migrate` backfills them
        meta = self.dbs.meta
        for owner, d in delta.items():
            k = usage_key(owner)
            u = Usage.decode(txn.get(k, db=meta))
            u.add(Usage(*d))
            txn.put(k, u.encode(), db=meta)

    def _put_log(
        self, txn: Any, first: int, count: int, time_us: int, head: bytes, payload: bytes
    ) -> None:
        comp = snappy.compress(payload)
        header = encode_log_header(0, first, count, time_us, head, comp)
        self._store_log_record(txn, first, header, comp)
        failpoints.hit("store.apply.log_written")

    def _store_log_record(self, txn: Any, first: int, header: bytes, comp: bytes) -> None:
        if chunks.is_chunked(len(comp)):
            chunks.put(txn, self.dbs.chunks, chunks.LOG_NS, first, comp)
            txn.put(BE64.pack(first), header, db=self.dbs.log, append=True)
        else:
            txn.put(BE64.pack(first), header + comp, db=self.dbs.log, append=True)

    def apply_log_record(self, rec: LogRecord) -> None:
        """Apply a source's log record (a replica's only write path).

        Checks the record's CRC, that it starts right after this store's last seq, that its
        entries are contiguous and that the hash chain from this store's head reproduces
        the record's head; then applies it in one transaction and stores it byte-identical.
        Raises ChainError (gap, overlap or chain mismatch) or CorruptionError (bad CRC or
        payload) and changes nothing in either case.
        """
        self.apply_log_records([rec])

    def apply_log_records(self, recs: Sequence[LogRecord]) -> None:
        """Apply consecutive log records in ONE transaction (a catching-up replica).

        Each record gets the checks of `apply_log_record`; the records stay separate in the
        log (byte-identical to the source's). All or nothing: on any error nothing of the
        group is applied — a caller that wants the good prefix applies one by one.
        """
        if not recs:
            return
        raws = [_payload(rec) for rec in recs]
        dbs = self.dbs
        try:
            with self.env.begin(write=True, db=dbs.data) as txn:
                last = U64.unpack(txn.get(K_LAST_SEQ, db=dbs.meta))[0]
                head = bytes(txn.get(K_HASH_HEAD, db=dbs.meta))
                delta: dict[str, list[int]] = {}
                for rec, raw in zip(recs, raws, strict=True):
                    self._apply_record(txn, rec, raw, last, head, delta)
                    last, head = rec.last_seq, rec.hash_head
                self._write_usage(txn, delta)
                txn.put(K_LAST_SEQ, U64.pack(last), db=dbs.meta)
                txn.put(K_HASH_HEAD, head, db=dbs.meta)
        except lmdb.MapFullError as err:
            raise StoreFullError("store is full while applying a replicated batch") from err
        self._committed(recs[-1].last_seq)

    def _apply_record(
        self,
        txn: Any,
        rec: LogRecord,
        raw: Any,
        last: int,
        head: bytes,
        delta: dict[str, list[int]],
    ) -> None:
        """Check one record against (last, head) and apply it inside `txn`."""
        dbs = self.dbs
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
        rare = _Chunks(txn, dbs.chunks)
        for e in entries:
            old = get(e.key)
            if old is not None:
                forget(codec.decode_record_header(old), len(e.key), delta, rare)
            if e.op == OP_SET:
                owner = e.owner.encode()
                big = chunks.is_chunked(len(e.value))
                if big:
                    chunks.put(txn, dbs.chunks, chunks.VALUE_NS, e.seq, e.value)
                put(e.key, codec.encode_record(e.seq, owner, e.value, big))
                d = delta.get(e.owner)
                if d is None:
                    d = delta[e.owner] = [0, 0, 0, 0, 0, 0]
                d[0] += 1
                d[1] += stored_bytes(len(e.key), len(e.value), len(owner))
                d[2] += 1
            else:
                txn.delete(e.key)
                _bump(delta, e.owner, 3, 1)
        self._store_log_record(txn, rec.first_seq, rec.header, rec.payload)

    # --- reads -----------------------------------------------------------------------

    def get(self, key: bytes) -> Value | None:
        """The value of `key` and its version, or None. Raises CRCError, never bad bytes."""
        with self.env.begin(db=self.dbs.data) as txn:
            rec = txn.get(key)
            if rec is None:
                return None
            return self._decode(txn, key, rec)

    def version(self, key: bytes) -> int:
        """Seq of the last change of `key` (0 when absent), without reading the value."""
        with self.env.begin(db=self.dbs.data) as txn:
            rec = txn.get(key)
            return 0 if rec is None else int(codec.decode_record_header(rec).seq)

    @contextmanager
    def reader(self) -> Iterator[Reader]:
        """A short read transaction for several reads seeing one consistent state.

        Keep it short: a read transaction held across many commits makes LMDB grow the file.
        """
        with self.env.begin(db=self.dbs.data) as txn:
            yield Reader(self, txn)

    def _decode(self, txn: Any, key: bytes, rec: bytes) -> Value:
        try:
            h = codec.decode_record_header(rec)
            if h.flags & FLAG_CHUNKED:
                value = chunks.get(txn, self.dbs.chunks, chunks.VALUE_NS, h.seq, h.vlen)
                ok = value is not None and check_chunked_record(rec, value)
            else:
                value = codec.record_value(rec)
                ok = value is not None
        except ValueError:
            ok, value, h = False, None, None
        if not ok or value is None or h is None:
            CRC_FAILURES.inc()
            raise CRCError(
                f"stored value of key {key!r} fails its CRC; not served",
                key=key,
                hint="run `mercury verify`; re-bootstrap this node from a healthy one",
            )
        return Value(value, h.seq, h.owner)

    # --- log -------------------------------------------------------------------------

    def read_log(
        self, from_seq: int, *, max_records: int = 1000, max_bytes: int = 8 << 20
    ) -> list[LogRecord]:
        """Log records from the one holding `from_seq` on, in seq order, bounded in count
        and bytes (at least one record is returned when one exists).

        Raises LogRetentionError when `from_seq` is older than the retained log.
        """
        out: list[LogRecord] = []
        with self.env.begin() as txn:
            first = U64.unpack(txn.get(K_LOG_FIRST, db=self.dbs.meta))[0]
            if from_seq < first:
                raise LogRetentionError(
                    f"seq {from_seq} is no longer retained (log starts at {first})",
                    seq=from_seq,
                    hint="bootstrap from a snapshot",
                )
            cur = txn.cursor(db=self.dbs.log)
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
                rec = self._log_record(txn, k, v)
                if rec.last_seq < from_seq:
                    continue
                out.append(rec)
                size += len(rec.payload)
                if len(out) >= max_records or size >= max_bytes:
                    break
        return out

    def _log_record(self, txn: Any, k: bytes, v: bytes) -> LogRecord:
        header = bytes(v[:_LOG_HDR])
        h = decode_log_header(header)
        if len(v) == _LOG_HDR and h.plen > 0:
            payload = chunks.get(txn, self.dbs.chunks, chunks.LOG_NS, h.first_seq, h.plen)
            if payload is None:
                raise CorruptionError(f"log record at seq {h.first_seq} lost chunks")
        else:
            payload = bytes(v[_LOG_HDR:])
        return LogRecord(h.first_seq, h.num_entries, h.time_us, h.hash_head, header, payload)

    def log_bounds(self) -> tuple[int, bytes]:
        """(first retained seq, hash head before it)."""
        with self.env.begin(db=self.dbs.meta) as txn:
            return U64.unpack(txn.get(K_LOG_FIRST))[0], bytes(txn.get(K_LOG_BASE_HASH))

    def gc_log(
        self,
        *,
        keep_entries: int | None = None,
        keep_seconds: float | None = None,
        min_entries: int = 0,
        max_records: int = 10_000,
        time_us: int | None = None,
    ) -> int:
        """Drop the oldest log records beyond the retention policy; return entries dropped.

        A record goes when it is more than `keep_entries` entries behind the head or older
        than `keep_seconds` — but never when that would leave fewer than `min_entries`
        entries (the floor). With neither bound set nothing is dropped. At most
        `max_records` records per call, so the write transaction stays short.
        """
        if keep_entries is None and keep_seconds is None:
            return 0
        now = time_us or now_us()
        dropped = 0
        with self.env.begin(write=True) as txn:
            meta = self.dbs.meta
            last = U64.unpack(txn.get(K_LAST_SEQ, db=meta))[0]
            cur = txn.cursor(db=self.dbs.log)
            n = 0
            new_first, base = None, None
            while cur.first() and n < max_records:
                h = decode_log_header(cur.value()[:_LOG_HDR])
                last_of = h.first_seq + h.num_entries - 1
                remaining = last - last_of
                old_by_count = keep_entries is not None and remaining >= keep_entries
                old_by_age = keep_seconds is not None and h.time_us < now - keep_seconds * 1e6
                if not (old_by_count or old_by_age) or remaining < min_entries:
                    break
                if len(cur.value()) == _LOG_HDR and h.plen > 0:
                    chunks.delete(txn, self.dbs.chunks, chunks.LOG_NS, h.first_seq, h.plen)
                cur.delete()
                dropped += h.num_entries
                new_first, base = last_of + 1, h.hash_head
                n += 1
            if new_first is not None and base is not None:
                txn.put(K_LOG_FIRST, U64.pack(new_first), db=meta)
                txn.put(K_LOG_BASE_HASH, base, db=meta)
        return dropped

    # --- node documents, idempotency, usage ------------------------------------------

    def get_state(self, name: str) -> bytes | None:
        """A named document of this node (ACL, admin token hash), or None."""
        with self.env.begin(db=self.dbs.state) as txn:
            raw = txn.get(name.encode())
            return None if raw is None else bytes(raw)

    def put_state(self, name: str, value: bytes) -> None:
        """Store a named document of this node in its own transaction."""
        with self.env.begin(write=True, db=self.dbs.state) as txn:
            txn.put(name.encode(), value)

    def get_idempotent(self, key: bytes) -> tuple[int, bytes] | None:
        """(time stored in µs, answer) of an idempotency key, or None."""
        with self.env.begin(db=self.dbs.idem) as txn:
            raw = txn.get(key)
            if raw is None:
                return None
            return U64.unpack(raw[:8])[0], bytes(raw[8:])

    def gc_idempotency(self, older_than_us: int, max_keys: int = 10_000) -> int:
        """Forget idempotency keys stored before `older_than_us`; return how many."""
        n = 0
        with self.env.begin(write=True, db=self.dbs.idem) as txn:
            cur = txn.cursor()
            ok = cur.first()
            while ok and n < max_keys:
                if U64.unpack(cur.value()[:8])[0] < older_than_us:
                    ok = cur.delete()
                    n += 1
                else:
                    ok = cur.next()
        return n

    def usage(self) -> dict[str, Usage]:
        """Usage counters of every owner, maintained by `apply` (no scan)."""
        out: dict[str, Usage] = {}
        n = len(USAGE_PREFIX)
        with self.env.begin(db=self.dbs.meta) as txn:
            cur = txn.cursor()
            if cur.set_range(USAGE_PREFIX):
                for k, v in cur:
                    if not k.startswith(USAGE_PREFIX):
                        break
                    out[bytes(k[n:]).decode()] = Usage.decode(bytes(v))
        with self._deferred_lock:
            for owner, d in self._deferred.items():
                out.setdefault(owner, Usage()).add(Usage(*d))
        return out

    def stat(self) -> dict[str, int]:
        """LMDB-level facts: map size, file size, pages in use, entries per sub-database."""
        info = self.env.info()
        out = {
            "map_size": info["map_size"],
            "file_size": os.path.getsize(layout.data_file(self.path)),
            "last_pgno": info["last_pgno"],
        }
        with self.env.begin() as txn:
            for name in layout.ALL_DBS:
                db = getattr(self.dbs, name.decode())
                out[f"entries_{name.decode()}"] = txn.stat(db)["entries"]
        return out


class _Chunks:
    """`applyloop.Rare` over one write transaction: the chunked-value paths of apply."""

    def __init__(self, txn: Any, db: Any) -> None:
        self._txn = txn
        self._db = db

    def chunked_equal(self, seq: int, vlen: int, value: bytes) -> bool:
        return chunks.get(self._txn, self._db, chunks.VALUE_NS, seq, vlen) == value

    def put_chunks(self, seq: int, value: bytes) -> None:
        chunks.put(self._txn, self._db, chunks.VALUE_NS, seq, value)

    def drop_chunks(self, seq: int, vlen: int) -> None:
        chunks.delete(self._txn, self._db, chunks.VALUE_NS, seq, vlen)


class Reader:
    """Reads inside one short read transaction (see `Store.reader`)."""

    def __init__(self, store: Store, txn: Any) -> None:
        self._store = store
        self._txn = txn

    def get(self, key: bytes) -> Value | None:
        """The value of `key`, or None. Raises CRCError."""
        rec = self._txn.get(key)
        return None if rec is None else self._store._decode(self._txn, key, rec)

    def get_many(self, keys: Iterable[bytes]) -> list[Value | None]:
        """Values of `keys`, in order (None where absent)."""
        return [self.get(k) for k in keys]

    def scan(
        self,
        *,
        start: bytes = b"",
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> Iterator[tuple[bytes, Value | None]]:
        """Keys in order from `start` (inclusive) to `end` (exclusive) and/or under `prefix`;
        values are None when `keys_only`. At most `limit` items."""
        if prefix is not None and start < prefix:
            start = prefix
        cur = self._txn.cursor()
        if not cur.set_range(start):
            return
        for n, (k, v) in enumerate(cur):
            if end is not None and k >= end:
                return
            if prefix is not None and not k.startswith(prefix):
                return
            if limit is not None and n >= limit:
                return
            yield k, None if keys_only else self._store._decode(self._txn, k, v)


def _payload(rec: LogRecord) -> memoryview:
    """The checked, decompressed payload of `rec` (CorruptionError when it is not)."""
    if not log_crc_ok(rec.header, rec.payload):
        raise CorruptionError(f"log record at seq {rec.first_seq} fails its CRC")
    try:
        return memoryview(cramjam.snappy.decompress_raw(rec.payload))
    except Exception as err:  # snappy raises its own error types on garbage
        raise CorruptionError(f"log record at seq {rec.first_seq}: bad payload") from err


def _bump(delta: dict[str, list[int]], owner: str, idx: int, n: int) -> None:
    d = delta.get(owner)
    if d is None:
        d = delta[owner] = [0, 0, 0, 0, 0, 0]
    d[idx] += n


def read_format_version(path: str) -> int:
    """The format version recorded in the store at `path` (opens it briefly, read-only)."""
    env = (
        lmdb.open(
            path,
            readonly=True,
            max_dbs=len(layout.ALL_DBS) + 2,
            lock=True,
            map_size=layout.DEFAULT_MAP_SIZE,
        )
        if layout.exists(path)
        else None
    )
    if env is None:
        layout.open_env(path)  # raises StoreNotFoundError with its hint
        raise AssertionError("unreachable")
    try:
        with env.begin() as txn:
            meta = env.open_db(layout.META, txn=txn, create=False)
            raw = txn.get(K_FORMAT, db=meta)
            if raw is None:
                raise CorruptionError(f"store in {path!r} records no format version")
            return int(U32.unpack(raw)[0])
    finally:
        env.close()


def ensure_current_format(path: str, version: int) -> None:
    """Refuse a store whose format differs from `CURRENT_FORMAT`, saying what to run."""
    if version < CURRENT_FORMAT:
        raise PendingMigrationsError(
            f"store in {path!r} is at format {version}; this Mercury needs {CURRENT_FORMAT}",
            hint=f"run `mercury migrate {path}` (`--dry-run` lists the steps)",
        )
    if version > CURRENT_FORMAT:
        raise NewerFormatError(
            f"store in {path!r} is at format {version}, newer than this Mercury ({CURRENT_FORMAT})",
            hint="run a Mercury release that knows this format; never downgrade a store",
        )
