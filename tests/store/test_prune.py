"""A filtered replica's store: pruned once to its keyspaces (`store/prune.py`), its usage
counters and invariants intact, never widened, never promoted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.errors import StoreError
from store import prune, snapshot
from store.check import check
from store.format import CHUNK_SIZE
from store.ops import SET, Op
from store.promotion import promote
from store.store import Store


def test_prune_keeps_exactly_the_prefixes_and_the_counters_agree(tmp_path: Path) -> None:
    with Store.create(str(tmp_path / "s"), sync=False) as s:
        for p in (b"a/", b"ab", b"b/", b"c/", b"\xff"):
            big = b"x" * (CHUNK_SIZE * 2)  # chunked values go with their chunks
            s.apply(
                [
                    Op(SET, p + b"%03d" % i, big if i % 7 == 0 else b"v", owner=p.hex())
                    for i in range(40)
                ]
            )
        head = s.head()
        removed = prune.prune(s, (b"a/", b"c/"), batch=17)  # several transactions
        assert removed == 120
        with s.reader() as r:
            assert {k[:2] for k, _ in r.scan()} == {b"a/", b"c/"}
        report = check(s)
        assert report.ok, report  # usage counters equal a recount, no chunk left over
        assert s.head() == head  # the history is unchanged: nothing logged
        assert s.log_bounds()[0] == head[0] + 1  # the whole-record log is dropped
        assert prune.held_keyspaces(s) == (b"a/", b"c/")
        assert prune.prune(s, (b"a/", b"c/")) == 0  # idempotent
        with pytest.raises(StoreError, match="cannot become a root"):
            promote(s)


def test_a_store_narrows_but_never_widens() -> None:
    assert prune.check_keyspaces(None, (b"a/",)) is None  # a full store prunes
    assert prune.check_keyspaces((b"a/",), (b"a/x",)) is None  # narrower prunes again
    wider = prune.check_keyspaces((b"a/",), (b"a/", b"b/"))
    assert wider is not None and "'b/'" in wider and "move DATA_DIR aside" in wider
    full = prune.check_keyspaces((b"a/",), None)
    assert full is not None and "same --keyspace" in full


def test_a_derived_snapshot_holds_the_prefixes_at_the_same_seq_and_head(tmp_path: Path) -> None:
    with Store.create(str(tmp_path / "s"), sync=False) as s:
        for p in (b"a/", b"b/"):
            s.apply([Op(SET, p + b"%04d" % i, b"v" * 300, owner="o") for i in range(300)])
        whole = snapshot.make_snapshot(s, str(tmp_path / "snap.mdb"))
        head = s.head()
    out = prune.derived_path(str(tmp_path / "snap.mdb"), (b"a/",))
    info = prune.filtered_snapshot(str(tmp_path / "snap.mdb"), whole, out, (b"a/",))
    assert (info.seq, info.hash_head) == (head[0], head[1].hex())
    assert info.size < whole.size * 0.7 and info.sha256 == snapshot.file_sha256(out)[0]
    (tmp_path / "r").mkdir(mode=0o700)
    os.replace(out, tmp_path / "r" / "data.mdb")
    with Store.open(str(tmp_path / "r"), readonly=True) as r:
        with r.reader() as rd:
            assert {k[:2] for k, _ in rd.scan()} == {b"a/"}
        assert r.head() == head and r.log_bounds()[0] == head[0] + 1
        assert prune.held_keyspaces(r) is None  # node-local state does not travel
        report = check(r)
        assert report.ok, report
