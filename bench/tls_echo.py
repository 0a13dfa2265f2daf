"""What a TLS layer costs a keep-alive request/reply, without Mercury (prints JSON).

One pinned client (CPU 0, a blocking socket, TLS through Python's `ssl`) sends a 40-byte
request and reads a 140-byte reply, `--requests` times, from a server pinned to CPU 1:
uvloop's transport with its memory-BIO TLS layer (what the root's HTTPS and the
replication links run on), `net/tlsconn.py`'s readiness-driven TLS transport on uvloop
(a replica's HTTPS; its plaintext row is uvloop's plain transport again), a blocking `ssl`
socket (Python's floor) and a blocking C server on the same OpenSSL
(`bench/tls_echo_server.c`, compiled here with `cc -O2 -lssl -lcrypto`; skipped, and said
so, when it does not build): OpenSSL's own cost with no Python in the server. Each in
plaintext and over TLS 1.3 with a per-run CA (`trustme`), interleaved over `--rounds`.
P50 of the round trip and the server's CPU per request (`/proc`, user + system) per
server and mode, and the TLS/plaintext ratios of both: what `bench/tls.py`'s point-read
ratio sits on.

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trustme

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.procstat import cpu_seconds

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
        from net.tlsconn import TlsServer

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


KINDS = ("uvloop", "tlsconn", "blocking", "c")
C_SERVER = Path(__file__).resolve().parent / "tls_echo_server.c"


def _build_c(tmp: Path) -> str | None:
    """Compile the C echo server into `tmp`; None (with the reason on stderr) when it does
    not build (no compiler or no OpenSSL headers)."""
    out = tmp / "tls_echo_server"
    r = subprocess.run(
        ["cc", "-O2", "-o", str(out), str(C_SERVER), "-lssl", "-lcrypto"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        print(f"C server skipped: {r.stderr.strip()[:300]}", file=sys.stderr)
        return None
    return str(out)


def _start_c(binary: str, tls: bool, pem_path: str) -> tuple[subprocess.Popen[str], int]:
    """The C server pinned to CPU 1, on a port the kernel picks, once it listens."""
    args = [binary, "0", str(len(RESP)), *([pem_path] if tls else [])]
    p = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {1 % (os.cpu_count() or 1)}),
    )
    assert p.stdout is not None
    word, _, port = p.stdout.readline().partition(" ")
    if word != "ready":
        p.kill()
        p.wait()
        raise RuntimeError("the C echo server did not start")
    return p, int(port)


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
    cpu: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        binary = _build_c(Path(tmp))
        pem_path = str(Path(tmp) / "server.pem")
        Path(pem_path).write_bytes(pem[0] + pem[1])
        kinds = [k for k in KINDS if k != "c" or binary is not None]
        for _ in range(a.rounds):
            for kind in kinds:
                for tls in (False, True):
                    mode = f"{kind}_{'tls' if tls else 'plain'}"
                    if kind == "c":
                        assert binary is not None
                        proc, port = _start_c(binary, tls, pem_path)
                        pid = proc.pid
                    else:
                        q: Any = mp.Queue()
                        mproc = mp.Process(target=_server, args=(kind, tls, pem, q))
                        mproc.start()
                        port = q.get(timeout=30)
                        pid = mproc.pid or 0
                    c0 = cpu_seconds(pid)
                    p50 = _p50(port, cctx if tls else None, a.requests)
                    c1 = cpu_seconds(pid)
                    if kind == "c":
                        proc.wait(timeout=30)  # it exits when the client closes
                    else:
                        mproc.kill()
                        mproc.join()
                    out.setdefault(f"{mode}_p50_us", []).append(p50)
                    cpu.setdefault(f"{mode}_server_cpu_us", []).append((c1 - c0) / a.requests * 1e6)
    med = {k: round(statistics.median(v), 1) for k, v in out.items()}
    cpu_med = {k: round(statistics.median(v), 1) for k, v in cpu.items()}
    ratios = {k: round(med[f"{k}_tls_p50_us"] / med[f"{k}_plain_p50_us"], 2) for k in kinds}
    cpu_ratios = {
        k: round(cpu_med[f"{k}_tls_server_cpu_us"] / cpu_med[f"{k}_plain_server_cpu_us"], 2)
        for k in kinds
        if cpu_med[f"{k}_plain_server_cpu_us"] > 0
    }
    cpu_added = {
        k: round(cpu_med[f"{k}_tls_server_cpu_us"] - cpu_med[f"{k}_plain_server_cpu_us"], 1)
        for k in kinds
    }
    print(
        json.dumps(
            {
                "p50_us": med,
                "server_cpu_us_per_request": cpu_med,
                "rounds": {**out, **{k: [round(x, 1) for x in v] for k, v in cpu.items()}},
                "tls_over_plain": ratios,
                "server_cpu_tls_over_plain": cpu_ratios,
                "server_cpu_us_added_by_tls": cpu_added,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
