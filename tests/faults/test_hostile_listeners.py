"""Hostile clients on the KT and memcached listeners: a huge binary get_bulk, idle and
half-sent requests, more connections than the cap. A real `python -m reads.serve` over a
real store, real sockets."""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest

from reads import kt_protocol as kt
from store.ops import SET, Op
from store.store import Store
from tests.support import metrics
from tests.support.procs import Procs, free_port, wait_http, wait_port


@dataclass
class Ports:
    http: int
    kt: int
    mc: int

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.http}/metrics", timeout=5).text
        return metrics.value(text, name, **labels)


StartReads = Callable[..., Ports]


@pytest.fixture
def start_reads(store: Store, procs: Procs) -> StartReads:
    def start(*flags: str) -> Ports:
        ports = Ports(free_port(), free_port(), free_port())
        argv = [sys.executable, "-m", "reads.serve", store.path, "--role", "replica"]
        argv += ["--listen", f"127.0.0.1:{ports.http}"]
        argv += ["--kt-listen", f"127.0.0.1:{ports.kt}"]
        argv += ["--memcached-listen", f"127.0.0.1:{ports.mc}", *flags]
        p = procs.start(argv, name="reads")
        wait_http(f"http://127.0.0.1:{ports.http}/healthz", proc=p)
        wait_port(ports.kt, proc=p)
        wait_port(ports.mc, proc=p)
        return ports

    return start


def _recv_until(sock: socket.socket, end: bytes, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    got = b""
    while not got.endswith(end):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes `sock` (EOF or reset) within `seconds`; data first
    (an error reply) is read and skipped."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            if sock.recv(65536) == b"":
                return True
        except ConnectionError:
            return True
        except TimeoutError:
            return False


def _mc_version(sock: socket.socket) -> bytes:
    sock.sendall(b"version\r\n")
    return _recv_until(sock, b"\r\n", 5.0)


def _binary_get_bulk(nkeys: int) -> bytes:
    rec = struct.Struct(">HI")
    parts = [struct.pack(">BII", kt.MAGIC_GET_BULK, 0, nkeys)]
    parts += [rec.pack(0, 8) + b"k%07d" % i for i in range(nkeys)]
    return b"".join(parts)


def _rpc_get_bulk(nkeys: int) -> bytes:
    body = b"".join(b"_k%07d\t\n" % i for i in range(nkeys))
    head = (
        b"POST /rpc/get_bulk HTTP/1.1\r\nContent-Type: text/tab-separated-values\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    return head + body


@pytest.mark.parametrize(
    ("make", "nkeys", "first"),
    [(_binary_get_bulk, 1 << 20, bytes([kt.MAGIC_GET_BULK])), (_rpc_get_bulk, 1 << 20, b"H")],
    ids=["binary", "tsv-rpc"],
)
def test_big_get_bulk_does_not_hold_other_clients(
    store: Store,
    start_reads: StartReads,
    make: Callable[[int], bytes],
    nkeys: int,
    first: bytes,
) -> None:
    for b in range(0, 20_000, 5_000):
        store.apply([Op(SET, b"k%07d" % i, b"v%d" % i, "t") for i in range(b, b + 5_000)])
    ports = start_reads()
    request = make(nkeys)
    assert len(request) < kt.MAX_BODY

    answers: list[float] = []
    stop = threading.Event()

    def memcached_reader() -> None:
        with socket.create_connection(("127.0.0.1", ports.mc), 5) as s:
            while not stop.is_set():
                s.sendall(b"get k0000042\r\n")
                if _recv_until(s, b"END\r\n") == b"VALUE k0000042 0 3\r\nv42\r\nEND\r\n":
                    answers.append(time.monotonic())
                time.sleep(0.005)

    reader = threading.Thread(target=memcached_reader, daemon=True)
    reader.start()
    try:
        with socket.create_connection(("127.0.0.1", ports.kt), 5) as big:
            big.sendall(request)
            sent_all = time.monotonic()
            big.settimeout(120)
            head = big.recv(5)
            first_byte = time.monotonic()
            while len(head) < 5:
                head += big.recv(5 - len(head))
        during = [t for t in answers if sent_all < t < first_byte]
    finally:
        stop.set()
        reader.join(10)
    assert head[:1] == first
    if first != b"H":
        assert struct.unpack(">BI", head) == (kt.MAGIC_GET_BULK, 20_000)
    # Answered while the server worked on the big request, not only before or after it.
    assert len(during) >= 3, (
        f"{len(during)} memcached answers in the {first_byte - sent_all:.2f}s between the "
        f"end of the request and its first reply byte"
    )


def test_idle_connections_are_closed_others_keep_being_served(start_reads: StartReads) -> None:
    ports = start_reads("--listener-idle-timeout-s", "2")
    idle_mc = socket.create_connection(("127.0.0.1", ports.mc), 5)
    idle_kt = socket.create_connection(("127.0.0.1", ports.kt), 5)
    with idle_mc, idle_kt:
        busy = socket.create_connection(("127.0.0.1", ports.mc), 5)
        with busy:
            # A client that keeps asking is never idle (asks 20 times per idle period, so a
            # loaded machine's late wake-ups cannot make it look idle).
            for _ in range(30):
                assert _mc_version(busy).startswith(b"VERSION")
                time.sleep(0.1)
            assert _closed_within(idle_mc, 10.0)
            assert _closed_within(idle_kt, 10.0)
            assert _mc_version(busy).startswith(b"VERSION")
    assert (
        ports.metric("mercury_listener_refused_total", listener="memcached", reason="idle_timeout")
        >= 1
    )
    assert ports.metric("mercury_listener_refused_total", listener="kt", reason="idle_timeout") >= 1


def test_over_the_cap_is_refused_while_existing_clients_keep_working(
    start_reads: StartReads,
) -> None:
    ports = start_reads("--listener-max-connections", "3")
    held = [socket.create_connection(("127.0.0.1", ports.mc), 5) for _ in range(3)]
    try:
        for s in held:
            assert _mc_version(s).startswith(b"VERSION")
        with socket.create_connection(("127.0.0.1", ports.mc), 5) as extra:
            assert _recv_until(extra, b"\r\n", 5.0) == b"SERVER_ERROR Too many open connections\r\n"
            assert _closed_within(extra, 5.0)
        for s in held:
            assert _mc_version(s).startswith(b"VERSION")
        assert ports.metric("mercury_listener_connections", listener="memcached") == 3
        assert (
            ports.metric(
                "mercury_listener_refused_total", listener="memcached", reason="max_connections"
            )
            == 1
        )
    finally:
        for s in held:
            s.close()
    # Closing frees the places.
    deadline = time.monotonic() + 5
    while (
        ports.metric("mercury_listener_connections", listener="memcached")
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", ports.mc), 5) as again:
        assert _mc_version(again).startswith(b"VERSION")


def test_parked_partial_requests_are_dropped_after_their_timeouts(
    start_reads: StartReads,
) -> None:
    ports = start_reads(
        "--listener-header-timeout-s", "1", "--listener-body-timeout-s", "2",
        "--listener-idle-timeout-s", "300",
    )  # fmt: skip
    parked = {
        "mc body": (ports.mc, b"set k 0 0 100\r\n" + b"x" * 10),
        "kt body": (ports.kt, b"POST /rpc/get HTTP/1.1\r\nContent-Length: 100\r\n\r\nkey="),
        "kt binary body": (ports.kt, struct.pack(">BII", kt.MAGIC_GET_BULK, 0, 10)),
        "mc header": (ports.mc, b"get k00"),
        "kt header": (ports.kt, b"GET /k HTTP/1.1\r\nHost: x"),
    }
    socks = {}
    for name, (port, data) in parked.items():
        s = socket.create_connection(("127.0.0.1", port), 5)
        s.sendall(data)
        socks[name] = s
    try:
        with socket.create_connection(("127.0.0.1", ports.mc), 5) as good:
            for name, s in socks.items():
                assert _closed_within(s, 6.0), f"{name}: still open"
            assert _mc_version(good).startswith(b"VERSION")
    finally:
        for s in socks.values():
            s.close()
    for listener, reason, n in (
        ("memcached", "body_timeout", 1),
        ("kt", "body_timeout", 2),
        ("memcached", "header_timeout", 1),
        ("kt", "header_timeout", 1),
    ):
        got = ports.metric("mercury_listener_refused_total", listener=listener, reason=reason)
        assert got == n, (listener, reason, got)


def test_a_client_that_reads_no_replies_is_closed_after_the_write_timeout(
    store: Store, start_reads: StartReads
) -> None:
    store.apply([Op(SET, b"big", b"x" * (1 << 20), "t")])
    ports = start_reads("--listener-write-timeout-s", "1")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", ports.mc))
    with s:
        s.settimeout(5)
        s.sendall(b"get big\r\n" * 64)  # 64 MiB of replies, none of which we read
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if ports.metric(
                "mercury_listener_refused_total", listener="memcached", reason="write_timeout"
            ):
                break
            time.sleep(0.2)
        assert (
            ports.metric(
                "mercury_listener_refused_total", listener="memcached", reason="write_timeout"
            )
            == 1
        )
        with socket.create_connection(("127.0.0.1", ports.mc), 5) as good:
            assert _mc_version(good).startswith(b"VERSION")
