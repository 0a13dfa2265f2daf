"""The log chain's hash is the store's own, fixed when its lineage begins (format 6):
recorded in meta, carried by snapshots to replicas, kept as BLAKE2b-256 by the migration of
older stores, and checked by verify. A node never chains with another hash than its store
names, so a mismatch is a refusal, never a silent divergence."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from core.cpuflags import cpu_flags
from core.errors import ChainError, CorruptionError
from migrations.runner import migrate
from store import chainhash, codec
from store import format as fmt
from store.check import check
from store.layout import K_CHAIN_HASH
from store.ops import SET, Op
from store.replica_apply import payload
from store.snapshot import install_snapshot, make_snapshot
from store.store import Store, read_format_version
from testkit.procs import run_mercury
from tests.conftest import assert_store_ok


def _writes(s: Store, n: int, tag: bytes = b"") -> None:
    for i in range(n):
        s.apply([Op(SET, b"k/%d" % i, tag + b"v" * (i * 300), "p")])
    s.put_docs({"acl": b'{"producers": {}}'})


def _chain_of_log(s: Store, alg: int) -> bytes:
    """The head recomputed from seq 1 with plain hashlib, entry by entry."""
    h = fmt.ZERO_HASH
    for rec in s.read_log(1, max_records=10_000):
        entries, _ = codec.unpack_entries(payload(rec), fmt.ZERO_HASH, alg)
        for e in entries:
            raw = fmt.encode_entry(e.seq, e.op, e.owner.encode(), e.key, e.value)
            if alg == fmt.CHAIN_SHA256:
                h = hashlib.sha256(h + raw).digest()
            else:
                h = hashlib.blake2b(h + raw, digest_size=32).digest()
    return h


@pytest.mark.parametrize("name", sorted(chainhash.BY_NAME))
def test_a_new_store_chains_with_the_hash_it_records(tmp_path: Path, name: str) -> None:
    with Store.create(str(tmp_path / "s"), sync=False, chain_hash=name) as s:
        _writes(s, 6)
        assert s.chain_hash == name
        assert s.head()[1] == _chain_of_log(s, chainhash.code(name))
        assert_store_ok(s)
    with Store.open(str(tmp_path / "s"), readonly=True) as s:
        assert s.chain_hash == name  # read back from meta, not from a default


def test_new_stores_default_to_sha256(tmp_path: Path) -> None:
    with Store.create(str(tmp_path / "s"), sync=False) as s:
        assert s.chain_hash == chainhash.DEFAULT == "sha256"


def test_a_snapshot_carries_the_hash_to_a_replica_that_then_follows(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False, chain_hash="sha256")
    try:
        _writes(root, 4)
        out = str(tmp_path / "snap.mdb")
        info = make_snapshot(root, out)
        rep = install_snapshot(out, str(tmp_path / "rep"), info)
        try:
            assert rep.chain_hash == "sha256"
            _writes(root, 8, b"more")
            rep.apply_log_records(root.read_log(rep.last_seq() + 1, max_records=1000))
            assert rep.head() == root.head()
            assert_store_ok(rep)
        finally:
            rep.close()
    finally:
        root.close()


def test_a_replica_chaining_with_another_hash_refuses_the_records(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False, chain_hash="sha256")
    rep = Store.create(
        str(tmp_path / "rep"), db_id=root.db_id, sync=False, chain_hash="blake2b-256"
    )
    try:
        _writes(root, 3)
        with pytest.raises(ChainError, match="hash chain mismatch"):
            rep.apply_log_records(root.read_log(1, max_records=1000))
        assert rep.last_seq() == 0  # all or nothing: nothing applied
    finally:
        rep.close()
        root.close()


def test_migrating_a_format5_store_keeps_its_blake2b_chain(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    with Store.create(d, format_version=5, sync=False) as s:
        _writes(s, 5)
        before = s.head()
        assert s.chain_hash == "blake2b-256"
        with s.env.begin(db=s.dbs.meta) as txn:
            assert txn.get(K_CHAIN_HASH) is None  # format 5 names no hash
    assert [st.name for st in migrate(d)] == ["0006_chain_hash", "0007_expiry"]
    assert read_format_version(d) == 7
    with Store.open(d) as s:
        assert s.chain_hash == "blake2b-256" and s.head() == before
        _writes(s, 3, b"after")  # the chain goes on with the same hash
        assert s.head()[1] == _chain_of_log(s, fmt.CHAIN_BLAKE2B)
        assert_store_ok(s)
    assert migrate(d) == []


def test_an_older_format_cannot_record_another_hash(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="blake2b-256"):
        Store.create(str(tmp_path / "s"), format_version=5, chain_hash="sha256")
    with pytest.raises(ValueError, match="unknown chain hash"):
        Store.create(str(tmp_path / "t"), chain_hash="md5")
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir())


def test_verify_reports_a_missing_hash_and_open_refuses_an_unknown_one(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    with Store.create(d, sync=False) as s:
        _writes(s, 2)
        with s.env.begin(write=True, db=s.dbs.meta) as txn:
            txn.delete(K_CHAIN_HASH)
        report = check(s)
        assert any("records no chain hash" in p for p in report.problems), report.problems
        with s.env.begin(write=True, db=s.dbs.meta) as txn:
            txn.put(K_CHAIN_HASH, b"crc64")
    with pytest.raises(CorruptionError, match="unknown chain hash 'crc64'"):
        Store.open(d)


def test_pick_follows_the_cpu_flags() -> None:
    assert chainhash.pick({"fpu", "avx2", "sha_ni"}) == "sha256"
    assert chainhash.pick({"fp", "asimd", "sha2"}) == "sha256"  # ARMv8 crypto extensions
    assert chainhash.pick({"fpu", "avx2"}) == "blake2b-256"
    assert chainhash.pick(set()) == "blake2b-256"


@pytest.mark.parametrize("name", sorted(chainhash.BY_NAME))
def test_init_records_the_named_hash_and_verify_passes(tmp_path: Path, name: str) -> None:
    d = str(tmp_path / "root")
    r = run_mercury("init", "--chain-hash", name, d)
    assert r.returncode == 0, r.stderr
    with Store.open(d) as s:
        assert s.chain_hash == name and s.last_seq() == 1  # the admin hash's record
    r = run_mercury("verify", d)
    assert r.returncode == 0, r.stdout + r.stderr


def test_init_refuses_an_unknown_hash(tmp_path: Path) -> None:
    r = run_mercury("init", "--chain-hash", "md5", str(tmp_path / "root"))
    assert r.returncode == 2 and "invalid choice" in r.stderr
    assert not (tmp_path / "root" / "data.mdb").exists()


def test_cpu_flags_are_read_from_x86_and_arm_listings(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 sha_ni\n\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd aes sha1 sha2\n")
    assert chainhash.pick(cpu_flags(str(x86))) == "sha256"
    assert chainhash.pick(cpu_flags(str(arm))) == "sha256"
    assert cpu_flags(str(tmp_path / "missing")) == set()
    assert chainhash.pick(cpu_flags(str(tmp_path / "missing"))) == "blake2b-256"
