"""Replication test nodes without the gateway.

- `RootNode`: a store written by the test process and a real `ReplicationSource` serving
  it over TCP from a background thread's event loop (for tests that need real sockets
  or `mercury replica` processes).
- `mem_source` / `mem_client`: a real source and a real `ReplicaClient` on the caller's
  event loop, linked by an in-memory network (`replicator/memnet.py`): no ports, no
  threads of their own, protocol tests in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from typing import Any

import httpx

from replicator.client import ReplicaClient
from replicator.heartbeat import RelayedHeartbeat, RootHeartbeat
from replicator.memnet import MemoryNetwork
from replicator.selection import Selector
from replicator.source import ReplicationSource
from replicator.status import StatusBoard
from store.ops import SET, Op
from store.store import Store
from testkit.wait import pause


class RootNode:
    """`store` + a source on 127.0.0.1:`port` (0 = pick one), running in a thread."""

    def __init__(
        self,
        path: str,
        port: int = 0,
        *,
        heartbeat_ms: int = 200,
        max_bootstraps: int = 1,
        sync: bool = False,
        map_size: int = 4 << 30,
        reopen: bool = False,
        chain_hash: str | None = None,
        **source_kw: Any,
    ) -> None:
        # `reopen`: serve the store already in `path` (a restarted or restored root).
        self.store = (
            Store.open(path, sync=sync)
            if reopen
            else Store.create(path, sync=sync, map_size=map_size, chain_hash=chain_hash)
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.source = ReplicationSource(
            self.store,
            "127.0.0.1",
            port,
            node_id=uuid.uuid4().bytes,
            heartbeat=RootHeartbeat(self.store, heartbeat_ms),
            max_bootstraps=max_bootstraps,
            **source_kw,
        )
        self.call(self.source.start())
        self.port = self.source.port

    def call(self, coro: Any) -> Any:
        """Run `coro` on the source's loop and wait for its result."""
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(30)

    def write(self, n: int, *, start: int = 0, batch: int = 100, prefix: str = "k") -> None:
        """Write keys prefix{start}..prefix{start+n-1} in batches."""
        for b in range(start, start + n, batch):
            ops = [
                Op(SET, f"{prefix}{i:08d}".encode(), f"v{i}-{b}".encode(), owner="t")
                for i in range(b, min(b + batch, start + n))
            ]
            self.store.apply(ops)

    def close(self) -> None:
        """Stop the source and close the store."""
        with contextlib.suppress(Exception):
            self.call(self.source.stop())
            # Transports closed by the stop close their sockets in callbacks of the next
            # loop turns: run them, or a socket is left for the garbage collector to find
            # (a ResourceWarning in whichever later test it runs during).
            self.call(asyncio.sleep(0.05))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
        self.store.close()


@contextlib.contextmanager
def root_node(path: str, **kw: Any) -> Iterator[RootNode]:
    """A RootNode closed at the end of the block."""
    node = RootNode(path, **kw)
    try:
        yield node
    finally:
        node.close()


def status(port: int) -> dict[str, Any]:
    """`GET /v1/status` of a node."""
    doc: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=5).json()
    return doc


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `cond` until true (`wait.pause`); TimeoutError after `timeout` seconds."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError):
            if cond():
                return
        time.sleep(pause(started))
    raise TimeoutError(f"{what} not reached after {timeout}s")


def wait_seq(port: int, seq: int, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until the node serving HTTP on `port` reports `seq`; return its status."""
    wait_for(lambda: status(port)["seq"] >= seq, timeout, f"seq {seq} on :{port}")
    return status(port)


def items(store: Store) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of an open store."""
    with store.reader() as r:
        return [(k, v.value) for k, v in r.scan() if v is not None]


def contents(store_path: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the store at `store_path` (opened read-only, then closed)."""
    s = Store.open(store_path, readonly=True)
    try:
        return items(s)
    finally:
        s.close()


#: The port in-memory sources listen on (any: every node has its own addresses).
MEM_PORT = 7070


async def mem_source(
    net: MemoryNetwork, name: str, store: Store, *, heartbeat_ms: int = 200, **kw: Any
) -> ReplicationSource:
    """A started source of `store` at (`name`, `MEM_PORT`) on `net` (stop it: `stop()`).
    Its heartbeat is the root's unless `kw` names another."""
    kw.setdefault("heartbeat", RootHeartbeat(store, heartbeat_ms))
    source = ReplicationSource(
        store, name, MEM_PORT, node_id=uuid.uuid4().bytes, transport=net.transport(name), **kw
    )
    await source.start()
    return source


def mem_client(
    net: MemoryNetwork, name: str, store: Store, sources: list[str], **kw: Any
) -> ReplicaClient:
    """A replica client of node `name` following the in-memory sources named `sources`
    in order (run it: `run()` in a task)."""
    kw.setdefault("relay", RelayedHeartbeat())
    kw.setdefault("node_id", uuid.uuid4().bytes)
    return ReplicaClient(
        store,
        Selector([(s, MEM_PORT) for s in sources]),
        board=StatusBoard(store.path),
        transport=net.transport(name),
        **kw,
    )


async def until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """On the loop: poll `cond` every 5 ms until true; TimeoutError after `timeout` s of
    the loop's clock (`testkit.wait.wait_until_async` bounds by the wall clock, which a
    `VirtualClockLoop` does not follow: the in-memory tests wait on the loop's)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise TimeoutError(f"{what} not reached after {timeout}s")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def running(client: ReplicaClient) -> AsyncIterator[asyncio.Task[None]]:
    """`client.run()` in a task for the block; cancelled (and awaited) at its end."""
    task = asyncio.ensure_future(client.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
