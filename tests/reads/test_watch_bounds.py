"""Watch streams under hostile clients: streams have a budget of their own and never take
the connection slots requests need; a full budget ends the stream stuck longest; a catch-up
from seq 1 by clients that never read holds at most a step each, and the memory comes back
once they are gone; a cut-off names the first change it did not send even when that change
never fit the queue. Real `mercury` processes, caps set low by flag so each test takes
seconds."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit import metrics, procstat
from testkit.procs import Procs
from testkit.wait import wait_until, wait_until_async
from tests.client.conftest import Cluster
from tests.gateway.conftest import make_root
from tests.replicator.nodes import start_replica

MB = 1 << 20


def _open_watch(
    url: str, query: str, token: str | None = None, rcvbuf: int = 4096
) -> socket.socket:
    """A raw watch request on a socket with a small receive buffer, which then reads only
    what the test asks of it."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    s.sendall(f"GET /v1/watch?{query} HTTP/1.1\r\nHost: t\r\n{auth}\r\n".encode())
    return s


def _head(s: socket.socket) -> bytes:
    """The response head of a raw watch (and whatever body came with it)."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        assert chunk, f"closed before its head: {got!r}"
        got += chunk
    return got


def _readable(s: socket.socket) -> int:
    """Bytes waiting in `s`'s receive buffer (left there)."""
    try:
        return len(s.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return 0


def _metric(url: str, name: str, **labels: str) -> float:
    return metrics.value(httpx.get(url + "/metrics", timeout=10).text, name, **labels)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    (tmp_path / "logs").mkdir()
    p = Procs(tmp_path / "logs")
    try:
        yield p
    finally:
        p.stop_all()


def test_streams_never_take_the_connection_slots_and_a_full_budget_ends_one(
    tmp_path: Path, procs: Procs
) -> None:
    """Six watch streams that never read, on listeners capped at four connections: reads,
    writes and /metrics are still served on both nodes (a stream left the connection
    budget when it became one), and a seventh watch on the full stream budget ends one of
    the six (counted), not refused."""
    caps = ("--http-max-connections", "4", "--watch-max-streams", "6")
    root = make_root(procs, tmp_path / "root", *caps)
    repl = root.args[root.args.index("--repl-listen") + 1]
    replica = start_replica(
        procs, tmp_path / "replica", [int(repl.rsplit(":", 1)[1])], *caps, repl=False
    )
    c = Cluster(root, replica)
    _name, token = root.producer(["q/"])
    streams: list[socket.socket] = []
    try:
        for url, tok in ((c.read_url, None), (root.url, token)):
            for _ in range(6):
                s = _open_watch(url, "prefix=q/", tok)
                assert _head(s).startswith(b"HTTP/1.1 200"), url
                streams.append(s)
        # Everything else is still served, one request per connection (no keep-alive
        # connection to hide behind).
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as w:
            r = w.put(root.url + "/v1/kv/q/k", content=b"v")
            assert r.status_code == 200, r.text
            seq = int(r.json()["seq"])
        c.caught_up()
        for url in (root.url, c.read_url):
            assert httpx.get(url + "/metrics", timeout=10).status_code == 200
            assert httpx.get(url + "/v1/status", timeout=10).status_code == 200
        r = httpx.get(c.read_url + "/v1/kv/q/k", timeout=10)
        assert r.status_code == 200 and r.content == b"v"
        assert _metric(c.read_url, "mercury_budget_members", budget="watch") == 6
        # A seventh on the replica: one of the six goes for it.
        seventh = _open_watch(c.read_url, f"prefix=q/&from_seq={seq}")
        streams.append(seventh)
        assert _head(seventh).startswith(b"HTTP/1.1 200")
        assert _metric(c.read_url, "mercury_watch_ended_total", reason="evicted") == 1
        assert _metric(c.read_url, "mercury_budget_members", budget="watch") == 6
    finally:
        for s in streams:
            s.close()
        root.close_clients()


def test_a_full_budget_ends_the_stream_whose_client_took_nothing_longest(tmp_path: Path) -> None:
    """The hub over a real store in this process, two streams at a cap of two: the one
    that took its last line longest ago is ended for a newcomer (not the oldest, not the
    newest), with a last line naming the first change it was not sent."""
    from reads.watch import Watcher, WatchHub
    from store.store import Store

    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 28)

    async def run() -> None:
        hub = WatchHub(store, max_watchers=2)
        try:
            gens = []
            ws = []
            for _ in range(2):
                w = Watcher(b"k/")
                assert hub.join(w, hub.admit(None))
                g = hub.stream(b"k/", w.resume, w)
                assert b"heartbeat" in await anext(g)  # live: joined the hub
                gens.append(g)
                ws.append(w)
            first, second = gens
            seq = await asyncio.to_thread(_put, store, "k/1")
            await wait_until_async(lambda: hub.next_seq > seq, 10, "k/1 handed out")
            assert b'"k/1"' in await anext(first)  # the older stream takes it ...
            # ... the newer takes nothing: it has held its slot longest without progress
            newcomer = Watcher(b"k/")
            assert hub.join(newcomer, hub.admit(None))
            assert newcomer in hub.streams and ws[1] not in hub.streams and ws[0] in hub.streams
            last = json.loads(await anext(second))
            assert "make room" in last["error"] and last["resume_from_seq"] == seq
            with pytest.raises(StopAsyncIteration):
                await anext(second)
            await first.aclose()
        finally:
            await hub.stop()

    try:
        asyncio.run(run())
    finally:
        store.close()


def test_a_full_budget_ends_an_unauthenticated_stream_before_an_authenticated_one(
    tmp_path: Path,
) -> None:
    """At the cap, a stream held for a verified token outlasts an anonymous one, even one
    whose client took bytes more recently; and no principal holds more than its share
    once the budget is full (its newcomer ends one of its own)."""
    from net.budget import peer_principal, token_principal
    from reads.watch import Watcher, WatchHub
    from store.store import Store

    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 28)

    async def run() -> None:
        hub = WatchHub(store, max_watchers=4, principal_share=0.5)
        try:
            token = token_principal("t0ken")
            anon = peer_principal(("10.0.0.1", 1))
            authed = [Watcher(b"k/") for _ in range(2)]
            for w in authed:
                assert hub.join(w, hub.admit(None), token)
            fresh = [Watcher(b"k/") for _ in range(2)]
            for w in fresh:  # admitted later: their clients took bytes more recently
                assert hub.join(w, hub.admit(None), anon)
            # a newcomer of a third principal: an anonymous stream goes, the stalest of them
            assert hub.join(Watcher(b"k/"), hub.admit(None), peer_principal(("10.0.0.2", 1)))
            assert fresh[0] not in hub.streams and fresh[1] in hub.streams
            assert all(w in hub.streams for w in authed)
            # the token at its share (2 of 4): its newcomer ends one of its own
            again = Watcher(b"k/")
            assert hub.join(again, hub.admit(None), token)
            assert again in hub.streams and authed[0] not in hub.streams
            assert hub.streams.holds(token) == 2
        finally:
            await hub.stop()

    try:
        asyncio.run(run())
    finally:
        store.close()


def test_catch_up_from_seq_1_by_clients_that_never_read_is_bounded(
    tmp_path: Path, procs: Procs
) -> None:
    """32 streams from seq 1 over 24 MiB under one prefix (64 KiB values, 4 MiB records),
    whose clients never read: the replica's serving process holds a step or two of lines
    for each (and the records they share), not the history (before, a 4 MiB slice each at
    least: 128 MiB and more); and once they are gone the memory comes back."""
    root = make_root(procs, tmp_path / "root")
    repl = root.args[root.args.index("--repl-listen") + 1]
    replica = start_replica(procs, tmp_path / "replica", [int(repl.rsplit(":", 1)[1])], repl=False)
    c = Cluster(root, replica)
    _name, token = root.producer(["big/"])
    value = "v" * (64 << 10)
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=120) as w:
        for b in range(6):  # 4 MiB records
            ops = [{"op": "set", "key": f"big/{b}-{i}", "value": value} for i in range(64)]
            r = w.post(root.url + "/v1/batch", json={"ops": ops})
            assert r.status_code == 200, r.text
    c.caught_up()
    pid = replica.proc.pid
    before = procstat.anon_rss_bytes(pid)
    n = 32
    streams = [_open_watch(c.read_url, "prefix=big/&from_seq=1") for _ in range(n)]
    peak = before
    try:
        for s in streams:
            assert _head(s).startswith(b"HTTP/1.1 200")

        def all_stuck() -> bool:
            nonlocal peak
            peak = max(peak, procstat.anon_rss_bytes(pid))
            if _metric(c.read_url, "mercury_watch_catchup_streams") != n:
                return False
            # each client's receive buffer holds history: its stream is stuck sending
            return all(_readable(s) >= 2048 for s in streams)

        wait_until(all_stuck, 60, "every stream catching up, its client taking nothing")
        # What the process holds for them now it holds for as long as they stay.
        for _ in range(20):
            peak = max(peak, procstat.anon_rss_bytes(pid))
            _metric(c.read_url, "mercury_watch_catchup_streams")
        cache = _metric(c.read_url, "mercury_watch_record_cache_bytes")
        assert cache <= 64 * MB + 4 * MB + 64 * 1024, cache
        growth = (peak - before) / MB
        assert growth < 100, f"{growth:.0f} MB more for {n} stuck catch-ups"
    finally:
        for s in streams:
            s.close()
    wait_until(
        lambda: _metric(c.read_url, "mercury_watch_catchup_streams") == 0, 30, "catch-ups gone"
    )
    wait_until(
        lambda: _metric(c.read_url, "mercury_watch_record_cache_bytes") == 0, 30, "records freed"
    )
    # The memory comes back (the streams' garbage collected, the heaps trimmed).
    wait_until(
        lambda: procstat.anon_rss_bytes(pid) - before < 48 * MB,
        30,
        "memory handed back after the streams closed",
    )
    root.close_clients()


def test_a_cut_off_whose_first_change_never_fit_names_that_change(tmp_path: Path) -> None:
    """A change bigger than the queue's bound still goes into an empty queue (a client
    that takes it gets it); when the next overflows, the cut-off line names the first
    change not taken, never 0 (a resume from 0 would replay the whole log)."""
    from reads.watch import WatchHub
    from store.store import Store

    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 28)

    async def run() -> None:
        hub = WatchHub(store, queue_bytes=100, queue_chunks=100)
        try:
            gen = hub.stream(b"k/", hub.admit(None))
            assert b"heartbeat" in await anext(gen)
            seqs = []
            for i in range(2):  # each line ~ 230 bytes: over the 100-byte bound
                seqs.append(await asyncio.to_thread(_put, store, f"k/{i}", 200))
                await wait_until_async(lambda: hub.next_seq > seqs[-1], 10, f"k/{i} handed out")
            assert hub.cut_off == 1
            lines = [json.loads(x) async for chunk in gen for x in chunk.splitlines()]
            assert [d["seq"] for d in lines if "op" in d] == []  # the queue was dropped
            assert lines[-1]["resume_from_seq"] == seqs[0], lines[-1]
        finally:
            await hub.stop()

    try:
        asyncio.run(run())
    finally:
        store.close()


def _put(store: Any, key: str, size: int = 10) -> int:
    from store.ops import SET, Op

    return int(store.apply([Op(SET, key.encode(), b"v" * size, "t")]).last_seq)
