"""Usage counters in a write transaction, and the ones deferred in memory.

A usage delta maps owner -> [keys, bytes, writes, deletes, duplicates, throttled]
increments (the order of `store.usage.Usage`). `write_usage` adds a delta to the stored
records inside the caller's write transaction.

Counters that change without any data change (duplicates, throttling) are deferred: a
duplicate-only workload must write nothing to disk. `DeferredCounters` holds them until the
next batch that writes anything takes them, or `Store.flush_counters` (at most
`COUNTER_DEFER_S` late) or close commits them; a crash loses at most that much of these
statistics, never data.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from store.format import OP_SET
from store.ops import Op, Result, Status
from store.usage import (
    K_KS_AT,
    K_KS_SET,
    KS_USAGE_PREFIX,
    KsDelta,
    KsTable,
    Usage,
    keyspace_of,
    ks_bump,
    ks_decode,
    ks_encode,
    ks_set_key,
    ks_usage_key,
    record_owner_size,
    stored_bytes,
    usage_key,
)

#: Longest time duplicate/throttle counters stay in memory before they are committed.
COUNTER_DEFER_S = 60.0

Delta = dict[str, list[int]]


def bump(delta: Delta, owner: str, idx: int, n: int) -> None:
    """Add `n` to counter `idx` of `owner` in `delta`."""
    d = delta.get(owner)
    if d is None:
        d = delta[owner] = [0, 0, 0, 0, 0, 0]
    if len(d) <= idx:  # the apply loops add the expiries slot only when there are some
        d.extend([0] * (idx + 1 - len(d)))
    d[idx] += n


def write_usage(txn: Any, meta_db: Any, delta: Delta) -> None:
    """Add `delta` to the usage records in the ``meta`` sub-database, inside `txn`."""
    for owner, d in delta.items():
        k = usage_key(owner)
        u = Usage.decode(txn.get(k, db=meta_db))
        u.add(Usage(*d))
        txn.put(k, u.encode(), db=meta_db)


class DeferredCounters:
    """Duplicate/throttled counts waiting in memory for the next commit (thread-safe)."""

    def __init__(self, max_age_s: float = COUNTER_DEFER_S) -> None:
        self._max_age_s = max_age_s
        self._held: Delta = {}
        self._since: float | None = None
        self._lock = threading.Lock()

    def defer(self, delta: Delta) -> bool:
        """Keep `delta` in memory when it only holds duplicates/throttled counts and the
        held counts are young enough; False when the caller must commit it now."""
        if any(d[0] or d[1] or d[2] or d[3] for d in delta.values()):
            return False
        with self._lock:
            if self._since is not None and time.monotonic() - self._since > self._max_age_s:
                return False  # long enough in memory: commit them with this batch
            for owner, d in delta.items():
                for i, n in enumerate(d):
                    if n:
                        bump(self._held, owner, i, n)
                        if self._since is None:
                            self._since = time.monotonic()
        return True

    def take(self) -> Delta:
        """Everything held, now owned by the caller (who commits it or `restore`s it)."""
        with self._lock:
            out, self._held, self._since = self._held, {}, None
        return out

    def restore(self, taken: Delta) -> None:
        """Give back what `take` returned when its commit failed."""
        with self._lock:
            for owner, d in taken.items():
                for i, n in enumerate(d):
                    bump(self._held, owner, i, n)
            if taken and self._since is None:
                self._since = time.monotonic()

    def add_to(self, out: dict[str, Usage]) -> None:
        """Add the held counts to `out` (a report of the stored counters)."""
        with self._lock:
            for owner, d in self._held.items():
                out.setdefault(owner, Usage()).add(Usage(*d))


_WRITTEN, _DELETED = Status.WRITTEN, Status.DELETED
_KEY, _OWNER = itemgetter(1), itemgetter(3)  # of an Op (a tuple: faster than by name)


class KeyspaceCounts:
    """Keys and stored bytes per (owner, keyspace) for the owners with several keyspaces,
    kept exact in each batch's own transaction (`store.usage` describes the records).

    Cost on the write path: nothing for a batch none of whose keys lies under a tracked
    keyspace (one C-level ``startswith`` per op); otherwise one extra ``get`` per such op
    before the batch applies (the previous record: its owner and size)."""

    def __init__(self) -> None:
        self.table: KsTable = {}
        self._all: tuple[bytes, ...] = ()
        #: owner -> its keyspaces that no other tracked keyspace overlaps (neither holds
        #: the other): see `whole`.
        self._exclusive: dict[str, tuple[bytes, ...]] = {}

    def set_table(self, table: KsTable) -> None:
        self.table = table
        self._all = tuple(p for ps in table.values() for p in ps)
        self._exclusive = {
            o: tuple(
                p
                for p in ps
                if sum(1 for q in self._all if q.startswith(p) or p.startswith(q)) == 1
            )
            for o, ps in table.items()
        }

    def whole(self, ops: Sequence[Op]) -> tuple[str, bytes] | None:
        """(owner, keyspace) when every op of the batch is by one tracked owner under one
        of its keyspaces that no other tracked keyspace overlaps: then that keyspace's
        change is exactly the owner's (the store's per-owner delta), with no per-op work —
        a bulk load's case. Keys of other owners it overwrites lie in none of their
        keyspaces (exclusive), so theirs do not change."""
        if not ops:
            return None
        owner = ops[0].owner
        prefixes = self._exclusive.get(owner)
        if not prefixes:
            return None
        ks = keyspace_of(prefixes, ops[0].key)
        if ks is None:
            return None
        # Keys under one prefix form one range in byte order: the least and the greatest
        # under it put all of them there (C-level passes, no per-key call).
        keys = list(map(_KEY, ops))
        if not (min(keys).startswith(ks) and max(keys).startswith(ks)):
            return None
        owners = set(map(_OWNER, ops))
        return (owner, ks) if len(owners) == 1 else None

    def before(self, ops: Sequence[Op], get: Callable[[bytes], Any]) -> dict[bytes, Any] | None:
        """The previous records of the batch's tracked keys (None when it has none)."""
        tracked = self._all
        if not tracked:
            return None
        prev: dict[bytes, Any] = {}
        for op in ops:
            k = op.key
            if k.startswith(tracked) and k not in prev:
                raw = get(k)
                prev[k] = None if raw is None else record_owner_size(k, bytes(raw))
        return prev or None

    def delta(
        self, ops: Sequence[Op], results: Sequence[Result], prev: dict[bytes, Any]
    ) -> KsDelta:
        """Per (owner, keyspace) changes of the batch, op by op in order."""
        table = self.table
        out: KsDelta = {}
        for op, res in zip(ops, results, strict=True):
            k = op.key
            if k not in prev:
                continue
            st = res[0]
            if st == _WRITTEN and op.op == OP_SET:
                ob = op.owner.encode()
                new: tuple[str, int] | None = (
                    op.owner,
                    stored_bytes(len(k), len(op.value), len(ob)),
                )
            elif st == _DELETED or st == Status.EXPIRED:  # an expiry removes the key too
                new = None
            else:
                continue
            ks_bump(out, table, k, prev[k], -1)
            ks_bump(out, table, k, new, 1)
            prev[k] = new
        return out

    def write(self, txn: Any, meta_db: Any, delta: KsDelta, seq: int) -> None:
        """Add `delta` to the stored records and mark them exact at `seq`, inside `txn`."""
        for (owner, ks), (dk, db) in delta.items():
            if dk or db:
                rk = ks_usage_key(owner, ks)
                keys, nbytes = ks_decode(txn.get(rk, db=meta_db))
                txn.put(rk, ks_encode(keys + dk, nbytes + db), db=meta_db)
        txn.put(K_KS_AT, seq.to_bytes(8, "little"), db=meta_db)

    def recount_stale(self, txn: Any, data_db: Any, meta_db: Any, last_seq: int) -> list[str]:
        """Recount the owners whose records are not known exact now (all of them when the
        store's log moved on without these records; else those whose keyspaces changed)
        and mark them exact at `last_seq`. The owners recounted."""
        at = txn.get(K_KS_AT, db=meta_db)
        all_stale = at is None or int.from_bytes(bytes(at), "little") != last_seq
        # An owner no longer tracked stops being counted: forget that it was, so that it
        # is recounted if it is tracked again.
        cur = txn.cursor(db=meta_db)
        gone = []
        if cur.set_range(K_KS_SET):
            for k in cur.iternext(values=False):
                k = bytes(k)
                if not k.startswith(K_KS_SET):
                    break
                if k[len(K_KS_SET) :].decode() not in self.table:
                    gone.append(k)
        for k in gone:
            txn.delete(k, db=meta_db)
        done = []
        for owner, prefixes in self.table.items():
            sig = b"\x00".join(sorted(prefixes))
            stored = txn.get(ks_set_key(owner), db=meta_db)
            if all_stale or stored is None or bytes(stored) != sig:
                self._recount(txn, data_db, meta_db, owner, prefixes)
                txn.put(ks_set_key(owner), sig, db=meta_db)
                done.append(owner)
        txn.put(K_KS_AT, last_seq.to_bytes(8, "little"), db=meta_db)
        return done

    @staticmethod
    def _recount(
        txn: Any, data_db: Any, meta_db: Any, owner: str, prefixes: tuple[bytes, ...]
    ) -> None:
        cur = txn.cursor(db=meta_db)
        old_prefix = KS_USAGE_PREFIX + owner.encode() + b"\x00"
        stale = []
        if cur.set_range(old_prefix):
            for k in cur.iternext(values=False):
                if not bytes(k).startswith(old_prefix):
                    break
                stale.append(bytes(k))
        for k in stale:
            txn.delete(k, db=meta_db)
        counts = recount(txn, data_db, owner, prefixes)
        for ks, (keys, nbytes) in counts.items():
            txn.put(ks_usage_key(owner, ks), ks_encode(keys, nbytes), db=meta_db)


def recount(
    txn: Any, data_db: Any, owner: str, prefixes: tuple[bytes, ...]
) -> dict[bytes, tuple[int, int]]:
    """(keys, stored bytes) per keyspace of `owner` counted from the data itself."""
    out = {p: (0, 0) for p in prefixes}
    cur = txn.cursor(db=data_db)
    for p in prefixes:
        if not cur.set_range(p):
            continue
        for k, raw in cur.iternext():
            k = bytes(k)
            if not k.startswith(p):
                break
            if keyspace_of(prefixes, k) != p:
                continue  # under a longer keyspace of the same owner: counted there
            o, size = record_owner_size(k, bytes(raw))
            if o == owner:
                keys, nbytes = out[p]
                out[p] = (keys + 1, nbytes + size)
    return out


def read_keyspaces(txn: Any, meta_db: Any, owner: str) -> dict[bytes, tuple[int, int]]:
    """The stored (keys, bytes) per keyspace of `owner`."""
    prefix = KS_USAGE_PREFIX + owner.encode() + b"\x00"
    out = {}
    cur = txn.cursor(db=meta_db)
    if cur.set_range(prefix):
        for k, v in cur.iternext():
            k = bytes(k)
            if not k.startswith(prefix):
                break
            out[k[len(prefix) :]] = ks_decode(bytes(v))
    return out


def check_keyspaces(txn: Any, data_db: Any, meta_db: Any, last_seq: int) -> list[str]:
    """Problems with the per-keyspace figures, when they claim to be exact at `last_seq`
    (else they are recounted before use and there is nothing to compare): each counted
    owner's figures against a recount of its keyspaces (one pass over those keys)."""
    at = txn.get(K_KS_AT, db=meta_db)
    if at is None or int.from_bytes(bytes(at), "little") != last_seq:
        return []
    owners: dict[str, tuple[bytes, ...]] = {}
    cur = txn.cursor(db=meta_db)
    if cur.set_range(K_KS_SET):
        for k, v in cur.iternext():
            k = bytes(k)
            if not k.startswith(K_KS_SET):
                break
            names = bytes(v).split(b"\x00")
            owners[k[len(K_KS_SET) :].decode()] = tuple(sorted(names, key=len, reverse=True))
    out = []
    for owner, prefixes in owners.items():
        stored = read_keyspaces(txn, meta_db, owner)
        for ks, want in recount(txn, data_db, owner, prefixes).items():
            got = stored.get(ks, (0, 0))
            if got != want:
                out.append(
                    f"usage of {owner!r} in keyspace {ks.decode()!r}: figures say {got[0]} keys"
                    f" / {got[1]} bytes, recount {want[0]} keys / {want[1]} bytes"
                )
    return out
