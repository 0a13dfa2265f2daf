"""The commit gate (`core/commitgate.py`) across threads, as the root uses it: a commit
held in a worker thread makes `idle()` hand the loop a future, done once the last commit
in flight ends; with none in flight there is nothing to wait for. And the slice clock
(`core/slices.py`) is due only once its budget has run."""

from __future__ import annotations

import asyncio
import threading

from core.commitgate import CommitGate
from core.slices import SliceClock


def test_work_waits_for_every_commit_in_flight() -> None:
    gate = CommitGate()

    async def go() -> None:
        assert gate.idle() is None and not gate.busy()
        first, second, release = threading.Event(), threading.Event(), threading.Event()

        def commit(held: threading.Event) -> None:
            with gate.held():
                held.set()
                release.wait(30)

        threads = [threading.Thread(target=commit, args=(e,)) for e in (first, second)]
        for t in threads:
            t.start()
        assert await asyncio.to_thread(first.wait, 30)
        assert await asyncio.to_thread(second.wait, 30)
        fut = gate.idle()
        assert fut is not None and not fut.done() and gate.busy()
        release.set()
        await asyncio.wait_for(fut, 30)  # resolved on this loop once both ended
        for t in threads:
            t.join(30)
        assert gate.idle() is None
        assert gate.commits == 2 and gate.waits == 1

    asyncio.run(go())


def test_a_slice_is_due_only_after_its_budget() -> None:
    clock = SliceClock(budget=3600.0)
    assert not clock.due()
    spent = SliceClock(budget=0.0)
    assert spent.due()
    spent.budget = 3600.0
    spent.start()
    assert not spent.due()
