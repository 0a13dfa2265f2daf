"""The apply window: a replica following a busy root waits briefly for more records and
commits them together (`ReplicaClient.apply_window`), but never holds back a large group
or a stop. A real `ReplicaClient` following a real `ReplicationSource` over a socket."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

from replicator.client import WINDOW_BYTES, ReplicaClient
from replicator.heartbeat import RelayedHeartbeat
from replicator.selection import Selector
from replicator.status import StatusBoard
from store.ops import SET, Op
from store.store import Store
from tests.replicator.harness import RootNode
from tests.support.procs import run_mercury

#: Long beside the gaps between the root's writes, so a group never closes early on a
#: slow machine; every test here either waits it out or shows it is not waited.
WINDOW_S = 3.0


def _client(store: Store, port: int, data_dir: Path, window: float) -> ReplicaClient:
    return ReplicaClient(
        store,
        Selector([("127.0.0.1", port)]),
        node_id=uuid.uuid4().bytes,
        board=StatusBoard(str(data_dir)),
        relay=RelayedHeartbeat(),
        apply_window=window,
    )


async def _until(pred: object, timeout: float) -> float:
    """Seconds until `pred()` holds (TimeoutError after `timeout`)."""
    t0 = time.monotonic()
    while not pred():  # type: ignore[operator]
        if time.monotonic() - t0 > timeout:
            raise TimeoutError
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


def _write(root: RootNode, key: bytes, value: bytes) -> None:
    root.store.apply([Op(SET, key, value, owner="t")])


def test_records_arriving_within_the_window_are_committed_together(tmp_path: Path) -> None:
    root = RootNode(str(tmp_path / "root"), heartbeat_ms=60_000)
    store = Store.create(str(tmp_path / "replica"), db_id=root.store.db_id, sync=False)
    try:

        async def run() -> None:
            client = _client(store, root.port, tmp_path / "replica", WINDOW_S)
            task = asyncio.create_task(client.run())
            await _until(lambda: client.board.status.state == "streaming", 10)
            for i in range(5):  # five root batches, a record each, 20 ms apart
                await asyncio.to_thread(_write, root, b"k%d" % i, b"v" * 100)
                await asyncio.sleep(0.02)
            await _until(lambda: store.last_seq() == 5, WINDOW_S + 10)
            await _until(lambda: client.board.status.applied_records == 5, 5)
            st = client.board.status
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert (st.applied_records, st.apply_commits) == (5, 1)

        asyncio.run(run())
    finally:
        store.close()
        root.close()


def test_a_group_past_window_bytes_commits_without_waiting(tmp_path: Path) -> None:
    root = RootNode(str(tmp_path / "root"), heartbeat_ms=60_000)
    store = Store.create(str(tmp_path / "replica"), db_id=root.store.db_id, sync=False)
    try:

        async def run() -> float:
            client = _client(store, root.port, tmp_path / "replica", 30.0)
            task = asyncio.create_task(client.run())
            await _until(lambda: client.board.status.state == "streaming", 10)
            # incompressible: the group is sized by its records as stored
            await asyncio.to_thread(_write, root, b"big", os.urandom(WINDOW_BYTES + 4096))
            took = await _until(lambda: store.last_seq() == 1, 20)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return took

        assert asyncio.run(run()) < 20  # not the 30 s window
    finally:
        store.close()
        root.close()


def test_stopping_mid_window_commits_what_it_holds_at_once(tmp_path: Path) -> None:
    root = RootNode(str(tmp_path / "root"), heartbeat_ms=60_000)
    store = Store.create(str(tmp_path / "replica"), db_id=root.store.db_id, sync=False)
    try:

        async def run() -> float:
            client = _client(store, root.port, tmp_path / "replica", 30.0)
            task = asyncio.create_task(client.run())
            await _until(lambda: client.board.status.state == "streaming", 10)
            await asyncio.to_thread(_write, root, b"k", b"v")
            # The record is in the window (nothing committed yet); stop the client.
            await asyncio.sleep(0.5)
            assert store.last_seq() == 0
            t0 = time.monotonic()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return time.monotonic() - t0

        assert asyncio.run(run()) < 20  # not the 30 s window
        assert store.last_seq() == 1
    finally:
        store.close()
        root.close()


def test_an_apply_window_out_of_range_is_refused_before_anything_starts(tmp_path: Path) -> None:
    for ms in ("-1", "1001", "nan"):
        out = run_mercury(
            "replica", str(tmp_path / "r"), "--source", "127.0.0.1:1", "--apply-window-ms", ms
        )
        assert out.returncode != 0, ms
        assert "--apply-window-ms" in out.stderr, out.stderr
        assert not (tmp_path / "r").exists()
