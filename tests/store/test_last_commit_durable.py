"""A store opened with `last_commit_durable=False` (a replica's): its commits sync their data
pages but leave the meta page to the next sync (LMDB's MDB_NOMETASYNC), and closing it
syncs; by default, and for a store written without sync, nothing changes."""

from __future__ import annotations

from pathlib import Path

from store.ops import SET, Op
from store.store import Store


def _flags(store: Store) -> tuple[bool, bool]:
    f = store.env.flags()
    return bool(f["sync"]), bool(f["metasync"])


def test_a_store_syncs_every_commit_whole_by_default(tmp_path: Path) -> None:
    Store.create(str(tmp_path / "s")).close()
    with Store.open(str(tmp_path / "s")) as s:
        assert _flags(s) == (True, True)
        assert not s.defers_meta_sync()


def test_a_replica_store_syncs_data_and_defers_the_meta_page(tmp_path: Path) -> None:
    Store.create(str(tmp_path / "s")).close()
    with Store.open(str(tmp_path / "s"), last_commit_durable=False) as s:
        assert _flags(s) == (True, False)


def test_without_sync_the_meta_page_is_not_synced_either(tmp_path: Path) -> None:
    Store.create(str(tmp_path / "s")).close()
    with Store.open(str(tmp_path / "s"), sync=False, last_commit_durable=False) as s:
        assert _flags(s) == (False, False)
        assert not s.defers_meta_sync()  # nothing of a store written without sync is synced


def test_closing_a_replica_store_syncs_its_last_commit(tmp_path: Path) -> None:
    """A clean stop leaves nothing for a crash to undo: the close syncs, and everything
    committed is there on reopening."""
    path = str(tmp_path / "s")
    Store.create(path).close()
    s = Store.open(path, last_commit_durable=False)
    s.apply([Op(SET, b"k", b"v", owner="t")])
    seq = s.last_seq()
    assert s.defers_meta_sync()
    s.close()
    with Store.open(path) as again:
        assert again.last_seq() == seq
        got = again.get(b"k")
        assert got is not None and got.value == b"v"


def test_a_read_only_store_does_not_sync_on_close(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    Store.create(path).close()
    with Store.open(path, readonly=True, last_commit_durable=False) as s:
        assert not s.defers_meta_sync()
