"""apply(): one transaction per batch, versions, duplicates, conditions, usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import InvalidOpError
from store.ops import DELETE, SET, Op, Status
from store.store import Store
from store.usage import Usage


def test_apply_assigns_one_seq_per_change_and_reads_back(store: Store) -> None:
    r = store.apply([Op(SET, b"a", b"1", "p"), Op(SET, b"b", b"2", "p")])
    assert (r.first_seq, r.last_seq) == (1, 2)
    assert [x.status for x in r.results] == [Status.WRITTEN, Status.WRITTEN]
    got = store.get(b"b")
    assert got is not None and got.value == b"2" and got.seq == 2 and got.owner == "p"
    assert store.last_seq() == 2


def test_duplicate_set_is_not_written_nor_logged(store: Store) -> None:
    store.apply([Op(SET, b"k", b"v", "p")])
    r = store.apply([Op(SET, b"k", b"v", "p")])
    assert r.results[0].status is Status.DUPLICATE and r.results[0].seq == 1
    assert (r.first_seq, r.last_seq) == (0, 0)
    assert store.last_seq() == 1
    assert store.usage()["p"].duplicates == 1


def test_delete_absent_key_logs_nothing(store: Store) -> None:
    r = store.apply([Op(DELETE, b"nope")])
    assert r.results[0].status is Status.ABSENT
    assert store.last_seq() == 0


def test_conditions_evaluated_inside_the_transaction(store: Store) -> None:
    store.apply([Op(SET, b"k", b"v1")])
    r = store.apply(
        [
            Op(SET, b"k", b"v2", expect_seq=7),  # stale If-Match
            Op(SET, b"k", b"v2", expect_seq=1),  # matching If-Match
            Op(SET, b"new", b"x", expect_seq=0),  # If-None-Match: * on an absent key
            Op(SET, b"k", b"v3", expect_seq=0),  # If-None-Match: * on a present key
        ]
    )
    assert [x.status for x in r.results] == [
        Status.PRECONDITION_FAILED,
        Status.WRITTEN,
        Status.WRITTEN,
        Status.PRECONDITION_FAILED,
    ]
    assert r.results[0].seq == 1 and r.results[3].seq == 2


def test_large_value_round_trips_through_chunks(store: Store) -> None:
    big = bytes(range(256)) * 40_000  # ~10 MiB
    store.apply([Op(SET, b"big", big, "p")])
    got = store.get(b"big")
    assert got is not None and got.value == big
    store.apply([Op(SET, b"big", b"small", "p")])  # old chunks must go
    assert store.stat()["entries_chunks"] == 1 + len(store.read_log(1)[0].payload) // 4080


def test_invalid_ops_are_refused_before_anything_is_applied(store: Store) -> None:
    with pytest.raises(InvalidOpError):
        store.apply([Op(SET, b"ok", b"1"), Op(SET, b"", b"x")])
    with pytest.raises(InvalidOpError):
        store.apply([Op(SET, b"k" * 501, b"x")])
    assert store.last_seq() == 0


def test_usage_follows_owner_through_overwrite_and_delete(store: Store) -> None:
    store.apply([Op(SET, b"k", b"12345", "a")])
    store.apply([Op(SET, b"k", b"1", "b")])
    u = store.usage()
    assert u["a"].keys == 0 and u["a"].bytes == 0
    assert u["b"].keys == 1
    store.apply([Op(DELETE, b"k", owner="b")])
    assert store.usage()["b"].keys == 0 and store.usage()["b"].deletes == 1


def test_duplicate_only_batch_commits_nothing(tmp_path: Path) -> None:
    s = Store.create(str(tmp_path / "s"), sync=False)
    try:
        s.apply([Op(SET, b"k", b"v", "p")])
        txnid = s.env.info()["last_txnid"]
        for _ in range(5):
            r = s.apply([Op(SET, b"k", b"v", "p")], throttled={"p": 1})
            assert r.results[0].status is Status.DUPLICATE
        assert s.env.info()["last_txnid"] == txnid  # not one write transaction committed
        assert s.usage()["p"].duplicates == 5 and s.usage()["p"].throttled == 5
    finally:
        s.close()  # commits the deferred counters
    s = Store.open(str(tmp_path / "s"))
    try:
        assert s.usage()["p"].duplicates == 5 and s.usage()["p"].throttled == 5
    finally:
        s.close()


def test_deferred_counters_ride_along_with_the_next_write(store: Store) -> None:
    store.apply([Op(SET, b"k", b"v", "p")])
    store.apply([Op(SET, b"k", b"v", "p")])
    store.apply([Op(SET, b"other", b"x", "q")])
    with store.env.begin(db=store.dbs.meta) as txn:
        raw = txn.get(b"usage:p")
    assert Usage.decode(raw).duplicates == 1  # persisted by q's batch
