"""`mercury restore`, run as an operator runs it: checks first, installs atomically, keeps
the store it replaces, logs the root's `restore` document and says what happens next."""

from __future__ import annotations

import json
from pathlib import Path

from store.lock import WriterLock
from store.ops import SET, Op
from store.restore import RESTORE_DOC
from store.store import Store
from testkit.procs import run_mercury


def _root(d: Path, n: int, prefix: str = "k") -> None:
    """`mercury init` (once) and `n` more writes (records) of one key each."""
    if not (d / "data.mdb").exists():
        assert run_mercury("init", str(d)).returncode == 0
    s = Store.open(str(d))
    try:
        for i in range(n):
            s.apply([Op(SET, f"{prefix}{i}".encode(), b"v", "p")])
    finally:
        s.close()


def _snapshot(d: Path, out: Path) -> dict[str, object]:
    r = run_mercury("snapshot", str(d), str(out))
    assert r.returncode == 0, r.stderr
    info: dict[str, object] = json.loads(r.stdout)
    return info


def _head(d: Path) -> tuple[int, str]:
    s = Store.open(str(d), readonly=True)
    try:
        seq, head = s.head()
        return seq, head.hex()
    finally:
        s.close()


def test_restore_over_a_root_keeps_the_old_store_and_logs_the_restore(tmp_path: Path) -> None:
    d, snap = tmp_path / "root", tmp_path / "snap.mdb"
    _root(d, 5)
    info = _snapshot(d, snap)  # seq 6: the admin hash, then 5 writes
    _root(d, 4, prefix="later")  # seq 10: the writes the restore takes back
    r = run_mercury("restore", str(snap), str(d))
    assert r.returncode == 0, r.stderr
    assert "above seq 6" in r.stdout and "diverged" in r.stdout, r.stdout
    assert f"(seq 10) is kept in {d}/.replaced-" in r.stdout, r.stdout  # by its path
    s = Store.open(str(d), readonly=True)
    try:
        assert s.last_seq() == 7 and s.get(b"later0") is None and s.get(b"k4") is not None
        doc = s.get_doc(RESTORE_DOC)
        assert doc is not None and doc.seq == 7
        body = json.loads(doc.body)
        assert (body["after_seq"], body["after_hash"]) == (6, info["hash_head"])
        assert body["snapshot_sha256"] == info["sha256"]
    finally:
        s.close()
    (aside,) = [p for p in d.iterdir() if p.name.startswith(".replaced-")]
    assert _head(aside)[0] == 10  # the replaced store, whole
    assert not (d / ".restore-stage").exists()
    assert run_mercury("verify", str(d)).returncode == 0


def test_restore_refuses_a_snapshot_failing_a_check_and_changes_nothing(tmp_path: Path) -> None:
    d, snap = tmp_path / "root", tmp_path / "snap.mdb"
    _root(d, 3)
    info = _snapshot(d, snap)
    before = _head(d)
    side = Path(str(snap) + ".json")

    raw = bytearray(snap.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad = tmp_path / "bad.mdb"
    bad.write_bytes(bytes(raw))
    Path(str(bad) + ".json").write_text(side.read_text())
    r = run_mercury("restore", str(bad), str(d))
    assert r.returncode == 2 and "fails its checksum" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1  # one line: the error and its hint

    other = tmp_path / "newer.mdb"
    other.write_bytes(snap.read_bytes())
    Path(str(other) + ".json").write_text(json.dumps({**info, "format_version": 99}))
    r = run_mercury("restore", str(other), str(d))
    assert r.returncode == 2 and "format 99" in r.stderr, r.stderr

    alone = tmp_path / "alone.mdb"
    alone.write_bytes(snap.read_bytes())
    r = run_mercury("restore", str(alone), str(d))
    assert r.returncode == 2 and "alone.mdb.json" in r.stderr, r.stderr

    lying = tmp_path / "lying.mdb"
    lying.write_bytes(snap.read_bytes())
    Path(str(lying) + ".json").write_text(json.dumps({**info, "seq": 2}))
    r = run_mercury("restore", str(lying), str(d))
    assert r.returncode == 2 and "does not match" in r.stderr, r.stderr

    assert _head(d) == before
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []


def test_restore_refuses_a_running_nodes_data_dir(tmp_path: Path) -> None:
    d, snap = tmp_path / "root", tmp_path / "snap.mdb"
    _root(d, 1)
    _snapshot(d, snap)
    lock = WriterLock.acquire(str(d), create=False)  # as a running root holds it
    try:
        r = run_mercury("restore", str(snap), str(d))
    finally:
        lock.release()
    assert r.returncode == 2 and "lock" in r.stderr.lower(), r.stderr
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []


def test_seeding_a_replica_logs_nothing_and_a_root_restore_refuses_its_dir(
    tmp_path: Path,
) -> None:
    d, snap, rep = tmp_path / "root", tmp_path / "snap.mdb", tmp_path / "replica"
    _root(d, 2)
    info = _snapshot(d, snap)
    r = run_mercury("restore", "--replica", "--json", str(snap), str(rep))
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert (done["seq"], done["restore_seq"], done["set_aside"]) == (info["seq"], None, None)
    assert _head(rep) == (info["seq"], info["hash_head"])
    (rep / "replication.json").write_text("{}")  # as a replica's worker leaves it
    r = run_mercury("restore", str(snap), str(rep))
    assert r.returncode == 2 and "replica's store" in r.stderr, r.stderr


def test_a_refused_restore_into_a_new_data_dir_leaves_nothing(tmp_path: Path) -> None:
    fresh = tmp_path / "new" / "root"  # neither exists: restore would create both
    r = run_mercury("restore", str(tmp_path / "missing.mdb"), str(fresh))
    assert r.returncode == 2 and "no snapshot file" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    d, snap = tmp_path / "root", tmp_path / "snap.mdb"
    _root(d, 1)
    _snapshot(d, snap)
    snap.write_bytes(snap.read_bytes()[:-1])  # fails its size check under the lock
    r = run_mercury("restore", str(snap), str(fresh))
    assert r.returncode == 2, r.stderr
    assert not (tmp_path / "new").exists()


def test_prune_aside_names_a_missing_data_dir(tmp_path: Path) -> None:
    r = run_mercury("prune-aside", str(tmp_path / "typo"))
    assert r.returncode == 2 and "no data directory" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""


def test_a_quiet_restore_prints_nothing(tmp_path: Path) -> None:
    d, snap, rep = tmp_path / "root", tmp_path / "snap.mdb", tmp_path / "replica"
    _root(d, 1)
    info = _snapshot(d, snap)
    r = run_mercury("restore", "--replica", "-q", str(snap), str(rep))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r
    assert _head(rep) == (info["seq"], info["hash_head"])
