"""The path a semi-synchronous acknowledgement waits on, piece by piece, over real sockets.

- The source sends a caught-up stream what was just committed from the commit's own
  wake-up (its tail of recent records), concurrently with commits: every record exactly
  once, in order, byte-identical to the log; a stream the horizon holds back gets nothing
  past it until the horizon moves.
- Upstream frames are dispatched as their bytes arrive, however the bytes are cut; a frame
  failing its CRC ends the connection and is not dispatched.
- A standby reports one APPLIED per applied group (its last seq), not one per record.
- The leader answers committed batches from one queue in commit order: a report confirming
  several batches answers all of them in the callback that delivers it (no task or loop
  turn per batch) and none past its seq; a batch no report confirms gets 503 `not-in-sync`
  at its deadline, one past the lease 503 `not-leader`; a stop waits for every committed
  batch's answer. Under concurrent writers through a real leader and standby, every 200
  is held by the standby the moment the leader is SIGKILLed.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core.errors import ProtocolError
from gateway.batcher import Batcher
from ha.errors import NotInSyncError, NotLeaderError
from ha.leader import LeaderGate
from ha.standby import _ReportingClient
from replicator import frames, upstream, wire
from replicator.heartbeat import RelayedHeartbeat
from replicator.selection import Selector
from replicator.status import StatusBoard
from replicator.upstream import decode_applied, encode_applied
from store.ops import SET, Op, Result
from store.store import Store
from testkit.etcd import Etcd
from testkit.hacluster import Cluster, Writers, lost_writes
from testkit.procs import Procs
from testkit.replication import RootNode, root_node
from testkit.wait import wait_until_async


def _hello(db_id: bytes, options: int, last_seq: int = 0) -> bytes:
    return frames.encode_hello(
        frames.Hello(
            frames.PROTOCOL_VERSION,
            frames.MODE_STREAM,
            options,
            uuid.uuid4().bytes,
            db_id,
            last_seq,
            0,
            0,
            frames.ZERO_SHA,
        )
    )


def _db_id(root: RootNode) -> bytes:
    return uuid.UUID(root.store.db_id).bytes


def _write(store: Store, batches: int, prefix: str) -> None:
    for b in range(batches):
        store.apply(
            [Op(SET, f"{prefix}/{b:05d}/{i}".encode(), b"v" * 50, owner="t") for i in range(5)]
        )


async def _records_until(
    port: int,
    db_id: bytes,
    options: int,
    until: threading.Event,
    target: list[int],
    got: list[tuple[int, int, bytes]] | None = None,
) -> list[tuple[int, int, bytes]]:
    """Stream from seq 1 with `options` until `until` is set and the records reached
    `target[0]`; (first seq, last seq, hash head) of every record received, appended to
    `got` as they arrive."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=16 << 20)
    got = [] if got is None else got
    try:
        await wire.send(writer, _hello(db_id, options))
        ftype, _flags, _ = await upstream.read_welcome(reader)
        assert ftype == frames.WELCOME
        async with asyncio.timeout(60):
            while not (until.is_set() and got and got[-1][1] >= target[0]):
                ftype, body = await wire.read_frame(reader)
                if ftype == frames.RECORD:
                    rec = wire.parse_record(body)
                    got.append((rec.first_seq, rec.last_seq, rec.hash_head))
    finally:
        await wire.close(writer)
    return got


def _assert_is_the_log(store: Store, got: list[tuple[int, int, bytes]], upto: int) -> None:
    log = [(r.first_seq, r.last_seq, r.hash_head) for r in store.read_log(1, max_records=100_000)]
    assert got == [r for r in log if r[1] <= upto]


def test_a_caught_up_stream_gets_every_record_once_in_order_while_commits_go_on(
    tmp_path: Path,
) -> None:
    with root_node(str(tmp_path / "root")) as root:
        _write(root.store, 5, "before")
        done = threading.Event()
        target = [0]

        def writer() -> None:
            _write(root.store, 400, "during")  # commit listener: the tail, in this thread
            target[0] = root.store.last_seq()
            done.set()

        t = threading.Thread(target=writer)
        t.start()
        got = asyncio.run(_records_until(root.port, _db_id(root), frames.OPT_STANDBY, done, target))
        t.join()
        _assert_is_the_log(root.store, got, target[0])
        # The stream was served from the tail: it holds the last commit.
        assert root.source._tail.recs and root.source._tail.recs[-1].last_seq == target[0]


def test_a_stream_held_back_by_the_horizon_gets_nothing_past_it(tmp_path: Path) -> None:
    with root_node(str(tmp_path / "root")) as root:
        _write(root.store, 10, "a")
        horizon = [root.store.read_log(1, max_records=4)[-1].last_seq]
        consulted = [0]  # times the stream looked at the horizon

        def at_horizon() -> int:
            consulted[0] += 1
            return horizon[0]

        root.source.horizon = at_horizon
        first_part = horizon[0]
        moved = threading.Event()
        target = [root.store.last_seq()]
        got: list[tuple[int, int, bytes]] = []

        async def session() -> list[tuple[int, int, bytes]]:
            task = asyncio.ensure_future(
                _records_until(root.port, _db_id(root), 0, moved, target, got)
            )
            # Streams what the horizon allows, then waits.
            await wait_until_async(lambda: len(got) >= 4, 30, "the records up to the horizon")
            seen = consulted[0]
            _write(root.store, 3, "b")  # commits wake it: still held back
            # The stream looked at the horizon twice since: the second time after a read
            # that began once the commits were in, so it had them and held them back.
            await wait_until_async(lambda: consulted[0] >= seen + 2, 30, "the stream's next turns")
            assert len(got) == 4 and got[-1][1] == first_part, got  # nothing past it
            target[0] = root.store.last_seq()
            horizon[0] = target[0]
            moved.set()
            root._loop.call_soon_threadsafe(root.source.wake_held)
            return await task

        asyncio.run(session())
        assert got[3][1] == first_part  # the first four records came before the move
        _assert_is_the_log(root.store, got, target[0])


class _Inbox:
    def __init__(self) -> None:
        self.router = upstream.UpstreamRouter()
        self.got: list[bytes] = []
        self.router.register(upstream.READS, lambda _o, _k, p: self.got.append(p))


def test_upstream_frames_are_dispatched_however_their_bytes_are_cut(tmp_path: Path) -> None:
    inbox = _Inbox()
    with root_node(str(tmp_path / "root"), upstream=inbox.router) as root:
        payloads = [f"summary {i}".encode() * (i + 1) for i in range(6)]
        data = b"".join(frames.encode_upstream(upstream.READS, p) for p in payloads)

        async def send() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", root.port)
            try:
                await wire.send(writer, _hello(_db_id(root), frames.OPT_UPSTREAM))
                _, flags, _ = await upstream.read_welcome(reader)
                assert flags & frames.WELCOME_UPSTREAM
                cuts = [0, 1, 5, 9, 10, 11, 30, 31, len(data) - 1, len(data)]
                for a, b in itertools.pairwise(cuts):
                    await wire.send(writer, data[a:b])
                    # Deliberate: a pause so each piece reaches the source as a read of its
                    # own (the cut bytes are what is tested). Pieces that still arrive
                    # together only make the case easier; they cannot fail it.
                    await asyncio.sleep(0.02)
                # Connected until everything is dispatched (a close could cut it short).
                await wait_until_async(lambda: len(inbox.got) >= len(payloads), 10, "every frame")
            finally:
                await wire.close(writer)

        asyncio.run(send())
        assert inbox.got == payloads  # every frame, in order


def test_a_frame_failing_its_crc_ends_the_connection_undispatched(tmp_path: Path) -> None:
    inbox = _Inbox()
    with root_node(str(tmp_path / "root"), upstream=inbox.router) as root:
        good = frames.encode_upstream(upstream.READS, b"good")
        bad = bytearray(frames.encode_upstream(upstream.READS, b"bad!"))
        bad[-1] ^= 0xFF
        after = frames.encode_upstream(upstream.READS, b"after")

        async def send() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", root.port)
            try:
                await wire.send(writer, _hello(_db_id(root), frames.OPT_UPSTREAM))
                await upstream.read_welcome(reader)
                await wire.send(writer, good + bytes(bad) + after)
                async with asyncio.timeout(10):
                    with pytest.raises(ProtocolError, match="closed"):
                        while True:
                            await wire.read_frame(reader)
            finally:
                await wire.close(writer)

        asyncio.run(send())
        assert inbox.got == [b"good"]


def test_a_standby_reports_one_applied_frame_per_applied_group(tmp_path: Path) -> None:
    # The standby is a copy of the leader's store (same db id), as a bootstrap makes one.
    Store.create(str(tmp_path / "leader"), sync=False).close()
    shutil.copytree(tmp_path / "leader", tmp_path / "standby")
    leader = Store.open(str(tmp_path / "leader"), sync=False)
    standby = Store.open(str(tmp_path / "standby"), sync=False)
    try:
        _write(leader, 3, "g")
        recs = leader.read_log(leader.last_seq() - 14, max_records=10)
        assert len(recs) == 3
        outbox = upstream.UpstreamOutbox()
        client = _ReportingClient(
            standby,
            Selector([("127.0.0.1", 1)]),
            node_id=uuid.uuid4().bytes,
            board=StatusBoard(str(tmp_path / "standby")),
            relay=RelayedHeartbeat(),
            outbox=outbox,
        )
        standby.apply_log_records(recs)  # one group, one transaction, as the apply thread
        for rec in recs:  # then each record is reported, as the apply thread does
            client._applied(rec)
        assert outbox.pending() == 1
        frame = outbox._q[0]
        kind, payload = frames.decode_upstream(frame[frames.HEADER_SIZE :])
        assert kind == upstream.APPLIED and decode_applied(payload) == recs[-1].last_seq
    finally:
        leader.close()
        standby.close()


# --- the leader's answers: one queue in commit order ------------------------------------

STANDBY = upstream.Origin(b"s" * 16, "127.0.0.1:1")


def _gate(timeout_s: float = 60.0, lease_s: float = 3600.0) -> LeaderGate:
    gate = LeaderGate(1, timeout_s)
    gate.clock.deadline = time.monotonic() + lease_s
    return gate


def _report(gate: LeaderGate, seq: int) -> None:
    """What the replication link's transport callback does with a standby's APPLIED."""
    gate.applied(STANDBY, upstream.APPLIED, encode_applied(seq))


async def _committed(b: Batcher, n: int) -> None:
    """Wait until `n` batches are committed and waiting for the gate."""
    await wait_until_async(lambda: len(b._unacked) >= n, 30, f"{n} batches committed")


def _gated(store: Store, gate: LeaderGate) -> Batcher:
    # One request per batch: each submit past the first seals a batch of its own.
    b = Batcher(store, window_s=0.0, max_ops=1, max_bytes=1 << 20, max_queued=64)
    b.set_ack_gate(gate)
    b.start()
    return b


def _put(b: Batcher, i: int) -> asyncio.Future[list[Result]]:
    return b.submit([Op(SET, f"k/{i}".encode(), b"v", "p")], 2, "p")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 26)
    yield s
    s.close()


def test_one_report_answers_every_batch_it_confirms_at_once_in_commit_order(
    store: Store,
) -> None:
    async def run() -> None:
        gate = _gate()
        b = _gated(store, gate)
        futs = [_put(b, i) for i in range(6)]
        await _committed(b, 6)
        seqs = [u.seq for u in b._unacked]
        assert seqs == sorted(seqs) and len(set(seqs)) == 6
        assert not any(f.done() for f in futs)  # committed, not confirmed: no answer
        order: list[int] = []

        def answered(i: int) -> Callable[[asyncio.Future[list[Result]]], None]:
            return lambda _f: order.append(i)

        for i, f in enumerate(futs):
            f.add_done_callback(answered(i))
        _report(gate, seqs[3])
        # Answered inside the report's own callback, no loop turn in between, and only
        # the batches up to the reported seq.
        assert [f.done() for f in futs] == [True] * 4 + [False] * 2
        _report(gate, seqs[-1])
        assert all(f.done() for f in futs)
        await asyncio.sleep(0)  # one loop turn: the futures' done callbacks run
        assert order == list(range(6))  # commit order
        assert [(await f)[0].seq for f in futs] == seqs
        await b.close()

    asyncio.run(run())


def test_an_unconfirmed_batch_gets_not_in_sync_and_later_ones_still_go_through(
    store: Store,
) -> None:
    async def run() -> None:
        gate = _gate(timeout_s=0.3)
        b = _gated(store, gate)
        futs = [_put(b, i) for i in range(3)]
        async with asyncio.timeout(30):
            for f in futs:  # each at its own deadline, no report ever
                with pytest.raises(NotInSyncError, match="not confirmed by 1 standby"):
                    await f
        assert gate.not_in_sync == 3
        later = _put(b, 3)
        await _committed(b, 1)
        _report(gate, store.last_seq())
        assert later.done() and later.result()[0].seq == store.last_seq()
        await b.close()

    asyncio.run(run())


def test_a_confirmed_batch_past_the_lease_gets_not_leader(store: Store) -> None:
    async def run() -> None:
        gate = _gate()
        b = _gated(store, gate)
        fut = _put(b, 0)
        await _committed(b, 1)
        gate.clock.deadline = time.monotonic() - 1.0  # the lease was not renewed in time
        _report(gate, store.last_seq())
        with pytest.raises(NotLeaderError, match="not acknowledged"):
            await fut
        await b.close()

    asyncio.run(run())


def test_close_waits_until_every_committed_batch_is_answered(store: Store) -> None:
    async def run() -> None:
        gate = _gate()
        b = _gated(store, gate)
        futs = [_put(b, i) for i in range(3)]
        await _committed(b, 3)
        closing = asyncio.ensure_future(b.close())
        # Nothing is left to commit, so the whole of a close that did not wait would run on
        # this loop (no worker thread, no timer): a few turns, far fewer than these.
        for _ in range(50):
            await asyncio.sleep(0)
        assert not closing.done()  # it would have left writers waiting forever
        _report(gate, store.last_seq())
        async with asyncio.timeout(30):
            await closing
        assert all(f.done() and not f.exception() for f in futs)

    asyncio.run(run())


def test_every_acknowledged_write_is_on_the_standby_when_the_leader_dies(
    etcd: Etcd, procs: Procs, tmp_path: Path
) -> None:
    cluster = Cluster(procs, tmp_path, etcd.url, n=2, ttl_s=5)
    cluster.start()
    leader = cluster.wait_leader()
    standby = next(n for n in cluster.nodes if n is not leader)
    # Pinned to the leader: many batches in flight, several confirmed by one report.
    with Writers(cluster, 16, pins=[leader]) as writers:
        writers.wait_acks(400)
        cluster.kill(leader)  # mid-stream: answers were going out as reports came in
    acked = list(writers.acked)
    assert len(acked) >= 400, writers.errors
    cluster.stop(standby)
    assert lost_writes(standby.data_dir, acked) == []
