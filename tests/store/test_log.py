"""The log: reading from any retained seq, retention GC by count, age and floor; snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.errors import CorruptionError, LogRetentionError
from store.ops import SET, Op
from store.snapshot import SnapshotInfo, install_snapshot, make_snapshot, sidecar
from store.store import Store
from tests.conftest import assert_store_ok


def _batches(
    store: Store, n: int, per: int = 3, time_us: int | None = None, tag: bytes = b"b"
) -> None:
    for i in range(n):
        store.apply(
            [Op(SET, b"%s%d-%d" % (tag, i, j), b"v%d" % i, "p") for j in range(per)],
            time_us=time_us,
        )


def test_read_log_from_any_seq_returns_the_record_holding_it(store: Store) -> None:
    _batches(store, 5)
    for seq in range(1, 16):
        recs = store.read_log(seq)
        assert recs[0].first_seq <= seq <= recs[0].last_seq
        assert recs[-1].last_seq == 15
    assert store.read_log(16) == []
    assert len(store.read_log(1, max_records=2)) == 2


def test_gc_by_count_keeps_the_newest_entries_and_the_chain(store: Store) -> None:
    _batches(store, 10)
    dropped = store.gc_log(keep_entries=6)
    assert dropped == 24
    first, _base = store.log_bounds()
    assert first == 25
    with pytest.raises(LogRetentionError):
        store.read_log(24)
    assert store.read_log(25)[0].first_seq == 25
    assert_store_ok(store)


def test_gc_by_age_respects_the_floor(store: Store) -> None:
    _batches(store, 4, time_us=1_000_000)  # ancient
    _batches(store, 1, tag=b"fresh")
    # 15 entries; dropping a third ancient record would leave 6 < 8
    assert store.gc_log(keep_seconds=60, min_entries=8) == 6
    assert store.log_bounds()[0] == 7
    assert store.gc_log(keep_seconds=60) == 6  # the other ancient records once the floor allows
    assert store.gc_log(keep_seconds=60) == 0  # the fresh one stays
    assert_store_ok(store)


def test_gc_without_a_policy_keeps_everything(store: Store) -> None:
    _batches(store, 3)
    assert store.gc_log() == 0
    assert store.log_bounds()[0] == 1


def test_large_batch_log_payload_is_chunked_and_collected(store: Store) -> None:
    store.apply([Op(SET, b"r%d" % i, os.urandom(3000), "p") for i in range(20)])
    assert store.stat()["entries_chunks"] > 0
    _batches(store, 1, tag=b"fresh")
    store.gc_log(keep_entries=3)
    assert store.stat()["entries_chunks"] == 0  # chunks of the collected record went too


def test_snapshot_installs_as_an_identical_store(tmp_path: Path, store: Store) -> None:
    _batches(store, 5)
    store.apply([Op(SET, b"big", os.urandom(20_000), "p")])
    store.put_state("acl", b"root-only document")
    out = str(tmp_path / "snap.mdb")
    info = make_snapshot(store, out)
    assert info.seq == store.last_seq() and info.db_id == store.db_id
    assert SnapshotInfo.from_json(Path(sidecar(out)).read_text()) == info
    replica = install_snapshot(out, str(tmp_path / "replica"), info)
    try:
        assert replica.status() == store.status()
        assert replica.get_state("acl") is None  # node documents are not carried over
        assert_store_ok(replica)
    finally:
        replica.close()


def test_snapshot_with_wrong_checksum_is_refused(tmp_path: Path, store: Store) -> None:
    _batches(store, 2)
    out = str(tmp_path / "snap.mdb")
    info = make_snapshot(store, out)
    with open(out, "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    with pytest.raises(CorruptionError, match="checksum"):
        install_snapshot(out, str(tmp_path / "replica"), info)
