"""The invalidation stream and miss answers over real TCP: a `ReplicationSource` on a real
store (testkit's RootNode, its own loop) and a `CacheNode` on the test's loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from cache.node import CacheNode
from cache.store import CacheStore
from replicator.invalidation import (
    Fetch,
    Fetched,
    Invalidation,
    Item,
    decode_fetch,
    decode_fetched,
    decode_invalidate,
    encode_fetch,
    encode_fetched,
    encode_invalidate,
)
from replicator.tcp import TcpTransport
from store.ops import DELETE, SET, Op
from testkit.replication import RootNode


def test_codecs_round_trip() -> None:
    inv = Invalidation(5, 7, [(5, b"a"), (7, b"b" * 500)])
    assert decode_invalidate(encode_invalidate(inv)[10:]) == inv
    f = Fetch(3, 9, [b"x", b"y"])
    assert decode_fetch(encode_fetch(f)[10:]) == f
    a = Fetched(3, 0, 9, [Item(b"v", 4), Item(None, 0), Item(b"", 2)])
    assert decode_fetched(encode_fetched(a)[10:]) == a


async def _until(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached after {timeout}s")
        await asyncio.sleep(0.01)


def test_a_commit_reaches_the_cache_without_waiting_for_a_heartbeat(tmp_path: Path) -> None:
    # Heartbeats a minute apart: only the commit's wake-up can bring the invalidation
    # within the deadline (a stream woken by its heartbeat timer alone fails here).
    root = RootNode(str(tmp_path / "root"), heartbeat_ms=60_000)
    try:
        root.store.apply([Op(SET, b"a", b"one", owner="t")])
        asyncio.run(_follow(root, tmp_path))
    finally:
        root.close()


async def _follow(root: RootNode, tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path / "cache"), 1 << 20)
    node = CacheNode(store, 1 << 20, [("127.0.0.1", root.port)], TcpTransport(None))
    task = asyncio.get_running_loop().create_task(node.run())
    try:
        await _until(lambda: node.status()["connected"] is True, "connected")
        (a,) = await node.get([b"a"])
        assert (a.value, a.served) == (b"one", "miss")
        (a,) = await node.get([b"a"])
        assert (a.value, a.served) == (b"one", "hit")
        (n,) = await node.get([b"none"])
        assert (n.value, n.served) == (None, "miss")
        seq = root.store.apply([Op(SET, b"a", b"two", owner="t")]).last_seq
        await _until(lambda: node.state.applied >= seq, "invalidation applied")
        (a,) = await node.get([b"a"])
        assert (a.value, a.served) == (b"two", "miss")
        seq = root.store.apply([Op(DELETE, b"a", b"", owner="t")]).last_seq
        await _until(lambda: node.state.applied >= seq, "delete applied")
        (a,) = await node.get([b"a"])
        assert (a.value, a.version) == (None, 0)
        assert node.counters.invalidations == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
