"""What a TLS layer costs a keep-alive request/reply, without Mercury (prints JSON).

One pinned client (CPU 0, a blocking socket, TLS through Python's `ssl`) sends a 40-byte
request and reads a 140-byte reply, `--requests` times, from a server pinned to CPU 1:
uvloop's transport with its memory-BIO TLS layer (what the root's HTTPS and the
replication links run on), `reads/tlsconn.py`'s readiness-driven TLS transport on uvloop
(a replica's HTTPS; its plaintext row is uvloop's plain transport again) and a blocking
`ssl` socket (the floor: OpenSSL's own per-call cost), each in plaintext and over TLS 1.3
with a per-run CA (`trustme`), interleaved over `--rounds`. P50 of the round trip per
server and mode, and the TLS/plaintext ratios: what `bench/tls.py`'s point-read ratio
sits on.

Usage: .venv/bin/python bench/tls_echo.py [--requests N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import ssl
import statistics
import time
from typing import Any

import trustme

REQ = b"GET /v1/kv/cfg/a HTTP/1.1\r\nHost: x\r\n\r\n"
RESP = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 100


def _server(kind: str, tls: bool, pem: tuple[bytes, bytes], q: Any) -> None:
    os.sched_setaffinity(0, {1 % os.cpu_count()})  # type: ignore[operator]
    ctx = None
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert, key = pem
        with open("/tmp/.tls_echo.pem", "wb") as f:
            f.write(cert + key)
        ctx.load_cert_chain("/tmp/.tls_echo.pem")
    if kind == "blocking":
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen()
        q.put(ls.getsockname()[1])
        c, _ = ls.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s = ctx.wrap_socket(c, server_side=True) if ctx else c
        while s.recv(65536):
            s.sendall(RESP)
        return
    import uvloop

    class Echo(asyncio.Protocol):
        def connection_made(self, t: Any) -> None:
            self.t = t

        def data_received(self, d: bytes) -> None:
            self.t.write(RESP)

    loop = uvloop.new_event_loop()
    if kind == "tlsconn" and ctx is not None:
        from reads.tlsconn import TlsServer

        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen()
        TlsServer(loop, Echo, ls, ctx, 10.0)
        q.put(ls.getsockname()[1])
        loop.run_forever()
        return
    srv: Any = loop.run_until_complete(loop.create_server(Echo, "127.0.0.1", 0, ssl=ctx))
    q.put(srv.sockets[0].getsockname()[1])
    loop.run_forever()


def _p50(port: int, cctx: ssl.SSLContext | None, n: int) -> float:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if cctx is not None:
        s = cctx.wrap_socket(s, server_hostname="127.0.0.1")
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.sendall(REQ)
        got = 0
        while got < len(RESP):
            got += len(s.recv(65536))
        ts.append(time.perf_counter() - t0)
    s.close()
    return statistics.median(ts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    pem = (b"".join(b.bytes() for b in cert.cert_chain_pems), cert.private_key_pem.bytes())
    cctx = ssl.create_default_context()
    ca.configure_trust(cctx)
    os.sched_setaffinity(0, {0})
    out: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for kind in ("uvloop", "tlsconn", "blocking"):
            for tls in (False, True):
                q: Any = mp.Queue()
                p = mp.Process(target=_server, args=(kind, tls, pem, q))
                p.start()
                port = q.get(timeout=30)
                p50 = _p50(port, cctx if tls else None, a.requests)
                p.kill()
                p.join()
                out.setdefault(f"{kind}_{'tls' if tls else 'plain'}_p50_us", []).append(p50)
    med = {k: round(statistics.median(v), 1) for k, v in out.items()}
    ratios = {
        k: round(med[f"{k}_tls_p50_us"] / med[f"{k}_plain_p50_us"], 2)
        for k in ("uvloop", "tlsconn", "blocking")
    }
    print(json.dumps({"p50_us": med, "rounds": out, "tls_over_plain": ratios}, indent=1))


if __name__ == "__main__":
    main()
