"""A replica's HTTPS reads on the readiness-driven TLS transport (`net/tlsconn.py`), with
real processes, sockets and a CA made per test run: keep-alive and pipelined point gets,
a request body of many TLS records, a multi-megabyte value to a client that reads it late,
clients that stall in the handshake or speak plaintext or garbage dropped (and counted)
while others are served, SIGHUP rotating the certificate of new connections while an
open one keeps reading, and the same on every reader process of `--read-workers`."""

from __future__ import annotations

import http.client
import io
import os
import re
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from net.tlsconf import TlsContexts, TlsFiles
from store.ops import SET, Op
from testkit.procs import Procs, free_port
from testkit.replication import RootNode, wait_for
from tests.reads.test_read_workers import _readers
from tests.security.test_tls import (
    Pki,
    _der,
    https,
    peer_cert,
    pki,  # noqa: F401 - the fixture
    start_tls_replica,
    tls_flags,
    wait_https,
)

BIG = bytes(range(256)) * (12 << 10)  # 3 MiB


class Replica:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, files: TlsFiles) -> None:
        self.proc, self.port, self.files = proc, port, files
        self.ctx = ssl.create_default_context(cafile=files.ca)
        self.ctx.check_hostname = False

    def connect(self) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), 5)
        raw.settimeout(10)
        return self.ctx.wrap_socket(raw, server_hostname="127.0.0.1")


@pytest.fixture
def replica(tmp_path: Path, procs: Procs, pki: Pki) -> Iterator[Replica]:  # noqa: F811
    root = RootNode(str(tmp_path / "root"), tls=TlsContexts(pki.issue("root")))
    try:
        root.write(100)
        root.store.apply([Op(SET, b"big", BIG, owner="t")])
        files = pki.issue("replica")
        p, port, _ = start_tls_replica(procs, tmp_path / "r", root.port, files, "r", repl=False)
        wait_https(f"https://127.0.0.1:{port}/healthz", files, p)
        seq = root.store.last_seq()
        with https(files) as c:
            wait_for(
                lambda: c.get(f"https://127.0.0.1:{port}/v1/status").json()["seq"] >= seq,
                60,
                "the replica caught up",
            )
        yield Replica(p, port, files)
    finally:
        root.close()


def read_response(f: io.BufferedReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response (content-length framed) from a buffered reader."""
    status = int(f.readline().split()[1])
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = f.read(length)
    return status, body


def get(key: str) -> bytes:
    return f"GET /v1/kv/{key} HTTP/1.1\r\nHost: r\r\n\r\n".encode()


def test_https_point_gets_keep_alive_pipelined_and_large(replica: Replica) -> None:
    # Keep-alive: one connection, many requests (the fast path and the parser alike).
    conn = http.client.HTTPSConnection("127.0.0.1", replica.port, context=replica.ctx, timeout=10)
    try:
        conn.connect()
        first = conn.sock
        for i in range(200):
            key = f"k{i % 100:08d}"
            conn.request("GET", f"/v1/kv/{key}")
            resp = conn.getresponse()
            assert resp.status == 200
            assert resp.read() == f"v{i % 100}-0".encode()
        conn.request("GET", "/v1/kv/nope")
        missing = conn.getresponse()
        assert missing.status == 404
        missing.read()
        assert conn.sock is first
    finally:
        conn.close()
    # A request body of many TLS records (a large get_bulk): read on until it is whole.
    keys = [f"k{i % 100:08d}" for i in range(5000)] + [f"absent-{i:06d}" for i in range(3000)]
    with https(replica.files) as c:
        got = c.post(f"https://127.0.0.1:{replica.port}/v1/get_bulk", json={"keys": keys})
        assert got.status_code == 200
        values = got.json()["values"]
        assert values["k00000042"] == "v42-0" and values["absent-000007"] is None
        assert len(values) == 100 + 3000
        # A streamed reply (NDJSON range, chunked, written as the ASGI app produces it).
        with c.stream(
            "GET",
            f"https://127.0.0.1:{replica.port}/v1/range?prefix=k",
            headers={"Accept": "application/x-ndjson"},
        ) as r:
            assert r.status_code == 200
            lines = [ln for ln in r.iter_lines() if ln]
        assert len(lines) == 100 and '"k00000099"' in lines[-1]
    # Pipelined: three requests in one write, three answers in order.
    with replica.connect() as s:
        s.sendall(get("k00000001") + get("k00000002") + get("k00000003"))
        f = s.makefile("rb")
        assert [read_response(f) for _ in range(3)] == [
            (200, b"v1-0"),
            (200, b"v2-0"),
            (200, b"v3-0"),
        ]
    # A 3 MiB value to a client that reads nothing for a second: the socket takes part of
    # it, the transport keeps the rest and sends it as the client reads.
    with replica.connect() as s:
        s.sendall(get("big"))
        # Deliberate: the client not reading is the case under test. A server slow to
        # answer only shortens the pause it sees; the answer must be whole either way.
        time.sleep(1.0)
        f = s.makefile("rb")
        assert read_response(f) == (200, BIG)
        s.sendall(get("k00000004"))  # and the connection goes on
        assert read_response(f) == (200, b"v4-0")


def _counted(text: str, reason: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'mercury_tls_handshake_failed_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_stalled_plaintext_and_garbage_clients_are_dropped_while_others_are_served(
    replica: Replica,
) -> None:
    addr = ("127.0.0.1", replica.port)
    silent = socket.create_connection(addr, 5)
    partial = socket.create_connection(addr, 5)
    partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
    plain = socket.create_connection(addr, 5)
    plain.sendall(b"GET /v1/kv/k00000001 HTTP/1.1\r\nHost: r\r\n\r\n")
    garbage = socket.create_connection(addr, 5)
    garbage.sendall(os.urandom(4096))
    t0 = time.monotonic()
    with https(replica.files) as c:
        for _ in range(20):  # served meanwhile
            got = c.get(f"https://127.0.0.1:{replica.port}/v1/kv/k00000009")
            assert got.status_code == 200 and got.content == b"v9-0"
    # Plaintext and garbage are dropped at once; the two stalled ones by the handshake
    # timeout (10 s). None of them ever gets a byte of HTTP.
    for s in (plain, garbage, silent, partial):
        s.settimeout(30)
        try:
            rest = s.recv(4096)
        except ConnectionResetError:
            rest = b""
        assert b"HTTP/" not in rest
        s.close()
    assert time.monotonic() - t0 < 40
    with https(replica.files) as c:
        metrics = c.get(f"https://127.0.0.1:{replica.port}/metrics").text
        assert _counted(metrics, "timeout") == 2
        assert _counted(metrics, "plaintext") >= 1
        assert c.get(f"https://127.0.0.1:{replica.port}/healthz").status_code == 200
    # Plain HTTP on the HTTPS port gets no HTTP answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{replica.port}/healthz", timeout=3)
    assert replica.proc.poll() is None


def test_sighup_rotates_the_https_certificate_for_new_connections(
    replica: Replica,
    pki: Pki,  # noqa: F811
) -> None:
    files = replica.files
    before = peer_cert(replica.port, files.ca)
    assert before == _der(files.cert)
    with replica.connect() as old:
        old.sendall(get("k00000005"))
        f = old.makefile("rb")
        assert read_response(f) == (200, b"v5-0")
        new = pki.issue("replica-next")
        os.replace(new.cert, files.cert)
        os.replace(new.key, files.key)
        os.kill(replica.proc.pid, signal.SIGHUP)
        wait_for(lambda: peer_cert(replica.port, files.ca) != before, 20, "new certificate")
        assert peer_cert(replica.port, files.ca) == _der(files.cert)
        # The connection opened before keeps reading with its session.
        old.sendall(get("k00000006"))
        assert read_response(f) == (200, b"v6-0")
    with https(files) as c:
        assert c.get(f"https://127.0.0.1:{replica.port}/v1/kv/k00000007").content == b"v7-0"
    assert replica.proc.poll() is None


def test_every_reader_serves_https_and_takes_the_rotation(
    tmp_path: Path,
    procs: Procs,
    pki: Pki,  # noqa: F811
) -> None:
    """`--read-workers 2`: the reader processes share the port, each on its own TLS
    listener; after SIGHUP to the replica, every new connection, whichever reader takes
    it, gets the new certificate."""
    root = RootNode(str(tmp_path / "root"), tls=TlsContexts(pki.issue("root")))
    try:
        root.write(10)
        files = pki.issue("replica")
        port = free_port()
        p = procs.start_mercury(
            "replica", str(tmp_path / "r"), "--listen", f"127.0.0.1:{port}",
            "--source", f"127.0.0.1:{root.port}", "--read-workers", "2", *tls_flags(files),
            name="r",
        )  # fmt: skip
        wait_https(f"https://127.0.0.1:{port}/healthz", files, p)
        with https(files) as c:
            wait_for(
                lambda: c.get(f"https://127.0.0.1:{port}/v1/kv/k00000009").status_code == 200,
                60,
                "the replica serves",
            )
        wait_for(lambda: len(_readers(p.pid)) == 1, 60, "reader 1 started")
        ctx = ssl.create_default_context(cafile=files.ca)
        url = f"https://127.0.0.1:{port}"

        def per_worker() -> dict[str, float]:
            text = httpx.get(f"{url}/metrics", verify=ctx, timeout=10).text
            pat = r'mercury_read_seconds_count\{op="http_get",worker="(\d+)"\} ([0-9.e+]+)'
            return {w: float(v) for w, v in re.findall(pat, text)}

        def both_serve(since: dict[str, float]) -> bool:
            for _ in range(10):  # new connections: the kernel spreads them over the readers
                got = httpx.get(f"{url}/v1/kv/k00000003", verify=ctx, timeout=10)
                assert got.content == b"v3-0"
            counts = per_worker()
            return all(counts.get(w, 0) > since.get(w, 0) for w in ("0", "1"))

        wait_for(lambda: both_serve({}), 60, "both readers served HTTPS")
        served = per_worker()
        before = _der(files.cert)
        new = pki.issue("replica-next")
        os.replace(new.cert, files.cert)
        os.replace(new.key, files.key)
        os.kill(p.pid, signal.SIGHUP)
        after = _der(files.cert)
        assert after != before

        def rotated() -> bool:
            return all(peer_cert(port, files.ca) == after for _ in range(20))

        wait_for(rotated, 30, "every reader presents the new certificate")
        wait_for(lambda: both_serve(served), 60, "both readers serve after the rotation")
        assert p.poll() is None
    finally:
        root.close()
