"""Corruption is caught: flipped value bytes on read and by verify, log tampering by the
chain, and a full map is a typed error that leaves the store intact."""

from __future__ import annotations

import os
from pathlib import Path

import cramjam
import lmdb
import pytest

from core.errors import ChainError, CRCError, StoreFullError
from store import chunks, layout
from store.check import check
from store.format import encode_log_header
from store.layout import BE64
from store.metrics import CRC_FAILURES
from store.ops import SET, LogRecord, Op
from store.store import Store
from testkit.procs import run_mercury
from tests.conftest import assert_store_ok


def _flip_in_file(path: str, needle: bytes) -> None:
    """Flip one byte of `needle` wherever it sits in the LMDB data file (a disk-level
    fault). Every copy: a short value's bytes are also in its log record's payload
    (snappy keeps short literals), which may come first in the file."""
    data = bytearray(Path(path).read_bytes())
    at = data.find(needle)
    assert at >= 0, "value not found in the data file"
    while at >= 0:
        data[at + len(needle) // 2] ^= 0x01
        at = data.find(needle, at + 1)
    Path(path).write_bytes(bytes(data))


def _corrupt_store(tmp_path: Path) -> str:
    d = str(tmp_path / "s")
    s = Store.create(d, sync=True)
    s.apply([Op(SET, b"good", b"fine", "p"), Op(SET, b"bad", b"UNIQUE-VALUE-0123456789", "p")])
    s.close()
    _flip_in_file(layout.data_file(d), b"UNIQUE-VALUE-0123456789")
    return d


def test_flipped_value_byte_is_never_served(tmp_path: Path) -> None:
    d = _corrupt_store(tmp_path)
    s = Store.open(d)
    try:
        before = CRC_FAILURES._value.get()
        with pytest.raises(CRCError) as err:
            s.get(b"bad")
        assert err.value.fields["key"] == b"bad"
        assert CRC_FAILURES._value.get() == before + 1
        got = s.get(b"good")
        assert got is not None and got.value == b"fine"
        report = check(s)
        assert not report.ok and any("b'bad'" in p and "CRC" in p for p in report.problems)
    finally:
        s.close()


def test_verify_command_reports_flipped_byte(tmp_path: Path) -> None:
    d = _corrupt_store(tmp_path)
    r = run_mercury("verify", d)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CRC mismatch" in r.stdout and "b'bad'" in r.stdout


def test_flipped_byte_in_chunked_value_is_caught(store: Store) -> None:
    big = os.urandom(10_000)
    store.apply([Op(SET, b"big", big, "p")])
    rec = store.env.begin(db=store.dbs.data).get(b"big")
    seq = store.version(b"big")
    with store.env.begin(write=True) as txn:
        k = chunks.key(chunks.VALUE_NS, seq, 1)
        part = bytearray(txn.get(k, db=store.dbs.chunks))
        part[7] ^= 0xFF
        txn.put(k, bytes(part), db=store.dbs.chunks)
    assert rec is not None
    with pytest.raises(CRCError):
        store.get(b"big")
    assert not check(store).ok
    store.apply([Op(SET, b"big", b"repaired", "p")])  # overwriting heals the key


def _three_batches(store: Store) -> None:
    for i in range(3):
        store.apply([Op(SET, b"k%d" % i, b"v%d" % i, "p"), Op(SET, b"x", b"%d" % i, "p")])


def test_tampered_log_entry_breaks_the_chain(store: Store) -> None:
    _three_batches(store)
    rec = store.read_log(3)[0]
    raw = bytearray(bytes(cramjam.snappy.decompress_raw(rec.payload)))
    raw[-1] ^= 0x01  # alter the last value byte of the batch
    comp = bytes(cramjam.snappy.compress_raw(bytes(raw)))
    header = encode_log_header(0, rec.first_seq, rec.num_entries, rec.time_us, rec.hash_head, comp)
    with store.env.begin(write=True) as txn:
        txn.put(BE64.pack(rec.first_seq), header + comp, db=store.dbs.log)
    report = check(store)
    assert any("hash chain broken" in p for p in report.problems), report.problems
    _restore(store, rec)


def test_missing_log_record_is_a_gap(store: Store) -> None:
    _three_batches(store)
    rec = store.read_log(3)[0]
    with store.env.begin(write=True) as txn:
        txn.delete(BE64.pack(rec.first_seq), db=store.dbs.log)
    report = check(store)
    assert any("gap" in p for p in report.problems), report.problems
    _restore(store, rec)


def _restore(store: Store, rec: LogRecord) -> None:
    with store.env.begin(write=True) as txn:
        txn.put(BE64.pack(rec.first_seq), rec.header + rec.payload, db=store.dbs.log)
    assert_store_ok(store)


def test_replica_refuses_record_with_seq_gap_or_foreign_chain(tmp_path: Path, store: Store) -> None:
    _three_batches(store)
    recs = store.read_log(1)
    replica = Store.create(str(tmp_path / "r"), db_id=store.db_id, sync=False)
    try:
        with pytest.raises(ChainError, match="seq gap"):
            replica.apply_log_record(recs[1])
        other = Store.create(str(tmp_path / "o"), sync=False)
        other.apply([Op(SET, b"k0", b"different", "p"), Op(SET, b"x", b"0", "p")])
        with pytest.raises(ChainError, match="hash chain mismatch"):
            replica.apply_log_record(other.read_log(1)[0]._replace(hash_head=recs[0].hash_head))
        other.close()
        for rec in recs:
            replica.apply_log_record(rec)
        assert replica.head() == store.head()
        assert_store_ok(replica)
    finally:
        replica.close()


def test_put_returns_typed_error_when_map_full(tmp_path: Path) -> None:
    s = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 20)
    try:
        s.apply([Op(SET, b"keep", b"me", "p")])
        with pytest.raises(StoreFullError) as err:
            s.apply([Op(SET, b"big%d" % i, os.urandom(3000), "p") for i in range(1000)])
        assert err.value.retryable
        got = s.get(b"keep")
        assert got is not None and got.value == b"me"
        assert s.last_seq() == 1
        assert_store_ok(s)
        s.apply([Op(SET, b"small", b"still writable", "p")])
        assert s.last_seq() == 2
    finally:
        s.close()


def test_lmdb_is_only_imported_by_the_store_layers() -> None:
    root = Path(__file__).resolve().parents[2]
    for pkg in ("gateway", "replicator", "acl", "reads"):
        for f in (root / pkg).rglob("*.py"):
            text = f.read_text()
            assert "import lmdb" not in text, f"{f} imports lmdb: use the store API"
    assert lmdb.version()


def test_group_apply_is_all_or_nothing(tmp_path: Path, store: Store) -> None:
    _three_batches(store)
    recs = store.read_log(1)
    replica = Store.create(str(tmp_path / "r"), db_id=store.db_id, sync=False)
    try:
        with pytest.raises(ChainError, match="seq gap"):
            replica.apply_log_records([recs[0], recs[2]])
        assert replica.last_seq() == 0  # the good first record went back too
        replica.apply_log_records(recs)
        assert replica.head() == store.head()
        assert [r.header for r in replica.read_log(1)] == [r.header for r in recs]
        assert_store_ok(replica)
    finally:
        replica.close()
