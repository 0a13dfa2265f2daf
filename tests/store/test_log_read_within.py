"""`Store.read_log(within=True)` never returns more payload than asked, even no record: the
replication source reads just-committed records in the committing thread only when they
are small (`replicator/source.py`), so a large commit never delays the next one."""

from __future__ import annotations

import os
from pathlib import Path

from store.ops import SET, Op
from store.store import Store


def test_read_within_skips_a_record_larger_than_asked(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "s"))
    try:
        store.apply([Op(SET, b"small", b"x", owner="t")])
        small = store.last_seq()
        store.apply([Op(SET, b"big", os.urandom(3 << 20), owner="t")])  # incompressible
        big = store.last_seq()
        store.apply([Op(SET, b"after", b"y", owner="t")])
        assert store.read_log(big, max_bytes=1 << 20, within=True) == []
        assert [r.first_seq for r in store.read_log(big, max_bytes=1 << 20)] == [big]
        got = store.read_log(small, max_bytes=1 << 20, within=True)
        assert [r.first_seq for r in got] == [small]  # stops before the big one
        got = store.read_log(big + 1, max_bytes=1 << 20, within=True)
        assert [r.first_seq for r in got] == [big + 1]
        whole = store.read_log(small, max_bytes=8 << 20, within=True)
        assert [r.first_seq for r in whole] == [small, big, big + 1]
        assert whole == store.read_log(small, max_bytes=8 << 20)
    finally:
        store.close()
