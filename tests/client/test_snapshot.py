"""`Client.snapshot`, `Client.follow` and `mercury kv export` against a real root and
replica: a snapshot taken while a producer writes is the prefix exactly at its seq; a
consumer that follows a prefix from a seq the replica no longer retains gets a new
snapshot instead of `Gone` and then every change; export prints one seq's picture."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mercury_client import AsyncClient, Change, Client, Gone, Snapshot
from testkit.procs import REPO, Procs, mercury_cmd
from testkit.wait import wait_until
from tests.client.conftest import Cluster
from tests.gateway.conftest import make_root
from tests.replicator.nodes import start_replica

#: writes the background producer makes at most (a bound, with the time bound below)
WRITES = 600
WRITE_SECONDS = 60.0


def state_at(
    initial: dict[bytes, bytes], log: list[tuple[int, bytes, bytes | None]], seq: int
) -> dict[bytes, bytes]:
    """The prefix after every acknowledged write with a seq up to `seq`."""
    state = dict(initial)
    for s, k, v in sorted(log, key=lambda x: x[0]):
        if s > seq:
            break
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    return state


class Producer:
    """Puts and deletes keys of `prefix` in a thread, logging (seq, key, value or None) of
    every acknowledged write; bounded in count and time."""

    def __init__(self, cluster: Cluster, token: str, prefix: str) -> None:
        self.cluster, self.token, self.prefix = cluster, token, prefix
        self.log: list[tuple[int, bytes, bytes | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with Client(self.cluster.root.url, self.token) as w:
            deadline = time.monotonic() + WRITE_SECONDS
            for i in range(WRITES):
                if self.stop.is_set() or time.monotonic() > deadline:
                    return
                k = f"{self.prefix}{(i * 7) % 300:03d}".encode()
                if i % 3 == 2:
                    self.log.append((w.delete(k).seq, k, None))
                else:
                    v = b"v%d" % (i + 1)
                    self.log.append((w.put(k, v).seq, k, v))

    def __enter__(self) -> Producer:
        self.thread.start()
        wait_until(
            lambda: len(self.log) >= 10 or not self.thread.is_alive(),
            WRITE_SECONDS,
            "the producer under way",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(WRITE_SECONDS)
        # "written"/"deleted" answers carry their seq; an absent delete carries none
        self.log[:] = [x for x in self.log if x[0] > 0]


def _initial(c: Client, p: str) -> dict[bytes, bytes]:
    initial = {f"{p}{i:03d}".encode(): b"v0" for i in range(0, 300, 2)}
    c.wait_applied(c.batch([("set", k, v) for k, v in initial.items()]).seq)
    return initial


def test_snapshot_during_writes_is_the_prefix_at_its_seq(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    p = f"{name}/"
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        initial = _initial(c, p)
        snaps: list[tuple[int, dict[bytes, bytes]]] = []
        with Producer(cluster, token, p) as prod:
            while len({s for s, _ in snaps}) < 5 and prod.thread.is_alive():
                snap = c.snapshot(p, page_size=5)  # 30 pages, each a little later
                snaps.append((snap.seq, {i.key: i.value or b"" for i in snap.items}))
    # taken while the producer wrote: the writes moved the seq between snapshots
    assert len({s for s, _ in snaps}) > 1, "no two snapshots during the writes"
    for seq, got in snaps:
        assert got == state_at(initial, prod.log, seq), f"snapshot at seq {seq}"


def test_async_snapshot_during_writes_too(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    p = f"{name}/"
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        initial = _initial(c, p)

    async def take(prod: Producer) -> list[tuple[int, dict[bytes, bytes]]]:
        out: list[tuple[int, dict[bytes, bytes]]] = []
        async with AsyncClient(cluster.root.url, token, read_url=cluster.read_url) as ac:
            while len({s for s, _ in out}) < 5 and prod.thread.is_alive():
                snap = await ac.snapshot(p, page_size=5)
                out.append((snap.seq, {i.key: i.value or b"" for i in snap.items}))
        return out

    with Producer(cluster, token, p) as prod:
        snaps = asyncio.run(take(prod))
    assert len({s for s, _ in snaps}) > 1, "no two snapshots during the writes"
    for seq, got in snaps:
        assert got == state_at(initial, prod.log, seq), f"snapshot at seq {seq}"


@pytest.fixture
def gc_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A root and a replica that keep only a few log entries (collected every 0.2 s)."""
    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "logs")
    gc = ["--log-keep-entries", "5", "--log-min-entries", "5", "--log-gc-interval-s", "0.2"]
    try:
        root = make_root(procs, tmp_path / "root", *gc)
        repl = root.args[root.args.index("--repl-listen") + 1]
        replica = start_replica(
            procs, tmp_path / "replica", [int(repl.rsplit(":", 1)[1])], *gc, repl=False
        )
        yield Cluster(root, replica)
        root.close_clients()
    finally:
        procs.stop_all()


def _gone(c: Cluster, prefix: str, seq: int) -> None:
    """Wait until the replica answers a watch from `seq` with 410."""
    url = f"{c.read_url}/v1/watch?prefix={prefix}&from_seq={seq}"
    wait_until(
        lambda: httpx.get(url, timeout=10).status_code == 410,
        30,
        "the replica's log collected",
        interval=0.2,
    )


def test_follow_recovers_from_gone_with_a_snapshot(gc_cluster: Cluster) -> None:
    c = gc_cluster
    _name, token = c.root.producer(["f/"])
    with Client(c.root.url, token, read_url=c.read_url) as w:
        for i in range(30):
            last = w.put(f"f/{i % 10}", b"old%d" % i).seq
        w.wait_applied(last)
        _gone(c, "f/", 1)
        with pytest.raises(Gone):
            next(w.watch("f/", from_seq=1))
        events = w.follow("f/", from_seq=1)
        first = next(events)
        assert isinstance(first, Snapshot) and first.seq >= last
        mirror = {i.key: i.value for i in first.items}
        assert mirror == {f"f/{i}".encode(): b"old%d" % (20 + i) for i in range(10)}
        # and then every change after the snapshot, in order
        w.put("f/new", b"1")
        w.delete("f/0")
        got = list(itertools.islice(events, 2))
        assert [(x.op, x.key) for x in got if isinstance(x, Change)] == [
            ("set", b"f/new"),
            ("delete", b"f/0"),
        ]
        events.close()


def test_follow_from_nothing_starts_with_a_snapshot(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    p = f"{name}/"
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        c.wait_applied(c.put(p + "a", "1").seq)
        events = c.follow(p)
        snap = next(events)
        assert isinstance(snap, Snapshot)
        assert [(i.key, i.value) for i in snap.items] == [((p + "a").encode(), b"1")]
        c.put(p + "b", "2")
        change = next(events)
        assert isinstance(change, Change) and change.key == (p + "b").encode()
        assert change.seq > snap.seq
        events.close()


def test_watch_without_from_seq_starts_now(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    p = f"{name}/"
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        c.wait_applied(c.put(p + "before", "1").seq)
        changes = c.watch(p)
        stop = threading.Event()

        def write_after() -> None:
            # the stream opens inside next(): keep writing until it has seen one (the
            # 0.5 s between writes is a pace, not a synchronisation: the stop ends it)
            with Client(cluster.root.url, token) as w:
                for i in range(120):
                    if stop.wait(0.5):
                        return
                    w.put(f"{p}after{i}", "2")

        t = threading.Thread(target=write_after)
        t.start()
        try:
            first = next(changes)
        finally:
            stop.set()
            t.join(30)
        assert first.key.startswith((p + "after").encode())
        changes.close()


def test_cli_export_prints_its_seq(cluster: Cluster, tmp_path: Path) -> None:
    name, token = cluster.root.producer()
    tf = tmp_path / "token"
    tf.write_text(token)
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        seq = c.batch([("set", f"{name}/{i}", str(i)) for i in range(5)]).seq
        c.wait_applied(seq)
    argv = ["kv", "export", f"{name}/", "--url", cluster.root.url]
    argv += ["--read-url", cluster.read_url, "--token-file", str(tf)]
    r = subprocess.run(
        mercury_cmd(*argv),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 5
    said = r.stderr.strip().splitlines()[-1]
    assert said.startswith("exported 5 keys at seq ")
    assert int(said.rsplit(" ", 1)[1]) >= seq
