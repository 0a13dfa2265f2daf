"""Format 5: what a root needs lives in the log. Idempotency answers ride in their batch's
log record and land byte-identical in every replica's ``idem``; the admin token's hash is a
replicated document; format-4 stores migrate."""

from __future__ import annotations

import time
from pathlib import Path

import cramjam

from migrations.runner import migrate
from store import chainhash, codec, nodedocs
from store.check import check
from store.docs import Doc
from store.format import OP_DOC, OP_SET, ZERO_HASH
from store.ops import SET, Op, Result
from store.replica_apply import payload
from store.retention import REPLICA_ANSWERS_KEEP_S, RetentionPolicy, RetentionService
from store.store import Store, read_format_version
from tests.conftest import assert_store_ok


def _replicate(src: Store, dst: Store) -> None:
    dst.apply_log_records(src.read_log(dst.last_seq() + 1))


def _idem(s: Store) -> list[tuple[bytes, bytes]]:
    with s.env.begin(db=s.dbs.idem) as txn:
        return [(bytes(k), bytes(v)) for k, v in txn.cursor()]


def test_answers_ride_in_the_batch_record_and_reach_a_replica(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    rep = Store.create(str(tmp_path / "rep"), db_id=root.db_id, sync=False)
    try:
        seen: list[list[int]] = []

        def answers(results: list[Result]) -> list[tuple[bytes, bytes]]:
            seen.append([r.seq for r in results])
            return [(b"ip\x00k1", b'{"status":200,"seq":1}'), (b"ip\x00k2", b"second")]

        out = root.apply([Op(SET, b"a/1", b"v", "p")], answers=answers, time_us=1_000)
        # the op takes seq 1; the two answers follow it in the same record
        assert seen == [[1]] and (out.first_seq, out.last_seq) == (1, 3)
        (rec,) = root.read_log(1)
        alg = chainhash.code(root.chain_hash)
        entries, head = codec.unpack_entries(payload(rec), ZERO_HASH, alg)
        assert [e.op for e in entries] == [OP_SET, OP_DOC, OP_DOC] and head == rec.hash_head
        assert entries[1].key == b"\x00ip\x00k1"
        assert entries[1].value[8:] == b'{"status":200,"seq":1}'
        got = root.get_idempotent(b"ip\x00k1")
        assert got == (1_000, b'{"status":200,"seq":1}')  # stored at the record's time
        assert root.get_doc("\x00ip\x00k1") is None  # an answer is never a document

        _replicate(root, rep)
        assert rep.head() == root.head()
        assert _idem(rep) == _idem(root) and len(_idem(rep)) == 2
        assert rep.scan_docs("") == []
        assert check(root).ok and check(rep).ok, (check(root).problems, check(rep).problems)

        # a batch whose ops change nothing still logs its answers (the retry must find them)
        dup = root.apply([Op(SET, b"a/1", b"v", "p")], answers=lambda _r: [(b"ip\x00k3", b"d")])
        assert dup.results[0].status.value == "duplicate" and dup.last_seq == 4
        _replicate(root, rep)
        assert rep.get_idempotent(b"ip\x00k3") == root.get_idempotent(b"ip\x00k3") is not None

        # expiry is per node and logs nothing
        assert rep.gc_idempotency(older_than_us=2_000) == 2
        assert rep.get_idempotent(b"ip\x00k1") is None and rep.head() == root.head()
        assert_store_ok(root)
        assert_store_ok(rep)
    finally:
        root.close()
        rep.close()


def test_answers_are_compressed_with_the_batch(tmp_path: Path) -> None:
    """An answer costs its bytes in the record's snappy payload, nothing more."""
    with Store.create(str(tmp_path / "s"), sync=False) as s:
        ops = [Op(SET, b"k/%04d" % i, b"x" * 100, "p") for i in range(100)]
        s.apply(ops, answers=lambda _r: [(b"ip\x00req", b'{"status":200,"body":{"seq":100}}')])
        (rec,) = s.read_log(1)
        raw = bytes(cramjam.snappy.decompress_raw(rec.payload))
        assert raw.endswith(b'{"status":200,"body":{"seq":100}}') and rec.num_entries == 101


def _format4_root(path: str) -> None:
    s = Store.create(path, format_version=4, sync=False)
    s.apply([Op(SET, b"a/k", b"v", "p")])
    s.put_state("admin_token_hash", b"ab" * 32)
    s.close()


def test_migration_0005_logs_the_admin_hash_and_empties_state(tmp_path: Path) -> None:
    d = str(tmp_path / "root")
    _format4_root(d)
    assert [st.name for st in migrate(d)] == [
        "0005_root_state_in_log",
        "0006_chain_hash",
        "0007_expiry",
    ]
    assert read_format_version(d) == 7
    with Store.open(d) as s:
        assert s.get_state("admin_token_hash") is None
        assert s.get_doc("admin_token_hash") == Doc(2, b"ab" * 32)
        assert [r.num_entries for r in s.read_log(1)] == [1, 1]
        assert_store_ok(s)
    assert migrate(d) == []  # idempotent


def test_migrating_a_format4_replica_logs_nothing_and_it_follows(tmp_path: Path) -> None:
    root_dir, rep_dir = str(tmp_path / "root"), str(tmp_path / "rep")
    _format4_root(root_dir)
    with Store.open(root_dir, check_format=False) as root:
        rep = Store.create(rep_dir, db_id=root.db_id, format_version=4, sync=False)
        _replicate(root, rep)
        rep.close()
    migrate(rep_dir)
    migrate(root_dir)
    with Store.open(root_dir) as root, Store.open(rep_dir) as rep:
        assert rep.last_seq() == 1  # nothing logged on the replica
        _replicate(root, rep)
        assert rep.head() == root.head() and rep.get_doc("admin_token_hash") is not None
        assert rep.get_state("admin_token_hash") is None


def test_an_answer_entry_is_told_from_a_document() -> None:
    op, owner, key, value = nodedocs.answer_entry(b"ip\x00k", 7, b"a")
    assert (op, owner) == (OP_DOC, b"") and nodedocs.is_answer(key)
    assert not nodedocs.is_answer(b"acl") and value[8:] == b"a"


def test_retention_forgets_old_answers_only_when_asked(tmp_path: Path) -> None:
    """A replica's retention pass expires answers (the root's gateway does its own)."""
    with Store.create(str(tmp_path / "s"), sync=False) as s:
        week_ago = int((time.time() - 8 * 24 * 3600) * 1e6)
        s.apply([Op(SET, b"a", b"1", "p")], answers=lambda _r: [(b"old", b"o")], time_us=week_ago)
        s.apply([Op(SET, b"b", b"1", "p")], answers=lambda _r: [(b"new", b"n")])
        RetentionService(s, RetentionPolicy(keep_seconds=None)).collect_once()
        assert s.get_idempotent(b"old") is not None  # no answer expiry configured: the root
        policy = RetentionPolicy(keep_seconds=None, idempotency_keep_seconds=REPLICA_ANSWERS_KEEP_S)
        RetentionService(s, policy).collect_once()
        assert s.get_idempotent(b"old") is None and s.get_idempotent(b"new") is not None
