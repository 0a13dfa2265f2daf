"""`GET /v1/watch` against real `mercury root` and `mercury replica` processes: changes in
order with their seqs, prefix filtering, resuming from a seq (inclusive), 410 after log GC,
a stalled watcher cut off without hurting another, SIGTERM with open streams, and the SDK's
`Client.watch` and `mercury kv watch` against a real replica."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import itertools
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from mercury_client import Change, Client
from testkit import metrics
from testkit.procs import REPO, Procs, mercury_cmd
from testkit.wait import wait_until, wait_until_async
from tests.client.conftest import Cluster, make_cluster

Doc = dict[str, Any]


class Stream:
    """One watch stream read line by line (http.client decodes the chunked body)."""

    def __init__(
        self, base: str, prefix: str, from_seq: int | None = None, token: str | None = None
    ) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        q = f"prefix={quote(prefix)}"
        if from_seq is not None:
            q += f"&from_seq={from_seq}"
        auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self.conn.request("GET", f"/v1/watch?{q}", headers=auth)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.lines: list[Doc] = []
        self._thread: threading.Thread | None = None
        self.from_seq = from_seq

    def read_until(self, done: Callable[[list[Doc]], bool], timeout: float = 30) -> list[Doc]:
        deadline = time.monotonic() + timeout
        while not done(self.lines):
            if time.monotonic() > deadline:
                raise TimeoutError(f"watch lines so far: {_brief(self.lines)}")
            if self._thread is not None:
                if not self._thread.is_alive():
                    raise EOFError(f"stream ended after {_brief(self.lines)}")
                time.sleep(0.02)
                continue
            line = self.resp.readline()
            if not line:
                raise EOFError(f"stream ended after {_brief(self.lines)}")
            self.lines.append(json.loads(line))
        return self.lines

    def follow(self) -> Stream:
        """Read the stream in a background thread from now on (a consumer keeping up)."""

        def run() -> None:
            with contextlib.suppress(Exception):  # ends when the test closes the stream
                while line := self.resp.readline():
                    self.lines.append(json.loads(line))

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def changes(self) -> list[Doc]:
        return [d for d in self.lines if "op" in d]

    def live(self) -> Stream:
        """Wait for the first heartbeat: the stream is caught up and follows the hub."""
        self.read_until(lambda ls: any(d.get("heartbeat") for d in ls))
        return self

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.resp.close()
        self.conn.close()
        if self._thread is not None:
            self._thread.join(10)


def _brief(lines: list[Doc]) -> list[Doc]:
    """The last lines without their values (assertion messages stay short)."""
    return [{k: v for k, v in d.items() if not k.startswith("value")} for d in lines[-5:]]


def n_changes(n: int) -> Callable[[list[Doc]], bool]:
    return lambda ls: sum(1 for d in ls if "op" in d) >= n


def _live_raw(s: socket.socket) -> None:
    """Read a raw watch response up to its first heartbeat (the stream follows the hub)."""
    got = b""
    while not (b'"heartbeat"' in got and got.endswith(b"\r\n")):
        chunk = s.recv(4096)
        assert chunk, f"closed before the first heartbeat: {got!r}"
        got += chunk


def _ended_slow(c: Cluster) -> float:
    """Watch streams the read node cut off for falling behind."""
    text = httpx.get(c.read_url + "/metrics", timeout=10).text
    return metrics.value(text, "mercury_watch_ended_total", reason="slow")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("watch")
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    try:
        c = make_cluster(procs, tmp)
        yield c
        c.root.close_clients()
    finally:
        procs.stop_all()


@pytest.fixture(scope="module")
def writer_token(cluster: Cluster) -> str:
    _name, token = cluster.root.producer(["w/"])
    return token


@pytest.fixture(scope="module")
def writer(cluster: Cluster, writer_token: str) -> Iterator[Client]:
    with Client(cluster.root.url, writer_token, read_url=cluster.read_url) as c:
        yield c


def _batch(root_url: str, token: str, ops: list[Doc]) -> Doc:
    r = httpx.post(
        root_url + "/v1/batch",
        json={"ops": ops},
        params={"results": "true"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    doc: Doc = r.json()
    return doc


def test_changes_arrive_in_order_with_seqs_and_only_under_the_prefix(
    cluster: Cluster, writer: Client, writer_token: str
) -> None:
    on_replica = Stream(cluster.read_url, "w/a/").live()
    on_root = Stream(cluster.root.url, "w/a/", token=writer_token).live()
    other = Stream(cluster.read_url, "w/b/").live()
    try:
        s1 = writer.put("w/a/1", b"one").seq
        writer.put("w/b/x", b"elsewhere")
        s2 = writer.put(b"w/a/\xff", b"\xfe\x00").seq
        s3 = writer.delete("w/a/1").seq
        want = [
            {"seq": s1, "op": "set", "key": "w/a/1", "value": "one"},
            {
                "seq": s2,
                "op": "set",
                "key_b64": base64.b64encode(b"w/a/\xff").decode(),
                "value_b64": base64.b64encode(b"\xfe\x00").decode(),
            },
            {"seq": s3, "op": "delete", "key": "w/a/1"},
        ]
        for s in (on_replica, on_root):
            s.read_until(n_changes(3))
            assert s.changes() == want
            assert s.status == 200
        other.read_until(n_changes(1))
        assert [d["key"] for d in other.changes()] == ["w/b/x"]
        # heartbeats carry the applied seq: nothing up to it is missing
        hb = [d for d in on_replica.lines if d.get("heartbeat")]
        assert all(isinstance(d["seq"], int) for d in hb)
    finally:
        for s in (on_replica, on_root, other):
            s.close()


def test_resume_from_a_seq_is_inclusive_then_live(cluster: Cluster, writer: Client) -> None:
    seqs = [writer.put(f"w/r/{i}", str(i).encode()).seq for i in range(5)]
    cluster.caught_up()
    s = Stream(cluster.read_url, "w/r/", from_seq=seqs[2])
    try:
        s.read_until(n_changes(3))
        s.live()
        s4 = writer.put("w/r/5", b"5").seq
        s.read_until(n_changes(4))
        assert [d["seq"] for d in s.changes()] == [*seqs[2:], s4]
        assert [d["key"] for d in s.changes()] == ["w/r/2", "w/r/3", "w/r/4", "w/r/5"]
        # the first heartbeat comes after the history: it covers it
        first_hb = next(d for d in s.lines if d.get("heartbeat"))
        assert first_hb["seq"] >= seqs[-1]
    finally:
        s.close()


def test_many_changes_in_one_batch_keep_their_order(cluster: Cluster, writer: Client) -> None:
    _name, token = cluster.root.producer(["m/"])
    s = Stream(cluster.read_url, "m/").live()
    try:
        doc = _batch(
            cluster.root.url,
            token,
            [{"op": "set", "key": f"m/{i:04d}", "value": str(i)} for i in range(1500)],
        )
        s.read_until(n_changes(1500))
        got = s.changes()
        assert [d["key"] for d in got] == [f"m/{i:04d}" for i in range(1500)]
        seqs = [d["seq"] for d in got]
        assert seqs == sorted(seqs) and len(set(seqs)) == 1500
        assert seqs[-1] == doc["seq"]
    finally:
        s.close()


def test_watchers_joining_during_writes_miss_and_repeat_nothing(
    cluster: Cluster, writer: Client
) -> None:
    """Streams opened at different moments while a producer writes, each from an earlier
    seq: the history they read themselves and the hub's live changes meet exactly (no
    gap, no repeat at the join)."""
    _name, token = cluster.root.producer(["j/"])
    first = _batch(cluster.root.url, token, [{"op": "set", "key": "j/start", "value": "0"}])
    seqs: list[int] = [first["seq"]]
    stop = threading.Event()

    def produce() -> None:
        with Client(cluster.root.url, token) as w:
            for i in range(80):
                if stop.is_set():
                    return
                seqs.append(w.put(f"j/{i:04d}", b"v").seq)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    streams: list[Stream] = []

    def written(n: int) -> Callable[[], bool]:
        return lambda: len(seqs) > n or not t.is_alive()

    try:
        for n in range(10, 60, 10):
            # each stream opens after ten more writes (or once the producer is done)
            wait_until(written(n), 120, f"{n} writes")
            streams.append(Stream(cluster.read_url, "j/", from_seq=seqs[len(seqs) // 2]).follow())
        t.join(120)
        assert not t.is_alive()
        # A last change after everything: a stream delivers in seq order, so once it has
        # this one, anything repeated at its join would have come before it.
        end = _batch(cluster.root.url, token, [{"op": "set", "key": "j/zz-end", "value": "1"}])
        for s in streams:
            start = s.from_seq
            assert start is not None
            want = [q for q in seqs if q >= start] + [end["seq"]]
            s.read_until(lambda ls: any(d.get("key") == "j/zz-end" for d in ls), 60)
            assert [d["seq"] for d in s.changes()] == want
    finally:
        stop.set()
        for s in streams:
            s.close()


def test_bad_parameters_are_400(cluster: Cluster) -> None:
    r = httpx.get(cluster.read_url + "/v1/watch?prefix=w/&from_seq=abc", timeout=10)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/problem")
    r = httpx.get(cluster.read_url + "/v1/watch?prefix=w/&from_seq=-1", timeout=10)
    assert r.status_code == 400
    # a seq no 64-bit log can reach: refused, not a stream that waits for ever
    r = httpx.get(cluster.read_url + f"/v1/watch?prefix=w/&from_seq={1 << 64}", timeout=10)
    assert r.status_code == 400 and "64-bit" in r.json()["detail"], r.text


def test_a_from_seq_ahead_of_the_node_gets_heartbeats_while_it_waits(cluster: Cluster) -> None:
    """The stream waits for the node to reach `from_seq`; it said nothing meanwhile, and a
    client treats a silent stream as a dead link (reconnecting in a loop). Its heartbeats
    carry from_seq - 1: a resume asks for the same seq again."""
    ahead = int(httpx.get(cluster.read_url + "/v1/status", timeout=10).json()["seq"]) + 10**9
    s = Stream(cluster.read_url, "w/", from_seq=ahead)
    try:
        assert s.status == 200
        lines = s.read_until(lambda ls: len(ls) >= 1, timeout=20)  # a 5 s heartbeat
        assert lines[:1] == [{"heartbeat": True, "seq": ahead - 1}], lines
    finally:
        s.close()


def test_a_stalled_watcher_is_cut_off_without_hurting_another(
    cluster: Cluster, writer: Client
) -> None:
    host, port = cluster.read_url.removeprefix("http://").split(":")
    stalled = socket.create_connection((host, int(port)), timeout=30)
    # a small receive buffer so the server's side fills soon; this peer then reads nothing
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    stalled.sendall(b"GET /v1/watch?prefix=w/big/ HTTP/1.1\r\nHost: x\r\n\r\n")
    # a second one that does not even read its last line: its stream is cancelled 10 s
    # after the cut-off and the connection closed (it never holds the node for ever)
    dead = socket.create_connection((host, int(port)), timeout=30)
    dead.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    dead.sendall(b"GET /v1/watch?prefix=w/big/ HTTP/1.1\r\nHost: x\r\n\r\n")
    healthy = Stream(cluster.read_url, "w/big/").live().follow()
    value = b"v" * (1 << 20)
    n = 40  # 40 MiB: far beyond a watcher's 4 MiB queue plus the socket buffers
    try:
        # Write only once both raw streams follow the hub (their first heartbeat).
        _live_raw(stalled)
        _live_raw(dead)
        for i in range(n):
            writer.put(f"w/big/{i}", value)
        healthy.read_until(n_changes(n), timeout=120)
        assert [d["key"] for d in healthy.changes()] == [f"w/big/{i}" for i in range(n)]
        assert not any("error" in d for d in healthy.lines)
        # now read the stalled stream: it ends with the cut-off line, short of n changes
        stalled.settimeout(30)
        buf = b""
        deadline = time.monotonic() + 60
        while b"fell too far behind" not in buf and time.monotonic() < deadline:
            chunk = stalled.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
        assert b"fell too far behind" in buf, buf[-300:]
        assert buf.count(b'"op":"set"') < n, "the stalled watcher got everything"
        assert b"resume_from_seq" in buf
        # Both cut-offs happened while the writes above were handed out; then, deliberately,
        # `dead` reads nothing for longer than the 10 s grace a cut-off stream gets to take
        # its last line, so it is the node that must end it.
        wait_until(lambda: _ended_slow(cluster) >= 2, 30, "both streams cut off")
        time.sleep(12)
        dead.settimeout(30)
        total, t_end = 0, time.monotonic() + 60
        while time.monotonic() < t_end:
            try:
                chunk = dead.recv(1 << 20)
            except ConnectionResetError:
                break
            if not chunk:
                break
            total += len(chunk)
        else:
            raise AssertionError("the stalled stream was never closed")
        assert total < n * (1 << 20), "the stalled stream got everything"
        assert httpx.get(cluster.read_url + "/healthz", timeout=10).status_code == 200
        assert _ended_slow(cluster) == 2
    finally:
        stalled.close()
        dead.close()
        healthy.close()


def test_sdk_watch_against_a_real_replica(cluster: Cluster, writer: Client) -> None:
    start = writer.put("w/sdk/a", b"1").seq
    s2 = writer.put(b"w/sdk/\xff", b"\xfe").seq
    s3 = writer.delete("w/sdk/a").seq
    with Client(cluster.root.url, read_url=cluster.read_url) as c:
        got = list(itertools.islice(c.watch("w/sdk/", from_seq=start), 3))
    assert got == [
        Change(start, "set", b"w/sdk/a", b"1"),
        Change(s2, "set", b"w/sdk/\xff", b"\xfe"),
        Change(s3, "delete", b"w/sdk/a", None),
    ]


def test_cli_kv_watch_against_a_real_replica(
    cluster: Cluster, writer: Client, tmp_path: Path
) -> None:
    start = writer.put("w/cli/a", b"x").seq
    out = tmp_path / "watch.out"
    argv = ["kv", "watch", "w/cli/", "--from-seq", str(start), "--read-url", cluster.read_url]
    with out.open("wb") as f, (tmp_path / "watch.err").open("wb") as err:
        p = subprocess.Popen(mercury_cmd(*argv), stdout=f, stderr=err, cwd=REPO)
        try:
            wait_until(lambda: len(out.read_bytes().splitlines()) >= 1, 30, "the first line")
            s2 = writer.put("w/cli/b", b"y").seq
            wait_until(lambda: len(out.read_bytes().splitlines()) >= 2, 30, "the second line")
        finally:
            p.terminate()
            p.wait(10)
    lines = [json.loads(x) for x in out.read_bytes().splitlines()]
    assert lines[:2] == [
        {"seq": start, "op": "set", "key": "w/cli/a", "value": "x"},
        {"seq": s2, "op": "set", "key": "w/cli/b", "value": "y"},
    ]


def test_410_after_log_gc_and_sigterm_with_open_streams(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "logs")
    gc = ["--log-keep-entries", "5", "--log-min-entries", "5", "--log-gc-interval-s", "0.2"]
    try:
        from tests.gateway.conftest import make_root
        from tests.replicator.nodes import start_replica

        root = make_root(procs, tmp_path / "root", *gc)
        repl = root.args[root.args.index("--repl-listen") + 1]
        replica = start_replica(
            procs, tmp_path / "replica", [int(repl.rsplit(":", 1)[1])], *gc, repl=False
        )
        c = Cluster(root, replica)
        _name, token = root.producer(["g/"])
        with Client(root.url, token) as w:
            for i in range(30):
                w.put(f"g/{i}", b"x")
        c.caught_up()
        # the root's watch takes the tokens its point GET takes; without one: 401
        r = httpx.get(root.url + "/v1/watch?prefix=g/", timeout=10)
        assert r.status_code == 401, r.text
        auth = {root.url: token, c.read_url: None}
        for url in (root.url, c.read_url):
            hdr = {"Authorization": f"Bearer {auth[url]}"} if auth[url] else {}

            def gone(url: str = url, hdr: dict[str, str] = hdr) -> httpx.Response | None:
                r = httpx.get(url + "/v1/watch?prefix=g/&from_seq=1", headers=hdr, timeout=10)
                return r if r.status_code == 410 else None

            r = wait_until(gone, 30, f"seq 1 collected on {url}", interval=0.2)
            doc = r.json()
            assert r.headers["content-type"].startswith("application/problem+json")
            assert doc["log_first_seq"] > 1
            assert "range" in doc["detail"] and "from_seq" in doc["detail"]
            # from the first retained seq it streams; the log may move on between the 410 and
            # the next request (the root writes its usage documents at a minute's turn, and
            # the GC here keeps 5 entries), so a new 410 names the new start
            first = doc["log_first_seq"]
            for _ in range(5):
                ok = Stream(url, "g/", from_seq=first, token=auth[url])
                if ok.status != 410:
                    break
                first = json.loads(ok.resp.read())["log_first_seq"]
                ok.close()
            assert ok.status == 200
            ok.read_until(n_changes(1))
            assert ok.changes()[0]["seq"] >= first
            ok.close()
        # SIGTERM with open streams: both processes stop promptly (uvicorn waits for
        # every open response; the hub ends the streams)
        open_streams = [
            Stream(root.url, "g/", token=token).live(),
            Stream(c.read_url, "g/").live(),
        ]
        for p in (replica.proc, root.proc):
            t0 = time.monotonic()
            assert Procs.terminate(p, timeout=20) != -9, procs.logs()
            assert time.monotonic() - t0 < 20
        for s in open_streams:
            s.close()
        root.close_clients()
    finally:
        procs.stop_all()


def test_read_slice_skips_documents_and_starts_mid_record(tmp_path: Path) -> None:
    """The hub's reader over a real store: changes from `from_seq` on even inside one
    batch record, deletes without a value, replicated documents (op 3) left out."""
    from reads.watch import read_slice
    from store.ops import DELETE, SET, Op
    from store.store import Store

    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 28)
    try:
        r1 = store.apply([Op(SET, b"a/1", b"x"), Op(SET, b"a/\xff", b"\xfe"), Op(SET, b"b", b"y")])
        store.put_docs({"note": b"{}"})
        r2 = store.apply([Op(DELETE, b"a/1")])
        lines, nxt = read_slice(store, r1.first_seq + 1)
        docs = [json.loads(x.line) for x in lines]
        assert [d["seq"] for d in docs] == [r1.first_seq + 1, r1.last_seq, r2.last_seq]
        assert docs[0] == {
            "seq": r1.first_seq + 1,
            "op": "set",
            "key_b64": base64.b64encode(b"a/\xff").decode(),
            "value_b64": "/g==",
        }
        assert docs[2] == {"seq": r2.last_seq, "op": "delete", "key": "a/1"}
        assert nxt == r2.last_seq + 1
        assert read_slice(store, nxt) == ([], nxt)
    finally:
        store.close()


def test_sdk_watch_resumes_across_a_replica_restart_without_loss_or_repeat(
    tmp_path: Path,
) -> None:
    """The SDK resumes from the last seq it delivered (from_seq inclusive on the node, the
    repeated change skipped by the SDK): across a SIGTERM and restart of the replica it
    serves from, every change arrives exactly once, in order."""
    from mercury_client import RetryPolicy
    from tests.replicator.nodes import restart

    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "logs")
    try:
        c = make_cluster(procs, tmp_path)
        _name, token = c.root.producer(["r/"])
        got: list[Change] = []
        done = threading.Event()

        def consume() -> None:
            policy = RetryPolicy(attempts=60, base=0.1, cap=1.0)
            with Client(c.root.url, read_url=c.read_url, retries=policy) as reader:
                for ch in reader.watch("r/", from_seq=1):
                    got.append(ch)
                    if len(got) >= 40:
                        break
            done.set()

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        sent: list[int] = []
        with Client(c.root.url, token) as w:
            sent += [w.put(f"r/{i}", b"x").seq for i in range(20)]
            wait_until(lambda: len(got) >= 5, 30, "the first changes watched")
            Procs.terminate(c.replica.proc)
            sent += [w.put(f"r/{i}", b"y").seq for i in range(20, 40)]
            c.replica = restart(procs, c.replica)
        assert done.wait(60), f"{len(got)} changes arrived; logs:\n{procs.logs()[-3000:]}"
        if [ch.seq for ch in got] != sent:
            pytest.fail(f"got {[(ch.seq, ch.key) for ch in got]}, sent {sent}")
        assert [ch.key for ch in got] == [f"r/{i}".encode() for i in range(40)]
        c.root.close_clients()
    finally:
        procs.stop_all()


def test_watch_under_read_auth_needs_a_token_and_sees_only_its_keyspace(
    tmp_path: Path,
) -> None:
    from tests.gateway.conftest import make_root
    from tests.replicator.nodes import start_replica

    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "logs")
    try:
        root = make_root(procs, tmp_path / "root")
        repl = root.args[root.args.index("--repl-listen") + 1]
        replica = start_replica(
            procs, tmp_path / "replica", [int(repl.rsplit(":", 1)[1])], "--read-auth", repl=False
        )
        c = Cluster(root, replica)
        _a, token_a = root.producer(["ra/"])
        _b, token_b = root.producer(["rb/"])
        c.caught_up()
        r = httpx.get(c.read_url + "/v1/watch?prefix=ra/", timeout=10)
        assert r.status_code == 401
        host, port = c.read_url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        # asks for every key: narrowed to the token's keyspace
        conn.request("GET", "/v1/watch?prefix=", headers={"Authorization": f"Bearer {token_a}"})
        resp = conn.getresponse()
        assert resp.status == 200
        with Client(root.url, token_b) as wb, Client(root.url, token_a) as wa:
            wb.put("rb/secret", b"no")
            sa = wa.put("ra/mine", b"yes").seq
        lines: list[Doc] = []
        deadline = time.monotonic() + 30
        while not any("op" in d for d in lines) and time.monotonic() < deadline:
            lines.append(json.loads(resp.readline()))
        assert [d for d in lines if "op" in d] == [
            {"seq": sa, "op": "set", "key": "ra/mine", "value": "yes"}
        ]
        resp.close()
        conn.close()
        root.close_clients()
    finally:
        procs.stop_all()


def test_a_cut_off_names_the_first_change_it_did_not_send(tmp_path: Path) -> None:
    """The hub over a real store in this process: a stream that stops reading is cut off
    at its queue bound, its last line names the oldest change it was not sent, and a new
    stream from there gets exactly the rest."""
    from reads.watch import WatchHub
    from store.store import Store

    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 28)

    async def run() -> None:
        hub = WatchHub(store, queue_bytes=300, queue_chunks=100)
        try:
            gen = hub.stream(b"k/", hub.admit(None))
            assert b"heartbeat" in await anext(gen)  # live: joined the hub
            seqs = []
            for i in range(10):  # ~60-byte lines: the 300-byte queue overflows
                seqs.append(await asyncio.to_thread(_put, store, f"k/{i}"))
                # The hub hands each commit out on its own (the queue then holds the
                # oldest change when it overflows), not several in one chunk.
                await wait_until_async(lambda: hub.next_seq > seqs[-1], 10, f"k/{i} handed out")
            assert hub.cut_off == 1
            lines = [json.loads(x) async for chunk in gen for x in chunk.splitlines()]
            sent = [d["seq"] for d in lines if "op" in d]
            assert sent == []  # nothing was taken before the cut: the queue was dropped
            resume = lines[-1]["resume_from_seq"]
            assert resume == seqs[0] and "fell too far behind" in lines[-1]["error"]
            again = hub.stream(b"k/", hub.admit(resume))
            got: list[int] = []
            while len(got) < len(seqs):
                got += [
                    json.loads(x)["seq"] for x in (await anext(again)).splitlines() if b'"op"' in x
                ]
            assert got == seqs
            await again.aclose()
        finally:
            await hub.stop()

    try:
        asyncio.run(run())
    finally:
        store.close()


def _put(store: Any, key: str) -> int:
    from store.ops import SET, Op

    return int(store.apply([Op(SET, key.encode(), b"v" * 10, "t")]).last_seq)
