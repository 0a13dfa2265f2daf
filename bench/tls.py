"""What mutual TLS costs on a replication link (prints JSON).

A store of N entries (1,000-entry batches of V random bytes each) is served by a
`ReplicationSource` twice — plaintext and mutual TLS (a CA and two certificates made with
trustme) — and read by a raw client on a blocking socket in this process:

1. stream: HELLO from seq 0 with a stop seq at the head, every RECORD frame read until
   END; entries/s and MB/s of frame bytes;
2. snapshot: HELLO in snapshot mode, the offer and the whole file read; MB/s.

Both sides run in one process (the source on an asyncio loop in a thread, the client in
the main thread), so the figures compare the two modes on the same machine, not absolute
capacity. Bounded: N entries and one pass per mode.

Usage: .venv/bin/python bench/tls.py [--entries N] [--value-bytes V]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trustme

from core.tlsconf import TlsContexts, TlsFiles
from replicator import frames
from store.ops import SET, Op
from tests.replicator.harness import RootNode


def _files(d: Path, ca: trustme.CA, name: str) -> TlsFiles:
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    return TlsFiles(str(cert), str(key), str(d / "ca.crt"))


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("closed early")
        buf += chunk
    return bytes(buf)


def _connect(port: int, ctx: ssl.SSLContext | None) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", port), 10)
    raw.settimeout(60)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1") if ctx else raw


def stream(port: int, db_id: bytes, head: int, ctx: ssl.SSLContext | None) -> dict[str, Any]:
    hello = frames.Hello(
        frames.PROTOCOL_VERSION, frames.MODE_STREAM, 0, uuid.uuid4().bytes, db_id,
        0, head, 0, frames.ZERO_SHA,
    )  # fmt: skip
    t0 = time.perf_counter()
    got = 0
    with _connect(port, ctx) as s:
        s.sendall(frames.encode_hello(hello))
        while True:
            h = frames.decode_header(_recv_exact(s, frames.HEADER_SIZE))
            _recv_exact(s, h.length)
            got += frames.HEADER_SIZE + h.length
            if h.type == frames.END:
                break
    dt = time.perf_counter() - t0
    mbs = round(got / dt / 1e6, 1)
    return {"seconds": round(dt, 3), "entries_per_s": round(head / dt), "MB_per_s": mbs}


def snapshot(port: int, ctx: ssl.SSLContext | None) -> dict[str, Any]:
    hello = frames.Hello(
        frames.PROTOCOL_VERSION, frames.MODE_SNAPSHOT, 0, uuid.uuid4().bytes, frames.ZERO_ID,
        0, 0, 0, frames.ZERO_SHA,
    )  # fmt: skip
    with _connect(port, ctx) as s:
        s.sendall(frames.encode_hello(hello))
        while True:
            h = frames.decode_header(_recv_exact(s, frames.HEADER_SIZE))
            body = _recv_exact(s, h.length)
            if h.type == frames.SNAPSHOT:
                offer = frames.decode_snapshot(body)
                break
        t0 = time.perf_counter()  # the copy itself is made before the offer; time the bytes
        _recv_exact(s, offer.size)
        dt = time.perf_counter() - t0
    mbs = round(offer.size / dt / 1e6, 1)
    return {"bytes": offer.size, "seconds": round(dt, 3), "MB_per_s": mbs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--value-bytes", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(d / "ca.crt"))
        server, client = _files(d, ca, "source"), _files(d, ca, "client")
        client_ctx = TlsContexts(client).client
        out: dict[str, Any] = {"entries": args.entries, "value_bytes": args.value_bytes}
        root = RootNode(str(d / "plain"), map_size=8 << 30)
        try:
            for b in range(0, args.entries, 1000):
                n = min(1000, args.entries - b)
                root.store.apply(
                    [
                        # Random values: the log's snappy compression must not hide the bytes.
                        Op(SET, f"k{i:09d}".encode(), os.urandom(args.value_bytes), owner="b")
                        for i in range(b, b + n)
                    ]
                )
            head = root.store.last_seq()
            db_id = uuid.UUID(root.store.db_id).bytes
            out["plaintext"] = {
                "stream": stream(root.port, db_id, head, None),
                "snapshot": snapshot(root.port, None),
            }
        finally:
            root.close()
        tls_root = RootNode(str(d / "plain"), reopen=True, tls=TlsContexts(server))
        try:
            out["mutual_tls"] = {
                "stream": stream(tls_root.port, db_id, head, client_ctx),
                "snapshot": snapshot(tls_root.port, client_ctx),
            }
        finally:
            tls_root.close()
        p, t = out["plaintext"], out["mutual_tls"]
        out["tls_vs_plain"] = {
            "stream": round(t["stream"]["entries_per_s"] / p["stream"]["entries_per_s"], 2),
            "snapshot": round(t["snapshot"]["MB_per_s"] / p["snapshot"]["MB_per_s"], 2),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
