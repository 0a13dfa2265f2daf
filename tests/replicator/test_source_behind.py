"""A replica ahead of its own source — what a system crash leaves when the source, itself a
replica, commits without syncing its last meta page (`Store.open(last_commit_durable=
False)`) and comes back one commit behind what it already streamed down — waits for the
source to have the records again and goes on from there: no error, no divergence, and the
same log as the root. A real `ReplicaClient` following a real `ReplicationSource` over the
in-memory transport."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from replicator.memnet import MemoryNetwork
from store.ops import SET, LogRecord, Op
from store.store import Store
from testkit.replication import mem_client, mem_source


def _records(root: Store, upto: int) -> list[LogRecord]:
    return [r for r in root.read_log(1, max_records=10_000) if r.last_seq <= upto]


def test_a_replica_ahead_of_its_source_waits_for_it_and_goes_on(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    for i in range(6):  # six commits, seqs 1..6
        root.apply([Op(SET, f"k{i}".encode(), b"v%d" % i, owner="t")])
    # The source came back at seq 4; its replica had already taken seq 5 from it.
    (tmp_path / "source").mkdir()
    src_store = Store.create(str(tmp_path / "source" / "s"), db_id=root.db_id, sync=False)
    src_store.apply_log_records(_records(root, 4))
    child = Store.create(str(tmp_path / "child"), db_id=root.db_id, sync=False)
    child.apply_log_records(_records(root, 5))
    net = MemoryNetwork()
    client = mem_client(net, "child", child, ["source"])
    board = client.board

    async def run() -> None:
        source = await mem_source(net, "source", src_store, heartbeat_ms=100)
        task = asyncio.create_task(client.run())
        try:
            t0 = time.monotonic()
            while board.status.state != "streaming":
                assert time.monotonic() - t0 < 10, board.status
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # heartbeats at the source's seq 4 meanwhile
            assert child.last_seq() == 5 and board.status.state == "streaming"
            # The source fetches what it lost and more; the replica follows from seq 6.
            await asyncio.to_thread(src_store.apply_log_records, _records(root, 6)[4:])
            t0 = time.monotonic()
            while child.last_seq() < 6:
                assert time.monotonic() - t0 < 10, board.status
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await source.stop()

    try:
        asyncio.run(run())
        assert board.status.state == "streaming", board.status
        assert not board.status.errors
        assert child.head() == root.head()
        assert [(r.header, r.payload) for r in child.read_log(1)] == [
            (r.header, r.payload) for r in root.read_log(1)
        ]
    finally:
        child.close()
        src_store.close()
        root.close()
