"""Every listener of a root and a replica gets garbage, a TLS ClientHello and an HTTP
request (real processes, real sockets); every process keeps serving afterwards."""

from __future__ import annotations

import contextlib
import random
import socket
import ssl
import uuid
from pathlib import Path

import httpx

from replicator import frames
from testkit.procs import Procs, free_port, run_mercury, wait_http, wait_port
from testkit.replication import status, wait_for
from tests.replicator.nodes import start_replica


def _tls_client_hello() -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="mercury.test")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _payloads() -> dict[str, bytes]:
    rng = random.Random(7)
    return {
        "garbage": bytes(rng.randrange(256) for _ in range(4096)),
        "garbage-binary-magic": b"\xba" + bytes(rng.randrange(256) for _ in range(512)),
        "tls": _tls_client_hello(),
        "http": b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    }


def _hit(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        s.settimeout(2.0)
        try:
            s.sendall(data)
            s.recv(65536)  # whatever comes back, if anything, before we give up
        except OSError:
            pass


def _welcomed(port: int) -> bool:
    hello = frames.Hello(
        frames.PROTOCOL_VERSION, frames.MODE_STREAM, frames.OPT_NEWEST_ONLY,
        uuid.uuid4().bytes, frames.ZERO_ID, 0, 0, 0, frames.ZERO_SHA,
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        s.settimeout(5)
        s.sendall(frames.encode_hello(hello))
        head = s.recv(frames.HEADER_SIZE)
    # A refusal (db id unknown to this client) is an answer too: the port still serves.
    return len(head) >= 1 and head[0] in (frames.WELCOME, frames.REFUSE)


def test_every_port_survives_garbage_tls_and_http(tmp_path: Path, procs: Procs) -> None:
    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    gw, repl, root_kt = free_port(), free_port(), free_port()
    root = procs.start_mercury(
        "root", str(data), "--listen", f"127.0.0.1:{gw}", "--repl-listen", f"127.0.0.1:{repl}",
        "--kt-listen", f"127.0.0.1:{root_kt}", name="root",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
    wait_port(root_kt, proc=root)
    kt, mc = free_port(), free_port()
    r = start_replica(
        procs, tmp_path / "r1", [repl], "--kt-listen", f"127.0.0.1:{kt}",
        "--memcached-listen", f"127.0.0.1:{mc}", name="r1",
    )  # fmt: skip
    wait_port(kt, proc=r.proc)
    wait_port(mc, proc=r.proc)
    wait_for(lambda: status(r.http)["replication_state"] == "streaming", 30, "streaming")
    ports = {
        "root replication": repl,
        "root kt": root_kt,
        "replica replication": r.repl,
        "replica kt": kt,
        "replica memcached": mc,
    }
    for port in ports.values():
        for payload in _payloads().values():
            _hit(port, payload)
    assert root.poll() is None and r.proc.poll() is None
    assert httpx.get(f"http://127.0.0.1:{gw}/healthz", timeout=5).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{r.http}/healthz", timeout=5).status_code == 200
    assert _welcomed(repl) and _welcomed(r.repl)
    with socket.create_connection(("127.0.0.1", mc), 5) as s:
        s.sendall(b"version\r\n")
        assert s.recv(100).startswith(b"VERSION")
    for port in (kt, root_kt):
        got = httpx.post(f"http://127.0.0.1:{port}/rpc/void", timeout=5)
        assert got.status_code == 200
    assert status(r.http)["replication_state"] == "streaming"
