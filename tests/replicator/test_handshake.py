"""The source's handshake options and a diverged history, with a raw client."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx

from replicator import frames, wire
from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs
from testkit.replication import RootNode, root_node, status, wait_for
from tests.replicator.nodes import start_replica


async def _session(
    root: RootNode, last: int, *, stop: int = 0, newest: bool = False
) -> list[tuple[object, ...]]:
    r, w = await asyncio.open_connection("127.0.0.1", root.port)
    hello = frames.Hello(
        frames.PROTOCOL_VERSION,
        frames.MODE_STREAM,
        frames.OPT_NEWEST_ONLY if newest else 0,
        uuid.uuid4().bytes,
        uuid.UUID(root.store.db_id).bytes,
        last,
        stop,
        0,
        frames.ZERO_SHA,
    )
    w.write(frames.encode_hello(hello))
    got: list[tuple[object, ...]] = []
    try:
        while True:
            ftype, body = await asyncio.wait_for(wire.read_frame(r), 3)
            if ftype == frames.RECORD:
                rec = wire.parse_record(body)
                got.append(("record", rec.first_seq, rec.last_seq))
            elif ftype == frames.END:
                got.append(("end", frames.decode_end(body)))
                return got
            elif ftype == frames.HEARTBEAT:
                got.append(("heartbeat", frames.decode_heartbeat(body).seq))
                if newest:
                    return got
    finally:
        w.close()


def test_stop_seq_ends_the_stream_after_the_record_holding_it(tmp_path: Path) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(50, batch=10)
        got = asyncio.run(_session(root, 10, stop=25))
        records = [g for g in got if g[0] == "record"]
        assert records == [("record", 11, 20), ("record", 21, 30)]
        assert got[-1] == ("end", 30)


def test_newest_only_skips_history(tmp_path: Path) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(50, batch=10)
        got = asyncio.run(_session(root, 0, newest=True))
        assert [g for g in got if g[0] == "record"] == []
        assert got[-1] == ("heartbeat", 50)


def test_replica_stops_with_clear_error_on_hash_chain_mismatch(
    tmp_path: Path, procs: Procs
) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(20, batch=10)
        # Same database id, different history: the first 10 seqs hold other values.
        forked = Store.create(str(tmp_path / "fork"), db_id=root.store.db_id)
        forked.apply([Op(SET, f"x{i}".encode(), b"other", owner="t") for i in range(10)])
        forked.close()
        r = start_replica(procs, tmp_path / "fork", [root.port], repl=False, name="fork")
        wait_for(lambda: status(r.http)["replication_state"] == "diverged", 20, "diverged")
        st = status(r.http)
        assert "diverged history at seq 10" in st["replication_error"], st
        assert "rm -r DATA_DIR" in st["replication_error"], st
        assert st["seq"] == 10  # nothing of the foreign record was applied
        assert httpx.get(f"http://127.0.0.1:{r.http}/v1/kv/x3").content == b"other"


def test_kept_snapshot_is_deleted_once_expired(tmp_path: Path) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(100)
        path, info = root.call(root.source._snapshot_for(""))
        assert Path(path).exists()

        async def age_and_expire() -> None:
            kept = root.source._snapshot
            assert kept is not None
            root.source._snapshot = (kept[0], kept[1], kept[2] - 10_000)
            root.source._expire_snapshot()

        root.call(age_and_expire())
        assert not Path(path).exists() and root.source._snapshot is None
        # The next bootstrap simply makes a new one.
        path2, info2 = root.call(root.source._snapshot_for(info.sha256))
        assert Path(path2).exists() and info2.seq == info.seq


async def _first_heartbeat(root: RootNode, options: int) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", root.port)
    seq = root.store.last_seq()
    db_id = uuid.UUID(root.store.db_id).bytes
    hello = frames.Hello(
        frames.PROTOCOL_VERSION, frames.MODE_STREAM, options, uuid.uuid4().bytes, db_id, seq,
        0, 0, frames.ZERO_SHA,
    )  # fmt: skip
    w.write(frames.encode_hello(hello))
    try:
        while True:
            ftype, body = await asyncio.wait_for(wire.read_frame(r), 3)
            if ftype == frames.HEARTBEAT:
                return body
    finally:
        w.close()


def test_heartbeats_carry_the_root_head_only_to_a_client_that_asks(tmp_path: Path) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(30, batch=10)
        seq, head = root.store.head()
        old = asyncio.run(_first_heartbeat(root, 0))
        assert len(old) == 28  # what a client from before the option decodes
        new = asyncio.run(_first_heartbeat(root, frames.OPT_HEADS))
        hb = frames.decode_heartbeat(new)
        assert len(new) == 60 and (hb.seq, hb.head) == (seq, head)
