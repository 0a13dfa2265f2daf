"""The store: one LMDB environment holding data, log and meta, changed only by batches.

`Store` is the facade the rest of Mercury imports; each concept lives in its own module:

- `store/batchwrite.py` — `apply()`: a batch of ops -> ONE write transaction holding the
  data changes, their log record (one seq per change, snappy payload, hash chain), the usage
  counters and the idempotency answers built from the real results. LMDB commits it
  atomically and durably (fsync) unless the store was opened with ``sync=False``.
  Duplicate/throttle-only counters wait in memory (`store/counters.py`).
- `store/replica_apply.py` — `apply_log_record()`, the replica's apply: a source's log
  record, checked for seq continuity, CRC and the hash chain, stored byte-identical.
- `store/txlog.py` — the log records in LMDB: read, retention GC.
- `store/nodedocs.py` — idempotency answers (logged with their batch since format 5) and
  node-local documents (never replicated).
- `store/reader.py` — reads (`get`, `reader()`) in short read transactions that never wait
  for the writer (LMDB MVCC), in this process or another one on the same directory.
- `store/version.py` — the format version; `store/migration.py` — the migrations' seam.

One writer at a time: LMDB serialises write transactions, across processes too.
Errors: StoreFullError when the map or the disk is full (nothing of the batch applied;
`store/lmdberrors.py` says how a full disk is told from a failing one), CRCError when a
stored value fails its CRC (never returned), ChainError on a broken chain or seq gap.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from core.commitgate import CommitGate
from core.errors import CorruptionError, StoreExistsError
from store import chainhash, codec, docs, expiry, layout, nodedocs, replica_apply, txlog
from store.batchwrite import AnswersFn, BatchWriter, now_us
from store.counters import COUNTER_DEFER_S
from store.format import ZERO_HASH
from store.layout import (
    K_CHAIN_HASH,
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
from store.lmdberrors import writing
from store.ops import ApplyResult, LogRecord, Op, Value
from store.reader import Reader, decode
from store.usage import USAGE_PREFIX, Usage, ks_table
from store.version import CURRENT_FORMAT, ensure_current_format, read_format_version

__all__ = [
    "COUNTER_DEFER_S",
    "CURRENT_FORMAT",
    "AnswersFn",
    "Reader",
    "Store",
    "ensure_current_format",
    "now_us",
    "read_format_version",
]


class Store:
    """An open store. Thread-safe for readers; one `apply` at a time per process is the
    caller's job (the gateway's batcher and the replica's applier are single writers)."""

    def __init__(self, path: str, env: Any, dbs: layout.Dbs, readonly: bool) -> None:
        self.path = path
        self.env = env
        self.dbs = dbs
        self.readonly = readonly
        self._listeners: list[Callable[[int], None]] = []
        #: Commits of `apply` in flight: sliced bulk reads on the same process wait for
        #: them to end between slices (`core/commitgate.py`, `net/tcp.py`).
        self.commit_gate = CommitGate()
        with env.begin(db=dbs.meta) as txn:
            raw = txn.get(K_DB_ID)
            if raw is None:
                raise CorruptionError(f"store in {path!r} has no db id")
            self.db_id = str(uuid.UUID(bytes=bytes(raw)))
            self.format_version = int(U32.unpack(txn.get(K_FORMAT))[0])
            #: The log chain's hash code (`store/chainhash.py`): fixed for the store's life,
            #: so read once here and handed to both write paths.
            self.chain = chainhash.read(txn, dbs.meta)
        # Format 1 kept no usage counters; `mercury migrate` backfills them.
        self._writer = BatchWriter(
            path, env, dbs, counted=self.format_version >= 2, chain=self.chain
        )

    @property
    def chain_hash(self) -> str:
        """The chain hash's name (`sha256`, `blake2b-256`)."""
        return chainhash.NAMES[self.chain]

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
        chain_hash: str | None = None,
    ) -> Store:
        """Create an empty store in directory `path` (StoreExistsError if one is there)
        whose log chains with `chain_hash` (a name of `chainhash.BY_NAME`; None:
        `chainhash.DEFAULT`, or BLAKE2b-256 for an older `format_version`, the only hash
        those know)."""
        if chain_hash is None:
            chain_hash = chainhash.DEFAULT if format_version >= 6 else chainhash.LEGACY
        chainhash.code(chain_hash)  # refuse an unknown name before creating anything
        if format_version < 6 and chain_hash != chainhash.LEGACY:
            raise ValueError(f"a format-{format_version} store chains with {chainhash.LEGACY}")
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
            if format_version >= 6:
                txn.put(K_CHAIN_HASH, chain_hash.encode("ascii"))
        return cls(path, env, dbs, readonly=False)

    @classmethod
    def open(
        cls,
        path: str,
        *,
        readonly: bool = False,
        map_size: int = layout.DEFAULT_MAP_SIZE,
        sync: bool = True,
        last_commit_durable: bool = True,
        check_format: bool = True,
    ) -> Store:
        """Open an existing store.

        With `check_format` (the default) a store whose format is older than this code
        raises PendingMigrationsError (run `mercury migrate`), a newer one NewerFormatError.
        `last_commit_durable=False`: each commit syncs its data but not the page naming it
        the latest (`layout.open_env`'s `meta_sync`); a system crash may then undo the last
        commit, never corrupt the store, and `close` syncs it. For a node that can fetch
        that commit again from its source (a replica), never for one that acknowledges it.
        """
        version = read_format_version(path)
        if check_format:
            ensure_current_format(path, version)
        env, dbs = layout.open_env(
            path, readonly=readonly, map_size=map_size, sync=sync, meta_sync=last_commit_durable
        )
        return cls(path, env, dbs, readonly)

    def close(self) -> None:
        """Commit deferred counters and close the environment; the Store must not be used
        afterwards."""
        try:
            self.flush_counters()
            if self.defers_meta_sync():  # the last commit's meta page, left to a next sync
                self.env.sync(True)
        finally:
            self.env.close()

    def defers_meta_sync(self) -> bool:
        """True for a writable store opened with `last_commit_durable=False` (and sync): its
        last commit's meta page waits for the next sync, which `close` makes."""
        if self.readonly:
            return False
        flags = self.env.flags()
        return bool(flags["sync"] and not flags["metasync"])

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- meta ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """`{"db_id", "format_version", "seq", "hash_head", "log_first_seq"}`: the
        contract of `mercury status --json` (the chain hash is `chain_hash`)."""
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
        doc_changes: docs.DocChanges | None = None,
    ) -> ApplyResult:
        """Apply `ops` in order in one write transaction; return one Result per op.

        A set whose value equals the stored one is a duplicate: not written, not logged.
        Conditional ops (`expect_seq`) are evaluated here, inside the transaction. Later ops
        see earlier ones of the same batch. `throttled` adds to owners' throttled counters.
        `answers`, when given, is called inside the transaction with the real results (one
        per op, in order) and returns the (idempotency key, answer) records to store in that
        same transaction: a saved answer is what the store did, durable with the batch (and
        logged after its changes, one entry each, so replicas hold it: `store/nodedocs.py`).
        `doc_changes` (name -> bytes, or None to remove) are replicated documents written
        through the log in the same transaction, after the ops (`store/docs.py`).
        Raises InvalidOpError before touching anything, StoreFullError when the map is full.
        """
        with self.commit_gate.held():
            out = self._writer.apply(
                ops, throttled=throttled, answers=answers, time_us=time_us, doc_changes=doc_changes
            )
        if out.last_seq:
            self._committed(out.last_seq)
        return out

    def flush_counters(self) -> None:
        """Commit deferred duplicate/throttle counters now (a no-op when there are none)."""
        if not self.readonly:
            self._writer.flush_counters()

    def apply_log_record(self, rec: LogRecord) -> None:
        """Apply a source's log record (a replica's only write path).

        Checks the record's CRC, that it starts right after this store's last seq, that its
        entries are contiguous and that the hash chain from this store's head reproduces
        the record's head; then applies it in one transaction and stores it byte-identical.
        Raises ChainError (gap, overlap or chain mismatch) or CorruptionError (bad CRC or
        payload) and changes nothing in either case.
        """
        self.apply_log_records([rec])

    def apply_log_records(self, recs: Sequence[LogRecord], *, crc_checked: bool = False) -> None:
        """Apply consecutive log records in ONE transaction (a catching-up replica).

        Each record gets the checks of `apply_log_record`; the records stay separate in the
        log (byte-identical to the source's). All or nothing: on any error nothing of the
        group is applied — a caller that wants the good prefix applies one by one.
        `crc_checked`: the caller has checked every record's CRC over these very bytes
        (the replication stream does it with its frame CRC in one pass).
        """
        if not recs:
            return
        replica_apply.apply_records(
            self.path,
            self.env,
            self.dbs,
            recs,
            counted=self.format_version >= 2,
            chain=self.chain,
            crc_checked=crc_checked,
        )
        self._committed(recs[-1].last_seq)

    # --- reads -----------------------------------------------------------------------

    def get(self, key: bytes) -> Value | None:
        """The value of `key` and its version, or None. Raises CRCError, never bad bytes."""
        with self.env.begin(db=self.dbs.data) as txn:
            rec = txn.get(key)
            if rec is None:
                return None
            return decode(txn, self.dbs.chunks, key, rec, self.dbs.expiry)

    def record(self, key: bytes) -> tuple[bytes | None, int]:
        """(the stored record of `key` or None, the last seq), read in one short transaction.

        The record is raw: its CRC is NOT checked here. Only for read fast paths that check
        it themselves and take `get` for anything they do not serve (`reads/fastget.py`).
        """
        with self.env.begin(db=self.dbs.data) as txn:
            return txn.get(key), U64.unpack(txn.get(K_LAST_SEQ, db=self.dbs.meta))[0]

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
            yield Reader(txn, self.dbs.chunks, self.dbs.meta, self.dbs.expiry)

    # --- deadlines (format >= 7) --------------------------------------------------------

    def due_expiries(self, now_us: int, limit: int) -> list[tuple[bytes, int, int, str]]:
        """Up to `limit` keys whose deadline is at or before `now_us`, earliest first, as
        (key, deadline µs, seq of the record that set it, owner): what the root's expirer
        logs as conditional EXPIRE ops (`gateway/expirer.py`)."""
        out: list[tuple[bytes, int, int, str]] = []
        with self.env.begin(db=self.dbs.data) as txn:
            for key, deadline in expiry.due(txn, self.dbs.expiry, now_us, limit):
                rec = txn.get(key)
                if rec is None:  # an index entry without its key: never written so
                    continue
                h = codec.decode_record_header(rec)
                out.append((key, deadline, int(h.seq), h.owner))
        return out

    def expiry_backlog(self, now_us: int, cap: int) -> int:
        """How many deadlines are due at `now_us` (counted up to `cap`)."""
        with self.env.begin() as txn:
            return expiry.count_due(txn, self.dbs.expiry, now_us, cap)

    def next_deadline(self) -> int:
        """The earliest deadline of any key (µs since the epoch), 0 when none."""
        with self.env.begin() as txn:
            return expiry.next_deadline(txn, self.dbs.expiry)

    # --- log -------------------------------------------------------------------------

    def read_log(
        self,
        from_seq: int,
        *,
        max_records: int = 1000,
        max_bytes: int = 8 << 20,
        within: bool = False,
    ) -> list[LogRecord]:
        """Log records from the one holding `from_seq` on, in seq order, bounded in count
        and bytes (at least one record is returned when one exists, unless `within`: then
        never more than `max_bytes` of payload, possibly none).

        Raises LogRetentionError when `from_seq` is older than the retained log.
        """
        with self.env.begin() as txn:
            return txlog.read(
                txn, self.dbs, from_seq, max_records=max_records, max_bytes=max_bytes, within=within
            )

    def retained(self) -> tuple[int, int | None]:
        """(first retained seq, the root's commit time in µs of the oldest retained record,
        None when the log holds none), read in one transaction."""
        with self.env.begin() as txn:
            first = U64.unpack(txn.get(K_LOG_FIRST, db=self.dbs.meta))[0]
            return first, txlog.oldest_time_us(txn, self.dbs)

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
        with self.env.begin(write=True) as txn:
            return txlog.gc(
                txn,
                self.dbs,
                keep_entries=keep_entries,
                keep_seconds=keep_seconds,
                min_entries=min_entries,
                max_records=max_records,
                now_us=time_us or now_us(),
            )

    # --- replicated documents ---------------------------------------------------------

    def put_docs(self, changes: docs.DocChanges, *, time_us: int | None = None) -> ApplyResult:
        """Write replicated documents (name -> bytes, or None to remove) through the log in
        a transaction of their own; every replica applies them from the log."""
        return self.apply([], time_us=time_us, doc_changes=changes)

    def get_doc(self, name: str) -> docs.Doc | None:
        """Replicated document `name` (its bytes and the seq that wrote it), or None."""
        return docs.get(self.env, self.dbs, name)

    def scan_docs(
        self, prefix: str, *, after: str = "", limit: int = 1000
    ) -> list[tuple[str, docs.Doc]]:
        """Replicated documents named `prefix`..., after `after`, in name order."""
        return docs.scan(self.env, self.dbs, prefix, after=after, limit=limit)

    # --- node documents, idempotency, usage ------------------------------------------

    def get_state(self, name: str) -> bytes | None:
        """A node-local document, or None; never replicated."""
        return nodedocs.get_state(self.env, self.dbs, name)

    def put_state(self, name: str, value: bytes) -> None:
        """Store a named document of this node in its own transaction."""
        with writing(self.path, f"storing the node document {name!r}"):
            nodedocs.put_state(self.env, self.dbs, name, value)

    def get_idempotent(self, key: bytes) -> tuple[int, bytes] | None:
        """(time stored in µs, answer) of an idempotency key, or None."""
        return nodedocs.get_idempotent(self.env, self.dbs, key)

    def gc_idempotency(self, older_than_us: int, max_keys: int = 10_000) -> int:
        """Forget idempotency keys stored before `older_than_us`; return how many."""
        return nodedocs.gc_idempotency(self.env, self.dbs, older_than_us, max_keys)

    def usage(self) -> dict[str, Usage]:
        """Usage counters of every owner, maintained by `apply` (no scan), including the
        deferred ones not committed yet."""
        out: dict[str, Usage] = {}
        n = len(USAGE_PREFIX)
        with self.env.begin(db=self.dbs.meta) as txn:
            cur = txn.cursor()
            if cur.set_range(USAGE_PREFIX):
                for k, v in cur:
                    if not k.startswith(USAGE_PREFIX):
                        break
                    out[bytes(k[n:]).decode()] = Usage.decode(bytes(v))
        self._writer.deferred.add_to(out)
        return out

    def track_keyspaces(self, keyspaces: Mapping[str, Sequence[str]]) -> list[str]:
        """Keep keys/bytes per keyspace for the owners with several keyspaces from now on
        (`store/counters.py` KeyspaceCounts); recounts the stale ones. The owners recounted."""
        return self._writer.set_keyspaces(ks_table(keyspaces))

    def keyspace_usage(self, owner: str) -> dict[str, tuple[int, int]]:
        """(keys, stored bytes) per keyspace of an owner `track_keyspaces` tracks."""
        return self._writer.keyspace_usage(owner)

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
