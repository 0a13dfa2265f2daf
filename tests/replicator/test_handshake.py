"""The source's handshake options and a diverged history, with a raw client and a real
`ReplicaClient`, over the in-memory transport."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from replicator import frames, wire
from replicator.client import ReplicationFailed
from replicator.memnet import MemoryNetwork
from replicator.source import ReplicationSource
from store.ops import SET, Op
from store.store import Store
from testkit.replication import MEM_PORT, mem_client, mem_source, running, until


def _write(store: Store, n: int, batch: int = 100) -> None:
    for b in range(0, n, batch):
        store.apply([Op(SET, f"k{i:08d}".encode(), b"v", owner="t") for i in range(b, b + batch)])


def _hello(store: Store, last: int, options: int = 0, stop: int = 0) -> bytes:
    return frames.encode_hello(
        frames.Hello(
            frames.PROTOCOL_VERSION,
            frames.MODE_STREAM,
            options,
            uuid.uuid4().bytes,
            uuid.UUID(store.db_id).bytes,
            last,
            stop,
            0,
            frames.ZERO_SHA,
        )
    )


async def _frames(
    store: Store, last: int, options: int = 0, stop: int = 0, until_type: int = frames.END
) -> list[tuple[int, bytes]]:
    """A raw session with a source of `store`: the frames after WELCOME, up to and with
    the first of `until_type`."""
    net = MemoryNetwork()
    source = await mem_source(net, "root", store)
    link = await net.transport("raw").connect("root", MEM_PORT, timeout=5)
    got: list[tuple[int, bytes]] = []
    try:
        await link.send(_hello(store, last, options, stop))
        assert (await link.recv(3)).type == frames.WELCOME
        while not got or got[-1][0] != until_type:
            f = await link.recv(3)
            got.append((f.type, bytes(f.body)))
        return got
    finally:
        await link.close()
        await source.stop()


def test_stop_seq_ends_the_stream_after_the_record_holding_it(store: Store) -> None:
    _write(store, 50, batch=10)
    got = asyncio.run(_frames(store, 10, stop=25))
    records = [wire.parse_record(b) for t, b in got if t == frames.RECORD]
    assert [(r.first_seq, r.last_seq) for r in records] == [(11, 20), (21, 30)]
    assert got[-1] == (frames.END, frames.encode_end(30)[frames.HEADER_SIZE :])


def test_newest_only_skips_history(store: Store) -> None:
    _write(store, 50, batch=10)
    got = asyncio.run(_frames(store, 0, frames.OPT_NEWEST_ONLY, until_type=frames.HEARTBEAT))
    assert [t for t, _ in got] == [frames.HEARTBEAT]
    assert frames.decode_heartbeat(got[-1][1]).seq == 50


def test_replica_stops_with_clear_error_on_hash_chain_mismatch(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    _write(root, 20, batch=10)
    # Same database id, different history: the first 10 seqs hold other values.
    forked = Store.create(str(tmp_path / "fork"), db_id=root.db_id, sync=False)
    forked.apply([Op(SET, f"x{i}".encode(), b"other", owner="t") for i in range(10)])

    async def go() -> None:
        net = MemoryNetwork()
        source = await mem_source(net, "root", root)
        client = mem_client(net, "fork", forked, ["root"])
        try:
            async with running(client) as task:
                await until(task.done, 10, "the client gives up")
                err = task.exception()
                assert isinstance(err, ReplicationFailed), err
        finally:
            await source.stop()
        st = client.board.status
        assert st.state == "diverged", st
        assert st.error is not None and "diverged history at seq 10" in st.error, st
        assert "rm -r DATA_DIR" in st.error

    try:
        asyncio.run(go())
        assert forked.last_seq() == 10  # nothing of the foreign record was applied
        with forked.reader() as r:
            v = r.get(b"x3")
            assert v is not None and v.value == b"other"
    finally:
        forked.close()
        root.close()


def test_kept_snapshot_is_deleted_once_expired(store: Store) -> None:
    _write(store, 100)

    async def go() -> None:
        source = await mem_source(MemoryNetwork(), "root", store)
        try:
            await _expire(source)
        finally:
            await source.stop()

    asyncio.run(go())


async def _expire(source: ReplicationSource) -> None:
    path, info = await source._snapshot_for("")
    assert Path(path).exists()
    kept = source._snapshot
    assert kept is not None
    source._snapshot = (kept[0], kept[1], kept[2] - 10_000)
    source._expire_snapshot()
    assert not Path(path).exists() and source._snapshot is None
    # The next bootstrap simply makes a new one.
    path2, info2 = await source._snapshot_for(info.sha256)
    assert Path(path2).exists() and info2.seq == info.seq


def test_heartbeats_carry_the_root_head_only_to_a_client_that_asks(store: Store) -> None:
    _write(store, 30, batch=10)
    seq, head = store.head()

    def first_heartbeat(options: int) -> bytes:
        got = asyncio.run(_frames(store, seq, options, until_type=frames.HEARTBEAT))
        return got[-1][1]

    old = first_heartbeat(0)
    assert len(old) == 28  # what a client from before the option decodes
    new = first_heartbeat(frames.OPT_HEADS)
    hb = frames.decode_heartbeat(new)
    assert len(new) == 60 and (hb.seq, hb.head) == (seq, head)
