"""Replicas refuse a source of an older leadership term (`replicator/terms.py`).

Two real sources of one database: "old" holds the history up to a promotion of term 3 (a
deposed leader still running), "new" continues it with term 5 and more writes. A real
replica that already applied term 5 lists the old source first: it must refuse it (WELCOME
carries the source's term) and stream from the new one, instead of sitting on a source that
can only ever be behind it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from replicator import frames
from replicator.memnet import MemoryNetwork
from replicator.terms import source_too_old, store_term
from store.ops import SET, Op
from store.promotion import promote
from store.store import Store
from testkit.replication import mem_client, mem_source, running, until


def _copy_history(src: Store, dst: Store) -> None:
    seq = dst.last_seq() + 1
    while seq <= src.last_seq():
        recs = src.read_log(seq, max_records=100)
        dst.apply_log_records(recs)
        seq = recs[-1].last_seq + 1


def _lay_out(tmp_path: Path) -> None:
    old = Store.create(str(tmp_path / "old"))
    try:
        for b in range(0, 200, 50):
            old.apply([Op(SET, f"k{i:05d}".encode(), b"v", owner="t") for i in range(b, b + 50)])
        promote(old, extra={"term": 3, "node": "a", "url": "http://a"})
        new = Store.create(str(tmp_path / "new"), db_id=old.db_id)
        try:
            _copy_history(old, new)
            promote(new, extra={"term": 5, "node": "b", "url": "http://b"})

            new.apply([Op(SET, f"n{i:05d}".encode(), b"w", owner="t") for i in range(100)])
            rep = Store.create(str(tmp_path / "r"), db_id=old.db_id)
            try:
                _copy_history(new, rep)
                assert store_term(rep) == 5 and store_term(old) == 3
            finally:
                rep.close()
        finally:
            new.close()
    finally:
        old.close()


def test_replica_refuses_a_source_of_an_older_term(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    old = Store.open(str(tmp_path / "old"), sync=False)
    new = Store.open(str(tmp_path / "new"), sync=False)
    rep = Store.open(str(tmp_path / "r"), sync=False)

    async def go() -> None:
        net = MemoryNetwork()
        sources = [await mem_source(net, "old", old), await mem_source(net, "new", new)]
        client = mem_client(net, "r", rep, ["old", "new"])
        try:
            async with running(client):
                new.apply([Op(SET, f"m{i:05d}".encode(), b"v", owner="t") for i in range(50)])
                await until(lambda: rep.last_seq() == new.last_seq(), 20, "the new source's seq")
        finally:
            for s in sources:
                await s.stop()
        st = client.board.status
        assert st.source == "new:7070", st
        assert st.errors.get("older_term", 0) >= 1, st

    try:
        asyncio.run(go())
        assert rep.head() == new.head()
    finally:
        rep.close()
        new.close()
        old.close()


def test_welcome_carries_the_term_only_when_asked() -> None:
    w = frames.Welcome(frames.PROTOCOL_VERSION, b"\x01" * 16, b"\x02" * 16, 10, 1, 200)
    plain = frames.encode_welcome(w)
    withterm = frames.encode_welcome(w._replace(term=7))
    assert len(withterm) == len(plain) + 8
    assert frames.decode_welcome(plain[frames.HEADER_SIZE :]).term is None
    assert frames.decode_welcome(withterm[frames.HEADER_SIZE :]) == w._replace(term=7)


def test_older_term_rule() -> None:
    assert source_too_old(3, 5)
    assert not source_too_old(5, 5)
    assert not source_too_old(7, 5)
    assert not source_too_old(None, 5)  # an older source that does not say
    assert not source_too_old(0, 5)  # a promotion by hand names no term
