"""One client must never stall or exhaust the root: idle sockets, trickled headers and
stalled bodies are closed after their timeouts, a connection cap evicts idle sockets before
it locks a producer out, and the open batch is bounded (async writers get an honest 503).

Real root processes and sockets; every loop bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.errors import RequestTimeoutError
from net.asgibody import read_body
from testkit import metrics
from testkit.procs import Procs
from tests.gateway.conftest import Root, make_root


def _metric(root: Root, name: str, **labels: str) -> float:
    return metrics.value(root.client().get("/metrics").text, name, **labels)


def _closed_by_peer(s: socket.socket, within_s: float) -> bool:
    """Whether the root closes `s` (EOF or reset) within `within_s` seconds."""
    s.settimeout(within_s)
    try:
        s.recv(1024)  # an idle socket gets nothing but its EOF
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


@pytest.fixture
def bounded_root(tmp_path: Path, procs: Procs) -> Iterator[Root]:
    r = make_root(
        procs,
        tmp_path / "data",
        "--http-idle-timeout",
        "2",
        "--http-max-connections",
        "100",
    )
    yield r
    r.close_clients()


def _recv_head(s: socket.socket) -> bytes:
    """An answer's head (through its blank line), as it comes on `s` (10 s at most)."""
    s.settimeout(10)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        assert chunk, f"closed before an answer's head: {got!r}"
        got += chunk
    return got


def _connect_many(url: str, n: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        socks.append(socket.create_connection((host, int(port)), timeout=5))
    return socks


def test_idle_sockets_neither_lock_out_a_producer_nor_stay_open(bounded_root: Root) -> None:
    root = bounded_root
    name, tok = root.producer()
    # Three times the cap of sockets that never send a byte.
    idle = _connect_many(root.url, 300)
    try:
        c = root.client(tok)
        r = c.put(f"/v1/kv/{name}/still-writes", content=b"v")
        assert r.status_code == 200, r.text
        assert c.get(f"/v1/kv/{name}/still-writes").content == b"v"
        assert _metric(root, "mercury_http_connections_closed_total", reason="evicted") >= 100
        assert _metric(root, "mercury_http_connections") <= 101
        # The survivors are closed after the idle timeout (2 s), well before 15 s.
        deadline = time.monotonic() + 15
        still_open = 0
        for s in idle:
            left = max(0.05, deadline - time.monotonic())
            if not _closed_by_peer(s, left):
                still_open += 1
        assert still_open == 0
    finally:
        for s in idle:
            s.close()


def test_a_trickled_request_head_is_closed_at_the_deadline(bounded_root: Root) -> None:
    """Bytes arriving every half second do not move the deadline for a complete head."""
    (s,) = _connect_many(bounded_root.url, 1)
    closed = False
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        for i in range(30):  # a header line every 0.5 s at most (the client's pace): 15 s
            try:
                s.sendall(f"x-slow-{i}: y\r\n".encode())
            except OSError:
                closed = True
                break
            with contextlib.suppress(TimeoutError):
                s.settimeout(0.5)
                if s.recv(1024) == b"":
                    closed = True
                    break
    finally:
        s.close()
    assert closed
    assert _metric(bounded_root, "mercury_http_connections_closed_total", reason="idle") >= 1


def test_an_oversized_request_head_is_refused_431(bounded_root: Root) -> None:
    (s,) = _connect_many(bounded_root.url, 1)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nx-big: " + b"a" * (100 << 10))
        s.settimeout(5)
        got = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(4096):
                got += chunk
        assert got.startswith(b"HTTP/1.1 431"), got[:80]
        # A clear answer, like every other refusal: a problem+json naming the bound.
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"content-type: application/problem+json" in head.lower(), head
        doc = json.loads(body)
        assert doc["status"] == 431 and doc["title"] == "Request Header Fields Too Large"
        assert str(64 << 10) in doc["detail"] and "--http-max-header-bytes" in doc["hint"]
    finally:
        s.close()


def _reply(s: socket.socket, within_s: float = 10.0) -> bytes:
    """Everything `s` receives until the root closes it."""
    s.settimeout(within_s)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            got += chunk
    return got


@pytest.mark.parametrize("size", [70 << 10, 100 << 10, 1 << 20])
def test_an_oversized_head_in_one_segment_is_refused_431(bounded_root: Root, size: int) -> None:
    """A head that arrives whole in one write was parsed and served (200): only heads
    arriving in pieces were counted."""
    (s,) = _connect_many(bounded_root.url, 1)
    with s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nx-big: " + b"a" * size + b"\r\n\r\n")
        got = _reply(s)
    assert got.startswith(b"HTTP/1.1 431"), got[:80]
    # a large but allowed head is still served
    (s,) = _connect_many(bounded_root.url, 1)
    with s:
        s.sendall(
            b"GET /healthz HTTP/1.1\r\nConnection: close\r\nx-ok: " + b"a" * 30_000 + b"\r\n\r\n"
        )
        assert _reply(s).startswith(b"HTTP/1.1 200")


def test_a_malformed_request_behind_a_put_does_not_hide_its_answer(bounded_root: Root) -> None:
    """A PUT and a malformed request in one segment: uvicorn answered only 400 and closed,
    while the PUT was committed; the client, told its write failed, was lied to."""
    name, tok = bounded_root.producer()
    auth = f"Authorization: Bearer {tok}\r\n"
    # pipelined: a PUT and a GET before the garbage; each answer comes, then the 400
    (s,) = _connect_many(bounded_root.url, 1)
    with s:
        two = (
            f"PUT /v1/kv/{name}/q HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 2\r\n\r\nhi"
            f"GET /v1/kv/{name}/q HTTP/1.1\r\nHost: x\r\n{auth}\r\n"
        )
        s.sendall(two.encode() + b"GARBAGE\r\n\r\n")
        got = _reply(s)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", got) == [b"200", b"200", b"400"], got[:900]
    for i, garbage in enumerate((b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")):
        (s,) = _connect_many(bounded_root.url, 1)
        with s:
            put = (
                f"PUT /v1/kv/{name}/p{i} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tok}\r\n"
                "Content-Length: 5\r\n\r\nhello"
            )
            s.sendall(put.encode() + garbage)
            got = _reply(s)
        statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", got)
        assert statuses == [b"200", b"400"], got[:600]
        assert bounded_root.client(tok).get(f"/v1/kv/{name}/p{i}").content == b"hello"


def test_a_pipelined_head_behind_a_stream_is_bounded(bounded_root: Root) -> None:
    """During an answer still being sent (a watch stream), a second request head streamed
    without end was buffered without bound (200 MiB: +224 MB RSS): it is refused at the
    head bound."""
    name, tok = bounded_root.producer()
    (s,) = _connect_many(bounded_root.url, 1)
    with s:
        s.sendall(
            f"GET /v1/watch?prefix={name}/ HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {tok}\r\n\r\n".encode()
        )
        assert _recv_head(s).startswith(b"HTTP/1.1 200 ")  # the stream is open
        s.sendall(b"GET /healthz HTTP/1.1\r\nx-big: ")
        sent = 0
        closed = False
        with contextlib.suppress(OSError):
            while sent < (8 << 20):  # the bound is 64 KiB: well before 8 MiB
                s.sendall(b"a" * 65536)
                sent += 65536
        closed = sent < (8 << 20) or _closed_by_peer(s, 10)
        assert closed, f"still open after {sent} bytes of one head"
    assert (
        _metric(bounded_root, "mercury_http_connections_closed_total", reason="header_too_large")
        >= 1
    )


def test_dribbled_bodies_at_the_cap_do_not_lock_out_a_producer(
    tmp_path: Path, procs: Procs
) -> None:
    """Every connection held by a PUT whose body arrives a byte every few seconds (the
    408 comes only after a 30 s gap): a producer got resets for as long as it lasted.
    At the cap the body stalled longest is evicted instead."""
    root = make_root(procs, tmp_path / "data", "--http-max-connections", "10")
    try:
        name, tok = root.producer()
        held = _connect_many(root.url, 10)
        try:
            for i, h in enumerate(held):
                h.sendall(
                    f"PUT /v1/kv/{name}/slow{i} HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {tok}\r\nContent-Length: 100\r\n\r\nx".encode()
                )
            # The hostile clients' stall: past the stall bound (5 s) with nothing more sent.
            time.sleep(6.5)
            for h in held[:2]:  # two keep dribbling: they are not the stalled longest
                h.sendall(b"x")
            r = root.client(tok).put(f"/v1/kv/{name}/good", content=b"v")
            assert r.status_code == 200, r.text
        finally:
            for h in held:
                h.close()
        assert _metric(root, "mercury_http_connections_closed_total", reason="evicted") >= 1
        assert root.client(tok).get(f"/v1/kv/{name}/slow0").status_code == 404
    finally:
        root.close_clients()


def test_a_stalled_body_is_answered_408() -> None:
    """The body reader gives up on a client that stops sending mid-body."""

    async def main() -> None:
        sent = [{"type": "http.request", "body": b"abc", "more_body": True}]

        async def receive() -> dict[str, Any]:
            if sent:
                return sent.pop()
            await asyncio.sleep(60)  # the client never sends the rest
            raise AssertionError("not reached")

        # (had it waited for the rest, the receive would fail the test instead)
        with pytest.raises(RequestTimeoutError, match="after 3 bytes"):
            await read_body(receive, None, 1 << 20, "body", idle_timeout_s=0.2)

    asyncio.run(main())


def test_a_stalled_body_on_a_real_root_frees_the_connection(bounded_root: Root) -> None:
    """A PUT whose body never completes: the root answers 408 (30 s body timeout) or closes
    the connection; either way a producer keeps writing meanwhile."""
    name, tok = bounded_root.producer()
    (s,) = _connect_many(bounded_root.url, 1)
    try:
        s.sendall(
            f"PUT /v1/kv/{name}/stall HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tok}\r\n"
            "Content-Length: 1000\r\n\r\nabc".encode()
        )
        c = bounded_root.client(tok)
        assert c.put(f"/v1/kv/{name}/other", content=b"v").status_code == 200
    finally:
        s.close()


def test_async_writers_at_full_speed_never_grow_a_batch_past_its_bounds(
    tmp_path: Path, procs: Procs
) -> None:
    """Async writes answer 202 before their commit, so nothing paced them: the open batch
    grew while a commit ran (one 269 MB log record, over the replication frame limit).
    Every committed log record must hold at most `--batch-max-ops` ops (requests of 100
    ops, a batch of 250), and a writer beyond what the root can hold gets 503 +
    Retry-After, never a lost write."""
    from concurrent.futures import ThreadPoolExecutor

    from store.store import Store

    root = make_root(
        procs,
        tmp_path / "data",
        "--batch-max-ops",
        "250",
        "--batch-max-bytes",
        "400000",
        window_ms=200,
    )
    name, tok = root.producer()

    def body(w: int, n: int) -> dict[str, Any]:  # fresh keys: nothing coalesces
        return {
            "ops": [
                {"op": "set", "key": f"{name}/{w}/{n}/{i}", "value": "v" * 1000} for i in range(100)
            ]
        }

    stop_at = time.monotonic() + 4.0

    def writer(w: int) -> tuple[int, int, bool]:
        c = root.client(tok)
        ok = refused = 0
        retry_after = True
        for n in range(2000):  # bounded in count and in time
            if time.monotonic() > stop_at:
                break
            r = c.post("/v1/batch?async=true", json=body(w, n))
            if r.status_code == 202:
                ok += 1
            else:
                assert r.status_code == 503, r.text
                refused += 1
                retry_after = retry_after and "retry-after" in r.headers
        return ok, refused, retry_after

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(writer, range(6)))
    assert sum(o[0] for o in outcomes) > 0
    assert all(o[2] for o in outcomes)
    root.close_clients()
    procs.terminate(root.proc)  # SIGTERM: the open batch is committed first
    with Store.open(str(root.data_dir)) as store:
        seq, biggest, records = 1, 0, 0
        while seq <= store.last_seq():
            recs = store.read_log(seq, max_records=100)
            for rec in recs:
                biggest = max(biggest, rec.num_entries)
                records += 1
            seq = recs[-1].last_seq + 1
    assert records > 0
    assert biggest <= 250, f"a log record of {biggest} ops (limit 250)"


# --- batch bodies: structure checked while decoding, memory within ~3x the body -----------


def _peak_while(fn: Any) -> tuple[int, BaseException | None]:
    """Peak bytes Python allocated while `fn()` ran, and what it raised."""
    import tracemalloc

    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    err: BaseException | None = None
    try:
        fn()
    except Exception as e:  # the refusal under test
        err = e
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak, err


def _hostile_bodies() -> list[tuple[str, bytes, str | None]]:
    import msgpack

    n = 1 << 20  # a million empty containers (4 MiB bodies; the red team sent 40-90 MiB)
    return [
        ("msgpack ops of empty maps", msgpack.packb({"ops": [{}] * n}), "application/msgpack"),
        ("msgpack array of empty maps", msgpack.packb([{}] * n), "application/msgpack"),
        (
            "msgpack nested arrays",
            msgpack.packb({"ops": [[[]] * 8] * (n // 8)}),
            "application/msgpack",
        ),
        ("json ops of empty objects", b'{"ops":[' + b",".join([b"{}"] * n) + b"]}", None),
        ("json array of empty objects", b"[" + b",".join([b"{}"] * n) + b"]", None),
        ("json nested arrays", b'{"ops":[' + b",".join([b"[[]]"] * n) + b"]}", None),
        ("json deep nesting", b"[" * 200_000 + b"]" * 200_000, None),
        ("msgpack deep nesting", b"\x91" * 200_000 + b"\x90", "application/msgpack"),
    ]


@pytest.mark.parametrize("label,body,ctype", _hostile_bodies(), ids=lambda x: str(x)[:30])
def test_hostile_batch_bodies_are_refused_within_three_times_their_size(
    label: str, body: bytes, ctype: str | None
) -> None:
    from core.errors import BadRequestError, TooLargeError
    from gateway.bodies import batch_body_ops

    def decode() -> None:
        batch_body_ops(body, ctype, "p", max_ops=10_000, max_key=500, max_value=25 << 20)

    peak, err = _peak_while(decode)
    assert isinstance(err, (BadRequestError, TooLargeError)), (label, err)
    assert peak <= 3 * len(body), f"{label}: {peak} bytes for a {len(body)}-byte body"


def test_a_big_honest_body_decodes_within_three_times_its_size() -> None:
    import msgpack
    import orjson

    from gateway.bodies import batch_body_ops

    ops = [{"op": "set", "key": f"k{i}", "value": "v" * 4000} for i in range(5000)]
    # key_b64 is a shape the compiled JSON decoder leaves to the reference path
    odd = [{"op": "set", "key_b64": "YQ==", "value": "v" * 4000} for _ in range(5000)]
    for body, ctype in (
        (msgpack.packb({"ops": ops}), "application/msgpack"),
        (b'{"ops":' + orjson.dumps(ops) + b"}", None),
        (b'{"ops":' + orjson.dumps(odd) + b"}", None),
    ):
        out: list[Any] = []
        peak, err = _peak_while(
            lambda b=body, c=ctype, o=out: o.append(
                batch_body_ops(b, c, "p", max_ops=10_000, max_key=500, max_value=25 << 20)
            )
        )
        assert err is None
        assert len(out[0][0]) == 5000
        assert peak <= 3 * len(body), f"{peak} bytes for a {len(body)}-byte body"


def test_a_writer_is_held_while_the_batches_are_full_then_admitted(tmp_path: Path) -> None:
    """The open batch and the one queued behind the running commit are full: a writer is
    held (not refused) until a commit makes room, and with no commit in time it gets 503
    with Retry-After."""
    from core.errors import OverloadedError
    from gateway.batcher import Batcher
    from store.ops import SET, Op
    from store.store import Store

    def ops(tag: str) -> list[Op]:
        return [Op(SET, f"{tag}/{i}".encode(), b"v", "p") for i in range(10)]

    async def main(store: Store) -> None:
        # A hold limit no run reaches: a writer let in must owe it to a commit's room.
        b = Batcher(store, window_s=0.3, max_ops=10, max_bytes=1 << 20, hold_s=3600.0)
        b.start()
        try:
            f1 = b.submit(ops("a"), 20, "p")  # the open batch, full: sealed...
            f2 = b.submit(ops("b"), 20, "p")  # ...behind it in the queue, or open
            f3 = None
            if b.has_room(10, 20, "p"):
                f3 = b.submit(ops("c"), 20, "p")
            assert not b.has_room(10, 20, "p")
            with pytest.raises(OverloadedError) as err:
                b.submit(ops("d"), 20, "p")
            assert err.value.fields["headers"]["Retry-After"]
            # held until a commit took a batch (bounded: never the hold limit's hour)
            await asyncio.wait_for(b.wait_room(10, 20, "p"), 60)
            assert b.has_room(10, 20, "p")
            f4 = b.submit(ops("d"), 20, "p")
            for f in (f1, f2, f3, f4):
                if f is not None:
                    assert len(await f) == 10
        finally:
            await b.close()

    with Store.create(str(tmp_path / "s"), sync=False) as store:
        asyncio.run(main(store))
        assert store.get(b"d/9") is not None


def test_the_largest_log_record_fits_one_replication_frame() -> None:
    """What the store may write (and the batcher may build) a replica always accepts."""
    from gateway.batcher import log_bytes
    from replicator import frames
    from store.format import LOG_HEADER, MAX_LOG_PAYLOAD, MAX_LOG_RECORD

    assert frames.MAX_BODY_OF[frames.RECORD] >= MAX_LOG_RECORD
    # snappy's worst case for the largest payload the batcher admits
    assert LOG_HEADER.size + 32 + MAX_LOG_PAYLOAD + MAX_LOG_PAYLOAD // 6 <= MAX_LOG_RECORD
    # a request of the gateway's largest body (100 MiB) and op count (10,000) fits alone
    assert log_bytes(10_000, 100 << 20, "x" * 255) <= MAX_LOG_PAYLOAD
