"""`Reader.seq()` is the seq of the state the reader sees, not the store's latest: a range
page or a get_bulk answer names exactly the state it was read from."""

from __future__ import annotations

from pathlib import Path

from store.ops import SET, Op
from store.store import Store


def test_reader_seq_is_its_transactions_state(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "s"))
    try:
        store.apply([Op(SET, b"a", b"1", owner="t")])
        with store.reader() as r:
            before = r.seq()
            assert before == store.last_seq()
            store.apply([Op(SET, b"b", b"2", owner="t")])  # commits while the read is open
            assert store.last_seq() == before + 1
            assert r.seq() == before  # the reader still sees the older state...
            assert r.get(b"b") is None  # ...consistently with what it reads
    finally:
        store.close()
