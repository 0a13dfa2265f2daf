"""`store.chunks`: blobs round-trip through page-sized chunks; log chunks go in LMDB's
append mode, and a put append refuses (a key that does not sort last) still stores every
chunk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb

from store import chunks
from store.format import CHUNK_SIZE


def _env(tmp_path: Path) -> tuple[lmdb.Environment, Any]:
    env = lmdb.open(str(tmp_path), map_size=1 << 28, max_dbs=2)
    return env, env.open_db(b"chunks")


def test_round_trip_in_both_namespaces(tmp_path: Path) -> None:
    env, db = _env(tmp_path)
    blob = bytes(range(256)) * 100  # 25,600 bytes: 7 chunks, the last one short
    with env.begin(write=True) as txn:
        for seq in (1, 2, 3):
            chunks.put(txn, db, chunks.VALUE_NS, seq, blob)
            chunks.put(txn, db, chunks.LOG_NS, seq, blob[::-1])
    with env.begin() as txn:
        for seq in (1, 2, 3):
            assert chunks.get(txn, db, chunks.VALUE_NS, seq, len(blob)) == blob
            assert chunks.get(txn, db, chunks.LOG_NS, seq, len(blob)) == blob[::-1]
        assert txn.stat(db)["entries"] == 6 * -(-len(blob) // CHUNK_SIZE)
    with env.begin(write=True) as txn:
        chunks.delete(txn, db, chunks.VALUE_NS, 2, len(blob))
        assert chunks.get(txn, db, chunks.VALUE_NS, 2, len(blob)) is None
        assert chunks.get(txn, db, chunks.VALUE_NS, 3, len(blob)) == blob


def test_a_log_put_that_append_refuses_is_stored_anyway(tmp_path: Path) -> None:
    env, db = _env(tmp_path)
    blob = b"x" * (3 * CHUNK_SIZE + 5)
    with env.begin(write=True) as txn:
        chunks.put(txn, db, chunks.LOG_NS, 10, blob)
        chunks.put(txn, db, chunks.LOG_NS, 4, blob)  # sorts before seq 10: not an append
        txn.put(b"z-later", b"1", db=db)  # a key after every log chunk
        chunks.put(txn, db, chunks.LOG_NS, 11, blob)
    with env.begin() as txn:
        for seq in (4, 10, 11):
            assert chunks.get(txn, db, chunks.LOG_NS, seq, len(blob)) == blob
