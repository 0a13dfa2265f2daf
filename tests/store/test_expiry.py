"""Keys that expire, in the store (format 7): the deadline index every node keeps from the
log, the EXPIRE op, and the migration from format 6."""

from __future__ import annotations

from pathlib import Path

from migrations.runner import migrate
from store import format as fmt
from store.ops import DELETE, EXPIRE, SET, Op, Status
from store.store import Store, read_format_version
from tests.conftest import assert_store_ok


def _store(path: Path, name: str = "s", db_id: str | None = None) -> Store:
    return Store.create(str(path / name), sync=False, map_size=1 << 26, db_id=db_id)


def test_a_deadline_is_indexed_read_back_and_due_in_order(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        s.apply(
            [
                Op(SET, b"a/late", b"1", "p", deadline=300),
                Op(SET, b"a/soon", b"2", "p", deadline=100),
                Op(SET, b"a/never", b"3", "p"),
            ]
        )
        got = s.get(b"a/soon")
        assert got is not None and got.expires_us == 100
        never = s.get(b"a/never")
        assert never is not None and never.expires_us == 0
        assert [k for k, *_ in s.due_expiries(1000, 10)] == [b"a/soon", b"a/late"]
        assert [k for k, *_ in s.due_expiries(200, 10)] == [b"a/soon"]
        assert s.due_expiries(99, 10) == []
        assert s.next_deadline() == 100 and s.expiry_backlog(1000, 10) == 2
        assert_store_ok(s)


def test_a_write_without_ttl_clears_the_deadline_and_same_bytes_new_ttl_is_a_write(
    tmp_path: Path,
) -> None:
    with _store(tmp_path) as s:
        s.apply([Op(SET, b"k", b"v", "p", deadline=100)])
        # the same bytes with the same deadline: a duplicate
        assert s.apply([Op(SET, b"k", b"v", "p", deadline=100)]).results[0].status == (
            Status.DUPLICATE
        )
        # the same bytes with another deadline, then without one: writes
        assert s.apply([Op(SET, b"k", b"v", "p", deadline=200)]).results[0].status == (
            Status.WRITTEN
        )
        assert [(k, d) for k, d, *_ in s.due_expiries(10**6, 10)] == [(b"k", 200)]
        assert s.apply([Op(SET, b"k", b"v", "p")]).results[0].status == Status.WRITTEN
        assert s.due_expiries(10**6, 10) == [] and s.get(b"k") is not None
        assert s.stat()["entries_expiry"] == 0
        # a delete clears it too
        s.apply([Op(SET, b"k", b"w", "p", deadline=5)])
        s.apply([Op(DELETE, b"k", owner="p")])
        assert s.stat()["entries_expiry"] == 0


def test_expire_removes_only_a_key_that_still_has_its_deadline(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        r = s.apply([Op(SET, b"k", b"v", "p", deadline=100), Op(SET, b"plain", b"v", "p")])
        seq = r.results[0].seq
        # an expiry of a key without a deadline, or one rewritten since: nothing happens
        plain = s.apply([Op(EXPIRE, b"plain", owner="p", expect_seq=r.results[1].seq)])
        assert plain.results[0].status == Status.ABSENT and plain.last_seq == 0
        stale = s.apply([Op(EXPIRE, b"k", owner="p", expect_seq=seq - 1)])
        assert stale.results[0].status == Status.PRECONDITION_FAILED
        out = s.apply([Op(EXPIRE, b"k", owner="p", expect_seq=seq)])
        assert out.results[0].status == Status.EXPIRED and s.get(b"k") is None
        assert s.stat()["entries_expiry"] == 0
        (entry,) = [e for rec in s.read_log(out.first_seq) for e in _entries(rec)]
        assert (entry.op, entry.key, entry.owner) == (fmt.OP_EXPIRE, b"k", "p")
        u = s.usage()["p"]
        # an expiry takes the key off its owner's figures: an expiry, not a delete
        assert (u.keys, u.deletes, u.expiries) == (1, 0, 1)
        assert_store_ok(s)


def _entries(rec: object) -> list[fmt.Entry]:
    import cramjam

    return fmt.decode_entries(bytes(cramjam.snappy.decompress_raw(rec.payload)))  # type: ignore[attr-defined]


def test_a_replica_keeps_the_same_deadlines_and_expires_at_the_same_seq(tmp_path: Path) -> None:
    with _store(tmp_path, "root") as root, _store(tmp_path, "rep", root.db_id) as rep:
        root.apply(
            [Op(SET, b"k", b"v" * 5000, "p", deadline=100), Op(SET, b"j", b"x", "p", deadline=7)]
        )
        rep.apply_log_records(root.read_log(1))
        assert rep.due_expiries(1000, 10) == root.due_expiries(1000, 10)
        got = rep.get(b"k")
        assert got is not None and got.expires_us == 100
        seq = root.get(b"k").seq  # type: ignore[union-attr]
        out = root.apply([Op(EXPIRE, b"k", owner="p", expect_seq=seq)])
        rep.apply_log_records(root.read_log(out.first_seq))
        assert rep.get(b"k") is None and rep.head() == root.head()
        assert rep.due_expiries(1000, 10) == root.due_expiries(1000, 10) != []
        assert rep.usage() == root.usage()
        assert_store_ok(rep)


def test_migration_0007_opens_a_format6_store_with_an_empty_index(tmp_path: Path) -> None:
    d = str(tmp_path / "old")
    with Store.create(d, format_version=6, sync=False) as s:
        s.apply([Op(SET, b"a", b"v", "p")])
        before = s.head()
    assert [st.name for st in migrate(d)] == ["0007_expiry"]
    assert read_format_version(d) == 7
    with Store.open(d) as s:
        assert s.head() == before and s.due_expiries(2**63, 10) == []
        s.apply([Op(SET, b"b", b"v", "p", deadline=5)])
        assert [k for k, *_ in s.due_expiries(10, 10)] == [b"b"]
        assert_store_ok(s)
