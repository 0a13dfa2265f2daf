"""The in-memory network (`replicator/memnet.py`): deterministic given a seed, partitions
hold everything until healed, a reset overtakes the data; and the replication protocol
over a network that reorders, loses and partitions still converges byte for byte."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from replicator import frames
from replicator.heartbeat import RelayedHeartbeat
from replicator.memnet import Conditions, MemoryNetwork, run_virtual
from replicator.transport import HIGH_WATER, Link, PeerClosed
from store.ops import SET, Op
from store.store import Store
from testkit.replication import mem_client, mem_source, running, until

ROUGH = Conditions(delay=(0.0, 0.004), loss=0.2, reorder=0.3, reorder_delay=0.003)


async def _pair(net: MemoryNetwork) -> tuple[Link, Link]:
    """(accepted, connected) links between nodes "a" and "b"."""
    got: asyncio.Queue[Link] = asyncio.Queue()

    async def handler(link: Link) -> None:
        await got.put(link)
        await asyncio.Event().wait()  # held open until the listener closes

    await net.transport("a").listen("a", 1, handler)
    client = await net.transport("b").connect("a", 1, timeout=5)
    return await got.get(), client


def _deliveries(seed: int) -> list[int]:
    """What "b" receives of 200 numbered frames over ROUGH conditions, in order (on a
    virtual clock: the delays take no time, and the same seed gives the same run)."""

    async def go() -> list[int]:
        net = MemoryNetwork(seed, ROUGH)
        server, client = await _pair(net)
        for i in range(200):
            server.write(frames.encode_wait(i))
        await server.close()
        out = []
        while True:
            try:
                out.append(frames.decode_wait(bytes((await client.recv(5)).body)))
            except PeerClosed:
                return out

    return run_virtual(go())


def test_the_same_seed_gives_the_same_losses_and_order() -> None:
    first = _deliveries(7)
    assert first == _deliveries(7)
    assert first != _deliveries(8)
    assert len(first) < 200  # some were lost
    assert first != sorted(first)  # some overtook others


def test_a_partition_holds_everything_until_healed() -> None:
    async def go() -> None:
        net = MemoryNetwork(1)
        server, client = await _pair(net)
        net.partition("a", "b")
        big = frames.encode_frame(frames.RECORD, b"r" * (HIGH_WATER * 8))
        server.write(big)  # a write never fails: the bytes wait
        with pytest.raises(TimeoutError):
            await server.drain(0.05)  # more than the window is held back
        with pytest.raises(TimeoutError):
            await client.recv(0.05)
        with pytest.raises(TimeoutError):  # no new link through the cut either
            await net.transport("b").connect("a", 1, timeout=0.05)
        net.heal("a", "b")
        assert bytes((await client.recv(1)).body) == big[frames.HEADER_SIZE :]
        await server.drain(1)

    asyncio.run(go())


def test_a_reset_overtakes_the_data_and_drops_it() -> None:
    async def go() -> None:
        net = MemoryNetwork(1, Conditions(delay=(0.01, 0.01)))
        server, client = await _pair(net)
        server.write(frames.encode_wait(1))
        server.abort()
        with pytest.raises(ConnectionResetError):  # waits for the reset: no frame first
            await client.recv(1)
        with pytest.raises(ConnectionResetError):
            client.write(frames.encode_wait(2))

    asyncio.run(go())


def test_a_measured_delay_distribution_replaces_the_uniform_range() -> None:
    """`delay_samples` (a calibration's measured hops): every frame's delay is one of
    them, never a draw from the `delay` range beside it."""

    async def go() -> set[float]:
        net = MemoryNetwork(3, Conditions(delay=(5.0, 9.0), delay_samples=(0.25, 1.0)))
        server, client = await _pair(net)
        loop = asyncio.get_running_loop()
        took = set()
        for i in range(40):
            sent = loop.time()
            server.write(frames.encode_wait(i))
            assert frames.decode_wait(bytes((await client.recv(5)).body)) == i
            took.add(round(loop.time() - sent, 3))
        return took

    assert run_virtual(go()) == {0.25, 1.0}


def _write(store: Store, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.apply([Op(SET, f"k{i:05d}".encode(), b"v%d" % i, owner="t")])


def _same_log(a: Store, b: Store) -> bool:
    return [(r.header, r.payload) for r in a.read_log(1, max_records=100_000)] == [
        (r.header, r.payload) for r in b.read_log(1, max_records=100_000)
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_replica_converges_over_a_network_that_loses_reorders_and_partitions(
    tmp_path: Path, seed: int
) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    rep = Store.create(str(tmp_path / "rep"), db_id=root.db_id, sync=False)

    async def go() -> None:
        net = MemoryNetwork(seed)
        source = await mem_source(net, "root", root, heartbeat_ms=50)
        client = mem_client(net, "rep", rep, ["root"], staleness=0.5)
        try:
            async with running(client):
                _write(root, 20)
                await until(lambda: rep.last_seq() == 20, 10, "the clean start")
                net.set_conditions("root", "rep", ROUGH)
                _write(root, 40, 20)  # frames lost and reordered: gaps, reconnects
                # The behaviour under test: the stream runs on the rough network a while.
                await asyncio.sleep(0.3)
                net.set_conditions("root", "rep", Conditions())
                net.partition("root", "rep")
                _write(root, 20, 60)
                # The behaviour under test: a partition lasting past the staleness (a
                # session on it ends as stale; a reconnect waits for the heal).
                await asyncio.sleep(0.6)
                assert rep.last_seq() < 80
                net.heal()
                await until(lambda: rep.last_seq() == 80, 20, "convergence")
        finally:
            await source.stop()
        errors = client.board.status.errors
        assert set(errors) - {"stale", "unreachable"}, f"the rough network went unnoticed: {errors}"

    try:
        asyncio.run(go())
        assert rep.head() == root.head()
        assert _same_log(root, rep)
    finally:
        rep.close()
        root.close()


def test_a_tree_converges_over_delayed_links(tmp_path: Path) -> None:
    """Root -> t1 -> t2 over links of 50-100 ms, a write every 0.2 s: every node ends with
    the root's log, t1 relaying the root's heartbeat. On an ordinary loop, not a
    `VirtualClockLoop`: the log reads and applies run in threads, off a virtual clock,
    which can then jump past every timer while a thread works (a client's staleness
    timer fires again and again, the loop never idles, the clock never reaches the
    test's bound) — a tree on a virtual clock needs the store's work on the loop too."""
    root = Store.create(str(tmp_path / "root"), sync=False)
    t1 = Store.create(str(tmp_path / "t1"), db_id=root.db_id, sync=False)
    t2 = Store.create(str(tmp_path / "t2"), db_id=root.db_id, sync=False)

    async def go() -> float:
        loop = asyncio.get_running_loop()
        net = MemoryNetwork(5, Conditions(delay=(0.05, 0.1)))
        sources = [await mem_source(net, "root", root, heartbeat_ms=1000)]
        relay = RelayedHeartbeat()  # t1 relays the root's heartbeat, as a worker does
        sources.append(await mem_source(net, "t1", t1, heartbeat=relay))
        relay.add_listener(sources[-1].wake)
        c1 = mem_client(net, "t1", t1, ["root"], relay=relay)
        c2 = mem_client(net, "t2", t2, ["t1"])
        try:
            async with running(c1), running(c2):
                for b in range(10):
                    root.apply([Op(SET, f"k{b}-{i}".encode(), b"v", owner="t") for i in range(10)])
                    await asyncio.sleep(0.2)  # the writes' pace: a stream, not one burst
                await until(lambda: t2.last_seq() == root.last_seq(), 60, "t2 caught up")
        finally:
            for s in sources:
                await s.stop()
        assert c1.board.status.errors == {} and c2.board.status.errors == {}
        return loop.time()

    try:
        assert asyncio.run(go()) > 0
        assert t1.head() == root.head() == t2.head()
        assert _same_log(root, t1) and _same_log(root, t2)
    finally:
        t2.close()
        t1.close()
        root.close()
