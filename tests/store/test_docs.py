"""Replicated documents: written through the log (alone or with a batch), applied by a
replica from the log records, carried by snapshots, migrated out of the node-local state."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from core.errors import InvalidOpError
from migrations.runner import migrate
from store.check import check
from store.docs import Doc
from store.layout import K_FORMAT, U32, U64
from store.ops import SET, Op
from store.snapshot import install_snapshot, make_snapshot
from store.store import CURRENT_FORMAT, Store, read_format_version
from testkit.procs import mercury_cmd
from tests.conftest import assert_store_ok


def _replicate(src: Store, dst: Store) -> None:
    dst.apply_log_records(src.read_log(dst.last_seq() + 1))


def test_docs_alone_and_with_a_batch_reach_a_replica(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    rep = Store.create(str(tmp_path / "rep"), db_id=root.db_id, sync=False)
    try:
        r1 = root.put_docs({"acl": b'{"v":1}'})
        assert (r1.first_seq, r1.last_seq) == (1, 1)
        r2 = root.apply(
            [Op(SET, b"a/k", b"v", "p")], doc_changes={"acl": b'{"v":2}', "audit/1": b"x"}
        )
        assert (r2.first_seq, r2.last_seq) == (2, 4)  # one record: the op, then the docs
        assert len(root.read_log(2)) == 1
        got = root.get_doc("acl")
        assert got is not None and got.body == b'{"v":2}' and got.seq == 3
        _replicate(root, rep)
        assert rep.head() == root.head()
        assert rep.get_doc("acl") == got
        assert [n for n, _ in rep.scan_docs("audit/")] == ["audit/1"]
        assert rep.get(b"a/k") is not None and rep.get(b"acl") is None  # never a user key
        root.put_docs({"audit/1": None})  # removal travels too
        _replicate(root, rep)
        assert rep.scan_docs("audit/") == [] and root.scan_docs("audit/") == []
        assert_store_ok(root)
        assert_store_ok(rep)
    finally:
        root.close()
        rep.close()


def test_invalid_document_changes_nothing(store: Store) -> None:
    for bad in ({"": b"x"}, {"a\x00b": b"x"}, {"n" * 501: b"x"}, {"empty": b""}):
        with pytest.raises(InvalidOpError):
            store.put_docs(bad)
    assert store.last_seq() == 0 and store.scan_docs("") == []


def test_scan_docs_pages_in_name_order(store: Store) -> None:
    store.put_docs({f"audit/{i:03d}": b"r" for i in range(10)} | {"acl": b"{}"})
    page = store.scan_docs("audit/", limit=4)
    assert [n for n, _ in page] == [f"audit/{i:03d}" for i in range(4)]
    rest = store.scan_docs("audit/", after=page[-1][0])
    assert [n for n, _ in rest] == [f"audit/{i:03d}" for i in range(4, 10)]


def test_snapshot_carries_docs_and_answers_but_not_node_local_state(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    try:
        root.put_state("node-only", b"secret")
        root.put_docs({"acl": b'{"producers":[]}', "admin_token_hash": b"hash"})
        root.apply([Op(SET, b"a/k", b"v", "p")], answers=lambda _r: [(b"idem-key", b"answer")])
        info = make_snapshot(root, str(tmp_path / "snap"))
        want = root.get_idempotent(b"idem-key")
    finally:
        root.close()
    got = install_snapshot(str(tmp_path / "snap"), str(tmp_path / "rep"), info)
    try:
        doc = got.get_doc("acl")
        assert doc is not None and doc.body == b'{"producers":[]}'
        admin = got.get_doc("admin_token_hash")
        assert admin is not None and admin.body == b"hash"
        assert got.get_state("node-only") is None
        assert want is not None and got.get_idempotent(b"idem-key") == want
    finally:
        got.close()


def _format2_store_with_acl(path: str) -> None:
    """A store as format 2 left it: the ACL in the node-local state."""
    s = Store.create(path, format_version=2, sync=False)
    s.apply([Op(SET, b"a/k", b"v", "p")])
    s.put_state("acl", b'{"producers":[{"name":"p","keyspaces":["a/"]}]}')
    s.put_state("admin_token_hash", b"h")
    s.close()


def test_migration_moves_the_acl_into_the_log(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    _format2_store_with_acl(d)
    assert [s.name for s in migrate(d)] == [
        "0003_replicated_docs",
        "0004_key_checksum",
        "0005_root_state_in_log",
        "0006_chain_hash",
        "0007_expiry",
    ]
    with Store.open(d) as s:
        assert s.get_state("acl") is None
        assert s.get_state("admin_token_hash") is None  # format 5: in the log too
        doc = s.get_doc("acl")
        assert doc is not None and doc.seq == 2 and b'"p"' in doc.body
        assert s.get_doc("admin_token_hash") == Doc(3, b"h")
        assert [r.num_entries for r in s.read_log(1)] == [1, 1, 1]
        assert_store_ok(s)


def test_migrating_a_replica_logs_nothing(tmp_path: Path) -> None:
    """A replica's state has no ACL: its log stays the root's."""
    d = str(tmp_path / "s")
    s = Store.create(d, format_version=2, sync=False)
    s.apply([Op(SET, b"a/k", b"v", "p")])
    head = s.head()
    s.close()
    migrate(d)
    with Store.open(d) as s:
        assert s.head() == head and s.get_doc("acl") is None


def test_sigkill_mid_migration_leaves_format_2(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    _format2_store_with_acl(d)
    env = dict(os.environ, MERCURY_FAILPOINTS="migrate.0003.before_commit=kill")
    p = subprocess.run(mercury_cmd("migrate", d), env=env, capture_output=True, timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert read_format_version(d) == 2
    with Store.open(d, check_format=False) as s:
        assert s.get_state("acl") is not None and s.last_seq() == 1
    assert [st.name for st in migrate(d)] == [
        "0003_replicated_docs",
        "0004_key_checksum",
        "0005_root_state_in_log",
        "0006_chain_hash",
        "0007_expiry",
    ]
    with Store.open(d) as s:
        assert s.get_doc("acl") is not None and s.last_seq() == 3  # + the admin hash
        with s.env.begin(db=s.dbs.meta) as txn:
            assert U32.unpack(txn.get(K_FORMAT))[0] == CURRENT_FORMAT


def test_check_holds_documents_to_their_log_entries(store: Store) -> None:
    store.put_docs({"acl": b"one", "gone": b"x"})
    store.put_docs({"gone": None})
    store.apply([Op(SET, b"k", b"v", "p")])
    assert check(store).ok
    store.gc_log(keep_entries=1)  # the documents' entries leave the retained log
    assert store.log_bounds()[0] == 4 and check(store).ok
    store.put_docs({"acl": b"two"})
    with store.env.begin(write=True) as txn:  # tamper: a body its entry never wrote
        txn.put(b"acl", U64.pack(5) + b"three", db=store.dbs.docs)
        txn.put(b"stray", U64.pack(5) + b"s", db=store.dbs.docs)
    problems = check(store).problems
    assert any("'acl'" in p and "differs" in p for p in problems), problems
    assert any("b'stray'" in p and "no entry" in p for p in problems), problems
    with store.env.begin(write=True) as txn:
        txn.delete(b"acl", db=store.dbs.docs)
        txn.delete(b"stray", db=store.dbs.docs)
    assert any("missing" in p for p in check(store).problems)
    with store.env.begin(write=True) as txn:  # repair, so the fixture's teardown passes
        txn.put(b"acl", U64.pack(5) + b"two", db=store.dbs.docs)
    assert check(store).ok
