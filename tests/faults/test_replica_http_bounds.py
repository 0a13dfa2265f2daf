"""The replica's HTTP read listener under the root's bounds (`--http-*`): idle sockets and
trickled heads are closed at the deadline while a good client is served, an oversized
head is refused, the connection cap evicts idle sockets before it locks a reader out, and
a get_bulk body larger than 10,000 keys can need is refused 413 before it is read — over
plain HTTP, over HTTPS, and on every reader process of `--read-workers`.

A real `mercury replica` following an in-process source; real sockets; every loop bounded
in count and time.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from net.tlsconf import TlsContexts
from reads import bulkbody
from testkit import metrics, procstat
from testkit.procs import Procs, anon_rss_mb, free_port, wait_http
from testkit.replication import RootNode, wait_seq
from testkit.sockets import closed_within, endless_head
from testkit.wait import wait_until
from tests.security.test_tls import (
    Pki,
    https,
    pki,  # noqa: F401 - the fixture
    tls_flags,
    wait_https,
)

IDLE_S = 2  # --http-idle-timeout of these replicas
CAP = 40  # --http-max-connections


@dataclass
class Replica:
    port: int
    ctx: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ctx else 'http'}://127.0.0.1:{self.port}"

    def connect(self) -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return raw if self.ctx is None else self.ctx.wrap_socket(raw, server_hostname="r")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10, verify=self.ctx or True)

    def metric(self, name: str, **labels: str) -> float:
        with self.client() as c:
            return metrics.value(c.get("/metrics").text, name, **labels)


def _bounds(*extra: str) -> list[str]:
    return ["--http-idle-timeout", str(IDLE_S), "--http-max-connections", str(CAP), *extra]


def _start(
    tmp_path: Path, procs: Procs, root: RootNode, *extra: str, name: str = "replica"
) -> tuple[int, object]:
    port = free_port()
    args = ["replica", str(tmp_path / name), "--listen", f"127.0.0.1:{port}"]
    args += ["--source", f"127.0.0.1:{root.port}", "--no-sync", *_bounds(), *extra]
    return port, procs.start_mercury(*args, name=name)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[RootNode]:
    root = RootNode(str(tmp_path / "root"))
    try:
        root.write(50)
        yield root
    finally:
        root.close()


@pytest.fixture
def replica(tmp_path: Path, procs: Procs, source: RootNode) -> Replica:
    port, p = _start(tmp_path, procs, source)
    wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=p)  # type: ignore[arg-type]
    wait_seq(port, source.store.last_seq())
    return Replica(port)


def _point_gets_work(r: Replica) -> None:
    with r.client() as c:
        got = c.get("/v1/kv/k00000007")
        assert got.status_code == 200 and got.content == b"v7-0"
        assert c.post("/v1/get_bulk", json={"keys": ["k00000001"]}).json() == {
            "values": {"k00000001": "v1-0"}
        }


def _idle_and_trickled_are_closed_while_others_are_served(r: Replica) -> None:
    idle = [r.connect() for _ in range(20)]  # never send a byte
    slow = [r.connect() for _ in range(3)]
    try:
        for s in slow:
            s.sendall(b"GET /v1/kv/k00000001 HTTP/1.1\r\nHost: r\r\n")
        closed: set[int] = set()
        # A header line every 0.5 s at most (the hostile clients' pace: a wait for each
        # one's close meanwhile): 15 s and more, far past the 2 s deadline.
        for i in range(30):
            _point_gets_work(r)  # a good client is served meanwhile
            for n, s in enumerate(slow):
                if n in closed:
                    continue
                try:
                    s.sendall(f"x-slow-{i}: y\r\n".encode())
                except OSError:
                    closed.add(n)
                    continue
                if closed_within(s, 0.5 / len(slow)):
                    closed.add(n)
            if len(closed) == len(slow):
                break
        assert len(closed) == len(slow), "a trickled request head was never closed"
        still_open = [s for s in idle if not closed_within(s, 10)]
        assert not still_open, f"{len(still_open)} idle sockets still open"
    finally:
        for s in idle + slow:
            s.close()
    _point_gets_work(r)


def test_idle_sockets_and_trickled_heads_are_closed_while_a_client_is_served(
    replica: Replica,
) -> None:
    _idle_and_trickled_are_closed_while_others_are_served(replica)
    assert replica.metric("mercury_http_connections_closed_total", reason="idle") >= 20


def test_a_keep_alive_client_of_point_gets_is_never_cut_off(replica: Replica) -> None:
    """Point gets answered in the protocol (reads/fasthttp.py) are answers too: they move
    the deadline and never add up to an oversized head."""
    with replica.client() as c:
        t0 = time.monotonic()
        for i in range(3000):  # ~150 KiB of request heads on one connection, > 64 KiB
            got = c.get(f"/v1/kv/k{i % 50:08d}", headers={"x-pad": "p" * 30})
            assert got.status_code == 200, got.text
            if time.monotonic() - t0 > 3 * IDLE_S:
                break
        # and one connection, spanning more than the idle timeout in small gaps
        for i in range(int(1.5 * IDLE_S * 4)):  # 1.5 idle timeouts, in 0.25 s gaps
            assert c.get(f"/v1/kv/k{i % 50:08d}").status_code == 200
            time.sleep(0.25)  # the client's pause between requests, under the idle timeout
    assert replica.metric("mercury_http_connections_closed_total", reason="header_too_large") == 0


def _big_head_is_refused(r: Replica) -> None:
    s = r.connect()
    try:  # up to 64 MiB of head, never ended
        line = b"x-pad: " + b"a" * 1000 + b"\r\n"
        closed, got = endless_head(
            s, b"GET /v1/kv/k00000001 HTTP/1.1\r\nHost: r\r\n", line * 1024, 64
        )
    finally:
        s.close()
    # 431 then a close (or a reset before the 431 could be read): never an answer or a hang
    assert closed, "an endless request head was read on for ever"
    assert got == b"" or got.startswith(b"HTTP/1.1 431"), got[:80]
    _point_gets_work(r)


def test_an_oversized_request_head_is_refused(replica: Replica) -> None:
    _big_head_is_refused(replica)
    assert replica.metric("mercury_http_connections_closed_total", reason="header_too_large") >= 1


def test_the_connection_cap_evicts_idle_sockets_before_a_reader_is_locked_out(
    replica: Replica,
) -> None:
    idle = [replica.connect() for _ in range(3 * CAP)]
    try:
        _point_gets_work(replica)  # served: the longest-idle socket made room
        assert replica.metric("mercury_http_connections_closed_total", reason="evicted") >= CAP
        assert replica.metric("mercury_http_connections") <= CAP + 1
    finally:
        for s in idle:
            s.close()


def _head(length: int | None, chunked: bool = False) -> bytes:
    h = b"POST /v1/get_bulk HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
    if length is not None:
        h += b"Content-Length: %d\r\n" % length
    if chunked:
        h += b"Transfer-Encoding: chunked\r\n"
    return h + b"\r\n"


def _response(s: socket.socket, timeout: float = 10) -> bytes:
    s.settimeout(timeout)
    got = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    return got


def test_an_oversized_get_bulk_body_is_refused_413_before_it_is_read(replica: Replica) -> None:
    # Content-Length past the bound, and no body sent at all: answered from the head alone.
    s = replica.connect()
    try:
        s.sendall(_head(100 << 20))
        got = _response(s)
        assert got.startswith(b"HTTP/1.1 413"), got[:200]
        assert b"too-large" in got and b"connection: close" in got.lower()
        assert closed_within(s, 10)
    finally:
        s.close()
    # Chunked: reading stops at the bound (the rest is never read).
    s = replica.connect()
    sent = 0
    try:
        s.sendall(_head(None, chunked=True) + b'100000\r\n{"keys": [' + b" " * (0x100000 - 10))
        sent = 0x100000
        piece = b"\r\n100000\r\n" + b" " * 0x100000
        with contextlib.suppress(OSError):
            while sent < 4 * bulkbody.MAX_BULK_BODY:  # bounded: a few times the bound
                s.sendall(piece)
                sent += 0x100000
        got = _response(s)
        assert got.startswith(b"HTTP/1.1 413"), got[:200]
        assert sent < 4 * bulkbody.MAX_BULK_BODY  # refused (and closed) before all was sent
    finally:
        s.close()
    _point_gets_work(replica)


def test_a_get_bulk_of_millions_of_tiny_keys_is_refused_without_holding_reads(
    replica: Replica,
) -> None:
    """Within the byte bound but far more items than 10,000 keys: 400, counted before it is
    decoded, while point gets go on being answered."""
    body = b'{"keys": [' + b",".join([b'"a"'] * 5_000_000) + b"]}"
    assert len(body) <= bulkbody.MAX_BULK_BODY
    stop = threading.Event()
    slowest = [0.0]

    def reader() -> None:
        with replica.client() as c:
            while not stop.is_set():
                t = time.monotonic()
                assert c.get("/v1/kv/k00000003").status_code == 200
                slowest[0] = max(slowest[0], time.monotonic() - t)
                stop.wait(0.01)  # pacing the reader, not waiting for anything

    t = threading.Thread(target=reader)
    t.start()
    try:
        with replica.client() as c:
            r = c.post("/v1/get_bulk", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "at most 10000 keys" in r.json()["detail"]
        assert "commas outside its strings" in r.json()["detail"]  # counted, not decoded
    finally:
        stop.set()
        t.join(30)
    assert slowest[0] < 5  # generous: reads went on (decoding it all stalled them seconds)
    # A body of exactly 10,000 keys still works; one of 10,001 names the real count.
    keys = [f"k{i % 50:08d}" for i in range(10_000)]
    with replica.client() as c:
        pretty = json.dumps({"keys": keys}, indent=2).encode()
        r = c.post("/v1/get_bulk", content=pretty, headers={"content-type": "application/json"})
        assert r.status_code == 200 and len(r.json()["values"]) == 50
        r = c.post("/v1/get_bulk", json={"keys": [*keys, "x"]})
        assert r.status_code == 400 and "got 10001" in r.json()["detail"]


def test_every_reader_process_is_bounded(tmp_path: Path, procs: Procs, source: RootNode) -> None:
    port, p = _start(tmp_path, procs, source, "--read-workers", "2", name="workers")
    wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=p)  # type: ignore[arg-type]
    wait_seq(port, source.store.last_seq())
    r = Replica(port)
    # 20 idle sockets land on both readers (SO_REUSEPORT): every one is closed
    _idle_and_trickled_are_closed_while_others_are_served(r)
    for _ in range(4):  # heads refused whichever reader takes them
        _big_head_is_refused(r)


def test_https_reads_are_bounded_alike(
    tmp_path: Path,
    procs: Procs,
    pki: Pki,  # noqa: F811
) -> None:
    tls_source = RootNode(str(tmp_path / "tls-root"), tls=TlsContexts(pki.issue("root")))
    try:
        tls_source.write(50)
        files = pki.issue("replica")
        port, p = _start(tmp_path, procs, tls_source, *tls_flags(files), name="tls")
        wait_https(f"https://127.0.0.1:{port}/healthz", files, p)  # type: ignore[arg-type]
        with https(files) as c:
            seq = tls_source.store.last_seq()
            deadline = time.monotonic() + 60
            while c.get(f"https://127.0.0.1:{port}/v1/status").json()["seq"] < seq:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        ctx = ssl.create_default_context(cafile=files.ca)
        ctx.check_hostname = False
        r = Replica(port, ctx)
        _idle_and_trickled_are_closed_while_others_are_served(r)
        _big_head_is_refused(r)
        s = r.connect()
        try:
            s.sendall(_head(100 << 20))
            got = _response(s)
            assert got.startswith(b"HTTP/1.1 413"), got[:200]
        finally:
            s.close()
    finally:
        tls_source.close()


BIG = 12 << 20  # a value whose answer no socket buffer takes whole
UNSENT_CAP = 40 << 20  # --http-max-unsent-bytes of the replica below
WRITE_S = 3  # --http-write-timeout of the replica below
STALLED = 30  # clients that never read: 360 MB of answers, 9x the cap


def _answered_or_closed(s: socket.socket) -> bool:
    """The server has acted on what `s` sent: bytes of an answer wait in it, or it was
    closed (EOF or reset). Reads nothing."""
    try:
        s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def _unread(port: int, clients: list[socket.socket]) -> int:
    """Bytes `clients` sent to the local server on `port` that it has not read yet (the
    kernel's own account)."""
    return procstat.unread_bytes(port, {s.getsockname()[1] for s in clients})


def _taken(s: socket.socket, seconds: float) -> int:
    """Bytes `s` receives until its peer closes or resets it (within `seconds`)."""
    n = 0
    deadline = time.monotonic() + seconds
    with contextlib.suppress(OSError):
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            n += len(chunk)
    return n


def test_clients_that_never_take_their_answers_cannot_hold_the_memory(
    tmp_path: Path, procs: Procs, source: RootNode
) -> None:
    """A point get of a big value, asked on many connections whose clients never read: the
    answers are written whole, so each held its value for as long as its client kept the
    connection open, and a thousand of them the node's memory. Past `--http-max-unsent-bytes`
    the connections taking nothing are aborted, the rest after `--http-write-timeout`; a
    client that reads is served in full meanwhile."""
    from store.ops import SET, Op

    value = bytes(range(256)) * (BIG // 256)
    source.store.apply([Op(SET, b"big", value, owner="t")])
    port, p = _start(
        tmp_path,
        procs,
        source,
        "--http-write-timeout",
        str(WRITE_S),
        "--http-max-unsent-bytes",
        str(UNSENT_CAP),
    )
    wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=p)  # type: ignore[arg-type]
    wait_seq(port, source.store.last_seq())
    r = Replica(port)
    pid = p.pid  # type: ignore[attr-defined]
    with r.client() as c:  # one full answer first: the process's own buffers at rest
        assert c.get("/v1/kv/big").content == value
    before = anon_rss_mb(pid)
    stalled = []
    try:
        for _ in range(STALLED):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /v1/kv/big HTTP/1.1\r\nHost: r\r\n\r\n")
            stalled.append(s)
        # Every request acted on: its answer's first bytes wait in its socket, or its
        # connection was aborted for the cap.
        wait_until(lambda: all(_answered_or_closed(s) for s in stalled), 10, "requests acted on")
        held = anon_rss_mb(pid) - before
        with r.client() as c:  # a client that reads is served, in full
            got = c.get("/v1/kv/big")
            assert got.status_code == 200 and got.content == value
        # The cap, the answers made in the loop turns before the aborted connections'
        # buffers are freed (a turn later), their making (a read value, the reply) and the
        # allocator's slack: the freed buffers stay in the heap for the next answers.
        bound = (UNSENT_CAP + 12 * BIG) / (1 << 20)
        assert held < bound, f"{held:.0f} MB held for unread answers (bound {bound:.0f})"
        assert r.metric("mercury_http_connections_closed_total", reason="unsent_cap") >= 1

        # Every stalled client is cut short of its answer: by the cap, or at the timeout.
        def cut() -> float:
            return sum(
                r.metric("mercury_http_connections_closed_total", reason=why)
                for why in ("unsent_cap", "write_timeout")
            )

        wait_until(lambda: cut() >= len(stalled), WRITE_S + 20, "every stalled client cut")
        short = [_taken(s, 10) for s in stalled]
        assert all(n < BIG for n in short), short
    finally:
        for s in stalled:
            s.close()
    _point_gets_work(r)


def test_bodies_arriving_at_once_are_bounded_and_the_rest_told_to_retry(
    tmp_path: Path, procs: Procs, source: RootNode
) -> None:
    """A get_bulk body may be 30 MB and each connection waits 30 s for its next piece: a
    client sending most of one on each of many connections, then pausing, would hold them
    all. Past `--http-max-body-bytes-held` a body is answered 503 with Retry-After as its
    bytes arrive (its head alone takes nothing); the bytes come back when a body ends (here:
    its client leaves)."""
    held_cap = 20_000_000
    port, p = _start(tmp_path, procs, source, "--http-max-body-bytes-held", str(held_cap))
    wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=p)  # type: ignore[arg-type]
    wait_seq(port, source.store.last_seq())
    r = Replica(port)
    n = 9_000_000  # two of these fit, a third does not
    body = json.dumps({"keys": ["k00000001"] * 1000}).encode()
    body += b" " * (n - len(body))  # JSON whitespace to the exact length
    pending = []
    try:
        for _ in range(2):  # most of a body each, then silence
            s = r.connect()
            s.sendall(_head(n) + body[: n - 1000])
            pending.append(s)
        idle_head = r.connect()  # announces a body, sends none: holds nothing
        idle_head.sendall(_head(n))
        pending.append(idle_head)
        # Both read as far as they were sent: nothing of theirs waits in a socket buffer.
        wait_until(lambda: _unread(port, pending) == 0, 10, "the two bodies read")
        third = r.connect()
        with third:
            third.sendall(_head(n))
            with contextlib.suppress(OSError):  # refused (and closed) part-way
                for off in range(0, n, 1 << 20):
                    third.sendall(body[off : off + (1 << 20)])
            got = _response(third)
        head, _, doc = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), got[:300]
        assert b"retry-after: 1" in head.lower(), head
        assert json.loads(doc)["status"] == 503
        _point_gets_work(r)  # a small get_bulk fits beside them
        pending.pop(0).close()  # its bytes come back once the node sees it leave
        answers: list[httpx.Response] = []

        def answered() -> bool:
            with r.client() as c:
                answers.append(
                    c.post(
                        "/v1/get_bulk", content=body, headers={"content-type": "application/json"}
                    )
                )
            return answers[-1].status_code != 503

        wait_until(answered, 10, "the body's bytes back once its client left", interval=0.2)
        answer = answers[-1]
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["values"] == {"k00000001": "v1-0"}
    finally:
        for s in pending:
            s.close()
