"""A standby whose apply thread died must end its session loudly, never wait forever.

The replica client (a standby's, `ha/standby.py`) hands records to its apply
thread through a queue bounded by `PIPELINE`. When the thread dies on an apply error while
the reader still holds buffered frames, the reader must not block for ever waiting for
room in the queue: the standby would stop applying without a word and the leader answer
503 `not-in-sync` for good. Real stores; the thread is the client's own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from replicator import wire
from replicator.client import PIPELINE, _ApplyThread
from store.ops import SET, Op
from store.store import Store


def test_put_fails_once_the_apply_thread_died(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    rep = Store.create(str(tmp_path / "rep"), db_id=root.db_id, sync=False)
    try:
        for i in range(3 * PIPELINE + 2):
            root.apply([Op(SET, f"a/{i}".encode(), b"v", "p")])
        recs = root.read_log(1)
        assert len(recs) >= 3 * PIPELINE + 2

        async def run() -> BaseException | None:
            loop = asyncio.get_running_loop()
            applied: list[int] = []
            applier = _ApplyThread(
                rep, loop, lambda r: applied.append(r.last_seq), lambda _h: None,
                wire.FrameReader(1 << 20), lambda _g, _c, _s: None,
            )  # fmt: skip
            # The second record first: a gap the store refuses, so the thread dies on its
            # first apply; the reader goes on queueing what it had buffered.
            with pytest.raises(Exception) as caught:  # any error, but not a hang
                async with asyncio.timeout(10):
                    for rec in recs[1:]:
                        await applier.put(rec)
            assert not isinstance(caught.value, TimeoutError), "put waited for ever"
            assert applied == []
            return await applier.finish()

        error = asyncio.run(run())
        assert error is not None  # the thread's own error, for the session to raise
        assert rep.last_seq() == 0
    finally:
        root.close()
        rep.close()
