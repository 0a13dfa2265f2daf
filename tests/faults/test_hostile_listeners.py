"""Hostile clients on the KT and memcached listeners: a huge binary get_bulk, idle and
half-sent requests, more connections than the cap; and on the HTTP read API, bounded by the
same `--http-*` flags as a replica's (silent sockets, trickled and oversized request heads).
A real `python -m mercury.readserve` over a real store, real sockets."""

from __future__ import annotations

import contextlib
import http.client
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest

from kt import protocol as kt
from store.ops import DELETE, SET, Op
from store.store import Store
from testkit import metrics
from testkit.procs import Procs, anon_rss_mb, free_port, wait_http, wait_port
from testkit.sockets import closed_within, endless_head, recv_until
from testkit.wait import wait_until


@dataclass
class Ports:
    http: int
    kt: int
    mc: int
    pid: int = 0  # the server's

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.http}/metrics", timeout=5).text
        return metrics.value(text, name, **labels)


StartReads = Callable[..., Ports]


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


#: A whole request, then the start of another left unfinished: once the first is answered,
#: the server holds the second in progress (it came in the same segment), so the
#: connection is busy from then on (a request in progress is never evicted).
MC_BUSY = b"version\r\nget k"
KT_BUSY = b"GET /rpc/void HTTP/1.1\r\n\r\nGET /rpc/void HTTP/1.1\r\nHost: x"


#: The value a stuck connection asks for again and again (`_stuck`).
BIG = 1 << 20
STUCK_GETS = 64


def _put_big(store: Store) -> None:
    store.apply([Op(SET, b"big", b"x" * BIG, "t")])


def _stuck(port: int, listener: str) -> socket.socket:
    """A connection the listener may never evict: replies its client does not take (64
    MiB asked, a 4 KiB receive buffer), so it has bytes left to write. (A request merely
    arriving, however young, may go at the cap: trickled requests must not hold it.)"""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    ask = b"get big\r\n" if listener == "memcached" else b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n"
    s.sendall(ask * STUCK_GETS)
    return s


def _wait_stuck(ports: Ports, listener: str, n: int) -> None:
    """Until `n` stuck connections of `listener` hold replies past their high-water mark."""
    wait_until(
        lambda: (
            ports.metric("mercury_listener_write_queued_bytes", listener=listener)
            >= n * (256 << 10)
        ),
        15,
        "replies held for clients that take none",
    )


def _unstick(s: socket.socket, listener: str) -> None:
    """Take every reply a stuck connection asked for; then it is served as any other (one
    more request answered). The value is all "x": no marker occurs inside it."""
    if listener == "memcached":
        s.sendall(b"version\r\n")
        end, want = b"VERSION ", 1
    else:
        s.sendall(b"GET /rpc/void HTTP/1.1\r\nHost: x\r\n\r\n")
        end, want = b"\r\n\r\n", STUCK_GETS + 1  # every answer's head, then the void's
    seen, tail = 0, b""
    while seen < want:
        chunk = s.recv(1 << 20)
        assert chunk, f"closed after {seen} of {want}"
        buf = tail + chunk
        seen += buf.count(end)
        tail = buf[-(len(end) - 1) :]


def _make_busy(s: socket.socket, listener: str) -> None:
    """Leave `s` with a request in progress on the server (`MC_BUSY`, `KT_BUSY`)."""
    if listener == "memcached":
        s.sendall(MC_BUSY)
        assert recv_until(s, b"\r\n", 5.0).startswith(b"VERSION")
    else:
        s.sendall(KT_BUSY)
        assert recv_until(s, b"\r\n\r\n", 5.0).startswith(b"HTTP/1.1 200 ")


@pytest.fixture
def start_reads(store: Store, procs: Procs) -> StartReads:
    def start(*flags: str) -> Ports:
        ports = Ports(free_port(), free_port(), free_port())
        argv = [sys.executable, "-m", "mercury.readserve", store.path, "--role", "replica"]
        argv += ["--listen", f"127.0.0.1:{ports.http}"]
        argv += ["--kt-listen", f"127.0.0.1:{ports.kt}"]
        argv += ["--memcached-listen", f"127.0.0.1:{ports.mc}", *flags]
        p = procs.start(argv, name="reads")
        wait_http(f"http://127.0.0.1:{ports.http}/healthz", proc=p)
        wait_port(ports.kt, proc=p)
        wait_port(ports.mc, proc=p)
        ports.pid = p.pid
        return ports

    return start


def _mc_version(sock: socket.socket) -> bytes:
    sock.sendall(b"version\r\n")
    return recv_until(sock, b"\r\n", 5.0)


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
                if recv_until(s, b"END\r\n") == b"VALUE k0000042 0 3\r\nv42\r\nEND\r\n":
                    answers.append(time.monotonic())
                stop.wait(0.005)  # pacing the reader, not waiting for anything

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
            # A client that keeps asking (between two looks at the idle sockets, each a
            # wait of at most 50 ms for their close) is never idle, while the idle ones
            # are closed after their 2 s.
            still_open = [idle_mc, idle_kt]
            deadline = time.monotonic() + 15
            while still_open:
                assert time.monotonic() < deadline, "idle connections never closed"
                assert _mc_version(busy).startswith(b"VERSION")
                still_open = [s for s in still_open if not closed_within(s, 0.05)]
            assert _mc_version(busy).startswith(b"VERSION")
    assert (
        ports.metric("mercury_listener_refused_total", listener="memcached", reason="idle_timeout")
        >= 1
    )
    assert ports.metric("mercury_listener_refused_total", listener="kt", reason="idle_timeout") >= 1


def test_over_the_cap_is_refused_while_existing_clients_keep_working(
    store: Store, start_reads: StartReads
) -> None:
    _put_big(store)
    ports = start_reads("--listener-max-connections", "3")
    held = [_stuck(ports.mc, "memcached") for _ in range(3)]
    try:
        _wait_stuck(ports, "memcached", 3)  # replies left to write: none may be evicted
        with socket.create_connection(("127.0.0.1", ports.mc), 5) as extra:
            assert recv_until(extra, b"\r\n", 5.0) == b"SERVER_ERROR Too many open connections\r\n"
            assert closed_within(extra, 5.0)
        for s in held:
            _unstick(s, "memcached")
        assert ports.metric("mercury_listener_connections", listener="memcached") == 3
        assert (
            ports.metric(
                "mercury_listener_refused_total", listener="memcached", reason="max_connections"
            )
            == 1
        )
        assert not ports.metric(
            "mercury_listener_refused_total", listener="memcached", reason="evicted"
        )
    finally:
        for s in held:
            s.close()
    # Closing frees the places.
    wait_until(
        lambda: not ports.metric("mercury_listener_connections", listener="memcached"),
        5,
        "closed connections leave the count",
    )
    with socket.create_connection(("127.0.0.1", ports.mc), 5) as again:
        assert _mc_version(again).startswith(b"VERSION")


def test_kt_over_the_cap_with_every_connection_busy_answers_503(
    store: Store, start_reads: StartReads
) -> None:
    _put_big(store)
    ports = start_reads("--listener-max-connections", "2")
    held = [_stuck(ports.kt, "kt") for _ in range(2)]
    try:
        _wait_stuck(ports, "kt", 2)  # replies left to write: none may be evicted
        with socket.create_connection(("127.0.0.1", ports.kt), 5) as extra:
            got = recv_until(extra, b"\n", 5.0)
            assert got.startswith(b"HTTP/1.1 503 "), got
            assert closed_within(extra, 5.0)
        for s in held:  # the busy ones take their replies and are served
            _unstick(s, "kt")
        assert (
            ports.metric("mercury_listener_refused_total", listener="kt", reason="max_connections")
            == 1
        )
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("listener", ["memcached", "kt"])
def test_at_the_cap_a_connection_just_closed_makes_room_at_once(
    start_reads: StartReads, listener: str
) -> None:
    """A client that hangs up and reconnects at once (a pool replacing a connection) is
    served: the connection it closed no longer counts, even before the server has
    finished tearing it down. It counted, and was not idle (closing), so the newcomer
    was refused."""
    ports = start_reads("--listener-max-connections", "1")
    port = ports.mc if listener == "memcached" else ports.kt
    ask = b"version\r\n" if listener == "memcached" else b"GET /rpc/void HTTP/1.1\r\n\r\n"
    ok = b"VERSION" if listener == "memcached" else b"HTTP/1.1 200 "
    for _ in range(30):
        socket.create_connection(("127.0.0.1", port), 5).close()
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            s.sendall(ask)
            assert recv_until(s, b"\r\n", 5.0).startswith(ok)
    assert not ports.metric(
        "mercury_listener_refused_total", listener=listener, reason="max_connections"
    )


def _read_to_close(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes (EOF or reset)."""
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def test_kt_over_the_cap_a_binary_client_is_closed_without_an_http_answer(
    store: Store, start_reads: StartReads
) -> None:
    """A binary client cannot parse HTTP: a 503 reads as the bad magic `H`. Refused at the
    cap, it is closed as KT's own server closes; an HTTP client still gets the 503. The
    refused connection waits for its first byte outside the count."""
    _put_big(store)
    ports = start_reads("--listener-max-connections", "2")
    held = [_stuck(ports.kt, "kt") for _ in range(2)]
    try:
        _wait_stuck(ports, "kt", 2)  # replies left to write: none may be evicted
        for magic in (kt.MAGIC_GET_BULK, kt.MAGIC_SET_BULK, kt.MAGIC_REMOVE_BULK):
            with socket.create_connection(("127.0.0.1", ports.kt), 5) as extra:
                extra.sendall(bytes([magic]) + _binary_get_bulk(1)[1:])
                # Closed on its first byte: had the wait run out instead, it would have
                # been answered as one that sent nothing (the 503).
                assert _read_to_close(extra) == b"", hex(magic)
        with socket.create_connection(("127.0.0.1", ports.kt), 5) as extra:
            extra.sendall(b"GET /rpc/void HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_to_close(extra).startswith(b"HTTP/1.1 503 ")
        with socket.create_connection(("127.0.0.1", ports.kt), 5) as silent:
            # held for its first byte, and not counted meanwhile
            wait_until(
                lambda: (
                    ports.metric("mercury_listener_held_refused_connections", listener="kt") == 1
                ),
                10,
                "the silent newcomer held for its first byte",
            )
            assert ports.metric("mercury_listener_connections", listener="kt") == 2
            # The wait is bounded (1 s): answered as one that sent nothing, well within
            # the read's 5 s.
            assert _read_to_close(silent).startswith(b"HTTP/1.1 503 ")
        for s in held:  # the busy ones take their replies and are served
            _unstick(s, "kt")
        assert (
            ports.metric("mercury_listener_refused_total", listener="kt", reason="max_connections")
            == 5
        )
    finally:
        for s in held:
            s.close()


def test_kt_refused_connections_held_for_their_first_byte_are_bounded(
    store: Store, start_reads: StartReads
) -> None:
    """Refused connections wait for their first byte outside the count, so how many may
    wait at once is bounded too (64): past it, a refused one is answered at once as one
    that sent nothing (the 503), so a client holding the 64 places cannot take the 503
    from the others."""
    _put_big(store)
    ports = start_reads("--listener-max-connections", "1")
    held = _stuck(ports.kt, "kt")
    _wait_stuck(ports, "kt", 1)
    assert ports.metric("mercury_listener_connections", listener="kt") == 1
    silent = [socket.create_connection(("127.0.0.1", ports.kt), 5) for _ in range(70)]
    try:
        # The first 64 are held for their first byte (1 s), the 6 past them are not
        # (answered at once, as ones that sent nothing).
        wait_until(
            lambda: ports.metric("mercury_listener_held_refused_connections", listener="kt") >= 64,
            10,
            "64 refused connections held",
        )
        wait_until(lambda: all(_answered_or_closed(s) for s in silent[64:]), 10, "the 6 answered")
        held_now = ports.metric("mercury_listener_held_refused_connections", listener="kt")
        assert held_now == 64, held_now
        with socket.create_connection(("127.0.0.1", ports.kt), 5) as late:
            # sends nothing, is not held either: answered the 503 all the same
            assert _read_to_close(late).startswith(b"HTTP/1.1 503 ")
        got = [_read_to_close(s) for s in silent]
        assert all(g.startswith(b"HTTP/1.1 503 ") for g in got), got
        assert ports.metric("mercury_listener_held_refused_connections", listener="kt") == 0
        _unstick(held, "kt")
    finally:
        held.close()
        for s in silent:
            s.close()


@pytest.mark.parametrize("listener", ["memcached", "kt"])
def test_at_the_cap_the_longest_idle_connection_makes_room(
    start_reads: StartReads, listener: str
) -> None:
    """One client holding every place with idle sockets must not lock the others out: a
    newcomer evicts the connection longest without an answer: the idle ones here, whose last
    answers came before the busy one's request began."""
    ports = start_reads("--listener-max-connections", "3")
    port = ports.mc if listener == "memcached" else ports.kt

    def ask(s: socket.socket) -> bytes:
        if listener == "memcached":
            return _mc_version(s)
        s.sendall(b"GET /rpc/void HTTP/1.1\r\nHost: x\r\n\r\n")
        return recv_until(s, b"\r\n\r\n", 5.0)

    ok = b"VERSION" if listener == "memcached" else b"HTTP/1.1 200 "
    oldest = socket.create_connection(("127.0.0.1", port), 5)
    idle = socket.create_connection(("127.0.0.1", port), 5)
    busy = socket.create_connection(("127.0.0.1", port), 5)
    socks = [oldest, idle, busy]
    try:
        # `oldest` was accepted first, and is idle since; `idle` is answered after, so
        # idle again but more recently active; `busy` has a request in progress, begun
        # after both (a partial request may go too, but after those waiting longer).
        assert ask(idle).startswith(ok)
        _make_busy(busy, listener)
        for n in range(2):  # two newcomers: the two idle ones go, oldest first
            new = socket.create_connection(("127.0.0.1", port), 5)
            socks.append(new)
            assert ask(new).startswith(ok)
            assert closed_within([oldest, idle][n], 5.0)
        # The busy one was kept and finishes its request.
        busy.sendall(b"\r\n" if listener == "memcached" else b"\r\n\r\n")
        assert recv_until(busy, b"\r\n", 5.0).startswith(b"END" if listener == "memcached" else ok)
        assert (
            ports.metric("mercury_listener_refused_total", listener=listener, reason="evicted") == 2
        )
        assert not ports.metric(
            "mercury_listener_refused_total", listener=listener, reason="max_connections"
        )
        assert ports.metric("mercury_listener_connections", listener=listener) == 3
    finally:
        for s in socks:
            s.close()


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
                assert closed_within(s, 6.0), f"{name}: still open"
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
        wait_until(
            lambda: ports.metric(
                "mercury_listener_refused_total", listener="memcached", reason="write_timeout"
            ),
            10,
            "closed at the write timeout",
        )
        assert (
            ports.metric(
                "mercury_listener_refused_total", listener="memcached", reason="write_timeout"
            )
            == 1
        )
        with socket.create_connection(("127.0.0.1", ports.mc), 5) as good:
            assert _mc_version(good).startswith(b"VERSION")


def test_many_clients_that_read_no_replies_cannot_hold_the_memory(
    store: Store, start_reads: StartReads
) -> None:
    """A reply is made only as it is taken, but one piece can be a whole value (up to
    25 MiB): a thousand clients asking for one and never reading would hold the process's
    memory until the write timeout. Past `--listener-max-unsent-bytes` the connections
    taking nothing are closed; a client that reads gets the value meanwhile."""
    big = 12 << 20
    cap = 40 << 20
    value = bytes(range(256)) * (big // 256)
    store.apply([Op(SET, b"big", value, "t")])
    ports = start_reads("--listener-max-unsent-bytes", str(cap))

    def read_value() -> bytes:
        with socket.create_connection(("127.0.0.1", ports.mc), 10) as good:
            good.sendall(b"get big\r\n")
            return recv_until(good, b"\r\nEND\r\n", 10)

    assert value in read_value()  # once first: the process's own buffers at rest
    before = anon_rss_mb(ports.pid)
    stalled = []
    try:
        for _ in range(30):  # 360 MB of replies, 9x the cap
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", ports.mc))
            s.sendall(b"get big\r\n")
            stalled.append(s)
        # Every request answered (its reply's first bytes wait in its socket) or its
        # connection closed for the cap.
        wait_until(lambda: all(_answered_or_closed(s) for s in stalled), 10, "all 30 acted on")
        held = anon_rss_mb(ports.pid) - before
        assert value in read_value()
        # The cap, the replies made in the loop turns before the closed connections' buffers
        # are freed (a turn later), their making (the value read, the reply), and the
        # allocator's slack. Without the cap this run held 720 MB.
        bound = (cap + 12 * big) / (1 << 20)
        assert held < bound, f"{held:.0f} MB held for unread replies (bound {bound:.0f})"
        closed = ports.metric(
            "mercury_listener_refused_total", listener="memcached", reason="unsent_cap"
        )
        assert closed >= 1
    finally:
        for s in stalled:
            s.close()


def test_big_requests_left_unfinished_cannot_hold_the_memory(
    store: Store, start_reads: StartReads
) -> None:
    """A memcached `set` may carry 32 MiB: a client sending most of one on each of many
    connections and then stopping held it all until the body timeout. Past
    `--listener-max-buffered-bytes` the connections whose partial request began longest ago
    are closed; the others keep being served."""
    cap = 100 << 20
    ports = start_reads("--listener-max-buffered-bytes", str(cap))
    before = anon_rss_mb(ports.pid)
    data = b"x" * (30 << 20)
    partial = []
    try:
        for i in range(10):  # 300 MB of unfinished requests, 3x the cap
            s = socket.create_connection(("127.0.0.1", ports.mc), 10)
            s.sendall(b"set k%d 0 0 %d\r\n" % (i, 31 << 20))
            with contextlib.suppress(OSError):  # a connection closed for the cap
                s.sendall(data)
            partial.append(s)
        # Every request was sent (sendall returned) and the cap closed what it must.
        wait_until(
            lambda: (
                ports.metric(
                    "mercury_listener_refused_total", listener="memcached", reason="buffer_cap"
                )
                >= 10 - cap // len(data)
            ),
            10,
            "connections closed for the buffer cap",
        )
        held = anon_rss_mb(ports.pid) - before
        # The cap, a request past it (closed a loop turn later), and the allocator's slack.
        bound = (cap + 4 * len(data)) / (1 << 20)
        assert held < bound, f"{held:.0f} MB held for unfinished requests (bound {bound:.0f})"
        closed = ports.metric(
            "mercury_listener_refused_total", listener="memcached", reason="buffer_cap"
        )
        assert closed >= 10 - cap // len(data)
        with socket.create_connection(("127.0.0.1", ports.mc), 5) as good:
            assert _mc_version(good).startswith(b"VERSION")
    finally:
        for s in partial:
            s.close()


BIG = 200_000


def _mc_amplifier(names: int) -> bytes:
    return b"get " + b" ".join([b"big"] * names) + b"\r\n"


def _kt_amplifier(names: int) -> bytes:
    parts = [struct.pack(">BII", kt.MAGIC_GET_BULK, 0, names)]
    parts += [struct.pack(">HI", 0, 3) + b"big"] * names
    return b"".join(parts)


@pytest.mark.parametrize(
    ("listener", "make"), [("memcached", _mc_amplifier), ("kt", _kt_amplifier)], ids=["mc", "kt"]
)
def test_an_amplifying_request_never_read_holds_a_bounded_reply(
    store: Store, start_reads: StartReads, listener: str, make: Callable[[int], bytes]
) -> None:
    """A request of a few KB naming one 200 KB value 1,250 times asks for a ~250 MB reply;
    a client that reads none of it must not make the server hold it: the reply is made
    only as it is taken, and the connection still goes after the write timeout."""
    store.apply([Op(SET, b"big", b"b" * BIG, "t")])
    ports = start_reads("--listener-write-timeout-s", "4")
    request = make(1250)
    assert len(request) < 20_000
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", ports.mc if listener == "memcached" else ports.kt))
    with s:
        s.sendall(request)
        biggest = 0.0

        def sampled_until_closed() -> bool:
            # Each look samples the queued bytes and checks another client is served.
            nonlocal biggest
            biggest = max(
                biggest,
                ports.metric("mercury_listener_write_queued_max_bytes", listener=listener),
            )
            with socket.create_connection(("127.0.0.1", ports.mc), 5) as good:
                assert _mc_version(good).startswith(b"VERSION")
            return bool(
                ports.metric(
                    "mercury_listener_refused_total", listener=listener, reason="write_timeout"
                )
            )

        # (a look every 0.3 s: each costs the server two connections and a scrape)
        wait_until(sampled_until_closed, 15, "closed at the write timeout", interval=0.3)
        # The stalled reply was queued (the measure sees it) but only a bounded part:
        # the transport's high-water mark, a turn's bytes and a piece (here one value).
        assert 0 < biggest < 4 << 20, biggest
        assert (
            ports.metric(
                "mercury_listener_refused_total", listener=listener, reason="write_timeout"
            )
            == 1
        )


def _mc_values(reply: bytes) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    at = 0
    while not reply.startswith(b"END\r\n", at):
        eol = reply.index(b"\r\n", at)
        word, key, _flags, n = reply[at:eol].split(b" ")
        assert word == b"VALUE"
        start = eol + 2
        out.append((key, reply[start : start + int(n)]))
        assert reply[start + int(n) : start + int(n) + 2] == b"\r\n"
        at = start + int(n) + 2
    assert at + 5 == len(reply), "bytes after END"
    return out


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(min(n - len(got), 1 << 20))
        assert chunk, "closed early"
        got += chunk
    return bytes(got)


def _kt_values(sock: socket.socket) -> list[tuple[bytes, bytes]]:
    magic, hits = struct.unpack(">BI", _recv_exactly(sock, 5))
    assert magic == kt.MAGIC_GET_BULK
    out: list[tuple[bytes, bytes]] = []
    for _ in range(hits):
        _db, ksiz, vsiz, _xt = kt.GET_REPLY_REC.unpack(_recv_exactly(sock, kt.GET_REPLY_REC.size))
        out.append((_recv_exactly(sock, ksiz), _recv_exactly(sock, vsiz)))
    return out


@pytest.mark.parametrize("listener", ["memcached", "kt"])
def test_a_big_multi_get_that_is_read_returns_every_value(
    store: Store, start_reads: StartReads, listener: str
) -> None:
    """A reply made in pieces (far over the size answered whole) is still every value, in
    order, each byte right; the connection then serves the next request."""
    values = {b"v%03d" % i: bytes([65 + i % 26]) * (BIG + i) for i in range(12)}
    store.apply([Op(SET, k, v, "t") for k, v in values.items()])
    ports = start_reads()
    names = [k for k in values for _ in range(2)] + [b"missing"] + list(values)
    want = [(k, values[k]) for k in names if k in values]
    with socket.create_connection(
        ("127.0.0.1", ports.mc if listener == "memcached" else ports.kt), 10
    ) as s:
        s.settimeout(30)
        for _ in range(2):  # twice: the connection works on after a streamed reply
            if listener == "memcached":
                s.sendall(b"get " + b" ".join(names) + b"\r\n")
                got = _mc_values(recv_until(s, b"END\r\n", 30.0))
            else:
                parts = [struct.pack(">BII", kt.MAGIC_GET_BULK, 0, len(names))]
                parts += [struct.pack(">HI", 0, len(k)) + k for k in names]
                s.sendall(b"".join(parts))
                got = _kt_values(s)
            assert [k for k, _ in got] == [k for k, _ in want]
            assert got == want


def _http_get_ok(conn: http.client.HTTPConnection) -> None:
    """A point get on a keep-alive connection answers the value."""
    conn.request("GET", "/v1/kv/k1")
    got = conn.getresponse()
    assert (got.status, got.read()) == (200, b"v1")


def test_http_silent_and_trickled_connections_are_closed_others_keep_being_served(
    store: Store, start_reads: StartReads
) -> None:
    """A socket that sends nothing, and one whose request head trickles in a header line at
    a time, are closed at `--http-idle-timeout` (without the bounds both stayed for ever),
    while a keep-alive client is answered throughout."""
    store.apply([Op(SET, b"k1", b"v1", "t")])
    ports = start_reads("--http-idle-timeout", "2")
    silent = socket.create_connection(("127.0.0.1", ports.http), 5)
    trickled = socket.create_connection(("127.0.0.1", ports.http), 5)
    good = http.client.HTTPConnection("127.0.0.1", ports.http, timeout=5)
    try:
        trickled.sendall(b"GET /v1/kv/k1 HTTP/1.1\r\nHost: r\r\n")
        closed = False
        for i in range(40):  # a header line at most every 0.25 s: 10 s and more
            _http_get_ok(good)
            try:
                trickled.sendall(b"x-slow-%d: y\r\n" % i)
            except OSError:
                closed = True
                break
            # The hostile client's pace: the next line after 0.25 s (a wait for the close
            # meanwhile, so the loop ends as soon as the server closes it).
            if closed_within(trickled, 0.25):
                closed = True
                break
        assert closed, "a trickled request head was never closed"
        assert closed_within(silent, 10.0), "a silent socket was never closed"
        _http_get_ok(good)  # answered throughout (never idle for 2 s)
    finally:
        for s in (silent, trickled):
            s.close()
        good.close()
    assert httpx.get(f"http://127.0.0.1:{ports.http}/v1/kv/k1", timeout=5).content == b"v1"
    assert ports.metric("mercury_http_connections_closed_total", reason="idle") >= 2


def test_http_oversized_request_heads_get_431_others_keep_being_served(
    store: Store, start_reads: StartReads
) -> None:
    """A request head past `--http-max-header-bytes` is answered 431 and closed, whole or
    never ended (without the bounds the first was answered and the second read on for
    ever), while a keep-alive client is answered before, between and after."""
    store.apply([Op(SET, b"k1", b"v1", "t")])
    ports = start_reads("--http-max-header-bytes", "8192")
    pad = b"x-pad: " + b"a" * 1000 + b"\r\n"
    good = http.client.HTTPConnection("127.0.0.1", ports.http, timeout=5)
    try:
        _http_get_ok(good)
        # A whole head of ~12 KiB, sent at once: read whole, so the 431 is never lost to a
        # reset (there is nothing unread when the server closes).
        with socket.create_connection(("127.0.0.1", ports.http), 5) as big:
            big.sendall(b"GET /v1/kv/k1 HTTP/1.1\r\nHost: r\r\n" + pad * 12 + b"\r\n")
            got = recv_until(big, b"\r\n\r\n", 10.0)
            assert got.startswith(b"HTTP/1.1 431 "), got[:80]
            assert closed_within(big, 10.0)
        _http_get_ok(good)
        # A head that never ends: closed (a 431 first, or a reset that beat it), never read
        # on for ever.
        with socket.create_connection(("127.0.0.1", ports.http), 5) as endless:
            # up to 4 MiB of head, never ended
            closed, got = endless_head(
                endless, b"GET /v1/kv/k1 HTTP/1.1\r\nHost: r\r\n", pad * 64, 64
            )
            assert closed, "an endless request head was read on for ever"
            assert got == b"" or got.startswith(b"HTTP/1.1 431 "), got[:80]
        _http_get_ok(good)
    finally:
        good.close()
    assert ports.metric("mercury_http_connections_closed_total", reason="header_too_large") >= 2


def _mc_stats(port: int) -> dict[bytes, bytes]:
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        s.sendall(b"stats\r\n")
        lines = recv_until(s, b"END\r\n").split(b"\r\n")
    return {p[1]: p[2] for p in (ln.split(b" ") for ln in lines) if p[0] == b"STAT"}


def _get_counts(ports: Ports, listener: str) -> tuple[int, int, int]:
    """(gets, hits, misses) as the listener reports them: memcached `stats`, KT `report`."""
    if listener == "memcached":
        st = _mc_stats(ports.mc)
        return int(st[b"cmd_get"]), int(st[b"get_hits"]), int(st[b"get_misses"])
    got = httpx.get(f"http://127.0.0.1:{ports.kt}/rpc/report", timeout=5)
    rep = kt.decode_tsv_response(got.content, got.headers["content-type"])
    gets, misses = int(rep[b"cnt_get"]), int(rep[b"cnt_get_misses"])
    return gets, gets - misses, misses


def _multi_get(listener: str, names: list[bytes]) -> bytes:
    if listener == "memcached":
        return b"get " + b" ".join(names) + b"\r\n"
    parts = [struct.pack(">BII", kt.MAGIC_GET_BULK, 0, len(names))]
    parts += [struct.pack(">HI", 0, len(k)) + k for k in names]
    return b"".join(parts)


@pytest.mark.parametrize("listener", ["memcached", "kt"])
def test_a_cut_streamed_reply_counts_no_hits_a_whole_one_counts_them(
    store: Store, start_reads: StartReads, listener: str
) -> None:
    """A streamed reply's hits were counted from its first pass, before it was sent: a
    reply cut because a value went between the passes still counted every hit. Counted
    now is what was answered: nothing for the cut reply, everything for a whole one."""
    store.apply([Op(SET, b"big", b"b" * BIG, "t"), Op(SET, b"last", b"l" * BIG, "t")])
    ports = start_reads("--listener-write-timeout-s", "60")
    port = ports.mc if listener == "memcached" else ports.kt
    # ~20 MB of values before `last`: far more than the transport and socket buffers
    # hold, so the reply stalls long before `last` is read again
    names = [b"big"] * 100 + [b"last"]
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    with s:
        s.sendall(_multi_get(listener, names))
        wait_until(
            lambda: ports.metric("mercury_listener_write_queued_bytes", listener=listener),
            10,
            "the reply stalled",
        )
        store.apply([Op(DELETE, b"last", b"", "t")])  # gone between the passes
        got = 0
        s.settimeout(30)
        try:
            while chunk := s.recv(1 << 20):
                got += len(chunk)
        except ConnectionResetError:
            pass  # dropped: a cut reply must not pass for a whole one
    assert got < 101 * BIG
    assert ports.metric("mercury_read_errors_total", op=listener, reason="gone") == 1
    assert _get_counts(ports, listener) == (0, 0, 0)

    # A streamed reply the client takes whole is counted: 10 hits and a miss.
    names = [b"big"] * 10 + [b"nope"]
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.settimeout(30)
        s.sendall(_multi_get(listener, names))
        if listener == "memcached":
            values = _mc_values(recv_until(s, b"END\r\n", 30.0))
        else:
            values = _kt_values(s)
    assert len(values) == 10
    assert _get_counts(ports, listener) == (11, 10, 1)
