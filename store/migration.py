"""The seam between the store and its format migrations.

A migration step (`migrations/`) never sees the LMDB environment or its sub-database
handles: `run_step` opens the store, starts ONE write transaction, hands the step a
`MigrationTxn` offering just what a migration needs, bumps the format version in the same
transaction and commits. A crash leaves the old version and none of the step's changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from store import chunks, docs, layout
from store.layout import K_FORMAT, U32

Progress = Callable[[int], object]


class MigrationTxn:
    """A migration's view of its one write transaction: the value records to read and the
    ``meta`` sub-database to change."""

    def __init__(self, txn: Any, dbs: layout.Dbs) -> None:
        self._txn = txn
        self._dbs = dbs

    def data_records(self) -> Iterator[tuple[bytes, bytes]]:
        """(user key, value record) of every key, in key order."""
        for k, v in self._txn.cursor(db=self._dbs.data):
            yield bytes(k), bytes(v)

    def rewrite_data(self, fn: Callable[[bytes, bytes], bytes | None]) -> int:
        """Replace each value record by ``fn(key, record)`` (None keeps it), in key order;
        returns how many records were seen."""
        cur = self._txn.cursor(db=self._dbs.data)
        n = 0
        more = cur.first()
        while more:
            k, v = bytes(cur.key()), bytes(cur.value())
            new = fn(k, v)
            if new is not None and new != v:
                cur.put(k, new)  # leaves the cursor on k
            n += 1
            more = cur.next()
        return n

    def value_chunks(self, seq: int, vlen: int) -> bytes | None:
        """The reassembled chunked value written at `seq`, or None when chunks are missing."""
        return chunks.get(self._txn, self._dbs.chunks, chunks.VALUE_NS, seq, vlen)

    def meta_keys(self, prefix: bytes) -> list[bytes]:
        """The keys of ``meta`` starting with `prefix`."""
        cur = self._txn.cursor(db=self._dbs.meta)
        out: list[bytes] = []
        if cur.set_range(prefix):
            for k in cur.iternext(values=False):
                if not bytes(k).startswith(prefix):
                    break
                out.append(bytes(k))
        return out

    def get_meta(self, key: bytes) -> bytes | None:
        """A value of ``meta``, or None."""
        raw = self._txn.get(key, db=self._dbs.meta)
        return None if raw is None else bytes(raw)

    def put_meta(self, key: bytes, value: bytes) -> None:
        """Set a value of ``meta``."""
        self._txn.put(key, value, db=self._dbs.meta)

    def delete_meta(self, key: bytes) -> None:
        """Delete a key of ``meta`` (no-op when absent)."""
        self._txn.delete(key, db=self._dbs.meta)

    def get_state(self, name: str) -> bytes | None:
        """A node-local document of ``state``, or None."""
        raw = self._txn.get(name.encode(), db=self._dbs.state)
        return None if raw is None else bytes(raw)

    def delete_state(self, name: str) -> None:
        """Delete a node-local document (no-op when absent)."""
        self._txn.delete(name.encode(), db=self._dbs.state)

    def log_docs(self, changes: docs.DocChanges, time_us: int) -> None:
        """Write replicated documents through the log (one record of their own), so
        that replicas receive them like any change."""
        docs.write_logged(self._txn, self._dbs, changes, time_us)


StepFn = Callable[[MigrationTxn, Progress], None]


def run_step(path: str, from_version: int, to_version: int, apply: StepFn, tick: Progress) -> bool:
    """Apply one step to the store at `path` in one transaction with its version bump.

    Returns False (changing nothing) when the store is not at `from_version` any more
    (another process migrated meanwhile).
    """
    env, dbs = layout.open_env(path)
    try:
        with env.begin(write=True) as txn:
            current = U32.unpack(txn.get(K_FORMAT, db=dbs.meta))[0]
            if current != from_version:
                return False
            apply(MigrationTxn(txn, dbs), tick)
            txn.put(K_FORMAT, U32.pack(to_version), db=dbs.meta)
        return True
    finally:
        env.close()


def data_entries(path: str) -> int:
    """How many keys the store at `path` holds (a migration's progress units)."""
    env, dbs = layout.open_env(path, readonly=True)
    try:
        with env.begin() as txn:
            return int(txn.stat(dbs.data)["entries"])
    finally:
        env.close()
