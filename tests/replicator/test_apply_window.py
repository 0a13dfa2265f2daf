"""The apply window: a replica following a heavy stream waits briefly for more records and
commits them together, but commits a light stream, a group of WINDOW_BYTES and a stop at
once. The pacing rule alone (`replicator/pacing.py`), then a real `ReplicaClient`
following a real `ReplicationSource` over the in-memory transport."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from replicator.client import WINDOW_BYTES, ReplicaClient
from replicator.memnet import MemoryNetwork
from replicator.pacing import BUSY_BYTES, CommitPacer
from store.ops import SET, Op
from store.store import Store
from testkit.replication import mem_client, mem_source
from tests.replicator.nodes import assert_refused_before_start

#: A window long beside everything else a test waits for: a record it held would show.
LONG_S = 30.0
#: Incompressible records this large make a heavy stream after a few of them.
HEAVY = 300_000


def test_a_light_stream_never_waits() -> None:
    p = CommitPacer(0.02)
    for i in range(100):
        now = i * 0.001
        p.arrived(now, 100)
        assert p.deadline(now) == now
        p.started(now)


def test_a_heavy_stream_waits_out_the_window_from_the_last_commit() -> None:
    p = CommitPacer(0.02)
    p.arrived(0.0, BUSY_BYTES - 1)
    assert p.deadline(0.0) == 0.0  # not heavy yet
    p.started(0.0)
    p.arrived(0.005, 1)
    assert p.deadline(0.005) == 0.02  # heavy: 20 ms after the last commit began
    p.started(0.02)
    p.arrived(0.05, 1)
    assert p.deadline(0.05) == 0.05  # the window since that commit is over
    assert not p.busy(1.01)  # a second later the bytes have left the span


def test_a_window_of_zero_never_waits() -> None:
    p = CommitPacer(0.0)
    p.arrived(0.0, BUSY_BYTES * 10)
    p.started(0.0)
    assert p.deadline(0.001) == 0.001


async def _until(pred: Callable[[], bool], timeout: float) -> float:
    """Seconds until `pred()` holds (TimeoutError after `timeout`)."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


def _at(store: Store, seq: int) -> Callable[[], bool]:
    return lambda: store.last_seq() == seq


def _write(root: Store, key: bytes, value: bytes) -> None:
    root.apply([Op(SET, key, value, owner="t")])


def _follow(tmp_path: Path, window: float, body: Callable[..., object]) -> None:
    """Run `body(root, store, client, task)` (a coroutine function) with a client
    streaming from a source of store `root` (written from a thread, as the gateway's
    commit thread writes it)."""
    root = Store.create(str(tmp_path / "root"), sync=False)
    store = Store.create(str(tmp_path / "replica"), db_id=root.db_id, sync=False)

    async def run() -> None:
        net = MemoryNetwork()
        source = await mem_source(net, "root", root, heartbeat_ms=60_000)
        client: ReplicaClient = mem_client(net, "replica", store, ["root"], apply_window=window)
        task = asyncio.create_task(client.run())
        try:
            await _until(lambda: client.board.status.state == "streaming", 10)
            await body(root, store, client, task)  # type: ignore[misc]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await source.stop()

    try:
        asyncio.run(run())
    finally:
        store.close()
        root.close()


def test_a_light_stream_is_committed_record_by_record_at_once(tmp_path: Path) -> None:
    async def body(root: Store, store: Store, client: ReplicaClient, _: object) -> None:
        for i in range(5):
            await asyncio.to_thread(_write, root, b"k%d" % i, b"v" * 100)
            assert await _until(_at(store, i + 1), 20) < 20  # not the 30 s window
        await _until(lambda: client.board.status.applied_records == 5, 5)
        assert client.board.status.apply_commits == 5

    _follow(tmp_path, LONG_S, body)


def test_a_heavy_stream_is_committed_in_groups(tmp_path: Path) -> None:
    async def body(root: Store, store: Store, client: ReplicaClient, _: object) -> None:
        for i in range(10):  # 3 MB in well under a second, 20 ms apart
            await asyncio.to_thread(_write, root, b"k%d" % i, os.urandom(HEAVY))
            await asyncio.sleep(0.02)
        await _until(lambda: store.last_seq() == 10, 20)
        await _until(lambda: client.board.status.applied_records == 10, 5)
        assert client.board.status.apply_commits < 10

    _follow(tmp_path, 3.0, body)


async def _heavy_then_held(root: Store, store: Store) -> None:
    """Four heavy records: the first three commit at once (the stream is not heavy yet),
    the fourth makes it heavy and waits in the window."""
    for i in range(4):
        await asyncio.to_thread(_write, root, b"k%d" % i, os.urandom(HEAVY))
        if i < 3:
            await _until(_at(store, i + 1), 20)
    await asyncio.sleep(0.5)
    assert store.last_seq() == 3  # the fourth is held


def test_stopping_mid_window_commits_what_it_holds_at_once(tmp_path: Path) -> None:
    async def body(root: Store, store: Store, _: ReplicaClient, task: asyncio.Task[None]) -> None:
        await _heavy_then_held(root, store)
        t0 = time.monotonic()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert time.monotonic() - t0 < 20  # not the 30 s window
        assert store.last_seq() == 4

    _follow(tmp_path, LONG_S, body)


def test_a_group_reaching_window_bytes_commits_without_waiting(tmp_path: Path) -> None:
    async def body(root: Store, store: Store, _: ReplicaClient, __: object) -> None:
        await _heavy_then_held(root, store)
        # incompressible: a group is sized by its records as stored
        await asyncio.to_thread(_write, root, b"big", os.urandom(WINDOW_BYTES))
        assert await _until(lambda: store.last_seq() == 5, 20) < 20  # not 30 s

    _follow(tmp_path, LONG_S, body)


def test_an_apply_window_out_of_range_is_refused_before_anything_starts(tmp_path: Path) -> None:
    assert_refused_before_start(tmp_path / "r", "--apply-window-ms", ("-1", "1001", "nan"))
