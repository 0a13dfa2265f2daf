"""What TLS costs a Mercury tree: real root and replica processes, plaintext against mutual
TLS, interleaved in one run (prints JSON).

One store of N entries (1,000-entry batches of V random bytes each, so the log's snappy
compression hides nothing) is served by a real `mercury root` (uvloop, as deployed), in
each round once without and once with `--tls-cert/--tls-key/--tls-ca` (the order
alternates between rounds, so a change in the machine's load hits both modes alike).
Each run measures:

1. wire stream: a raw client (this process) sends HELLO from seq 0 with a stop seq at the
   head and reads every RECORD frame until END: entries/s, and the root's CPU seconds for
   it (steadier than wall time on a shared machine);
2. wire snapshot: HELLO in snapshot mode, the offer and the whole file read: MB/s (the
   second download, which reuses the snapshot the first made), and the root's CPU seconds;
3. bootstrap: a fresh `mercury replica` of the root, seconds from its start until its
   applied seq is the head (snapshot made on the root, sent, installed);
4. catch-up: that replica is stopped, M entries are written on the root (`/v1/batch`,
   1,000 per batch), and the replica is started again: entries/s it applies from its
   first new seq to the head (its start is not in the window), and seconds from its start;
5. propagation: W single-key PUTs on the root, each followed by GETs on the replica until
   the key is there: P50/P99 milliseconds from the PUT's acknowledgement;
6. point reads: K GETs of one key on the replica over one keep-alive connection
   (`http.client`, a light client, so the server's share shows): P50/P99 microseconds,
   and the replica's CPU microseconds per read. Over TLS, the same reads also go to a
   second replica whose HTTPS runs on the event loop's own (memory-BIO) TLS layer instead
   of `net/tlsconn.py` (`MERCURY_HTTPS_LOOP_TLS=1`), in alternating order by round:
   the `*_loop_tls` figures, the A/B of the transport.

Ratios are TLS over plaintext of the same round (for latencies: TLS / plaintext, lower is
better), with their spread across rounds. Bounded: N entries, R rounds, W writes, K reads.

`--record-entries E` sets the entries per log record of the store (1,000: large
records; a few: what single-key writes make).

Usage: .venv/bin/python bench/tls.py [--entries N] [--value-bytes V] [--rounds R]
       [--record-entries E] [--catch-up M] [--writes W] [--reads K]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from net import certs
from net.tlsconf import TlsFiles, client_context
from replicator import frames
from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs, free_port, run_mercury
from testkit.procstat import cpu_seconds

#: The key every point read asks for (and a replica's readiness check).
READ_PATH = "/v1/kv/k000000001"
MODES = ("plaintext", "mutual_tls")


def _recv_exact(s: socket.socket, n: int, buf: bytearray) -> memoryview:
    """`n` bytes from `s` into `buf` (grown as needed), read in large chunks."""
    if len(buf) < n:
        buf.extend(bytes(n - len(buf)))
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        k = s.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("closed early")
        got += k
    return view


def _connect(port: int, ctx: ssl.SSLContext | None) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", port), 10)
    raw.settimeout(60)
    return ctx.wrap_socket(raw) if ctx else raw


def wire_stream(port: int, db_id: bytes, head: int, ctx: ssl.SSLContext | None) -> float:
    """Entries/s of a raw stream read from seq 0 to `head`."""
    hello = frames.Hello(
        frames.PROTOCOL_VERSION, frames.MODE_STREAM, 0, uuid.uuid4().bytes, db_id,
        0, head, 0, frames.ZERO_SHA,
    )  # fmt: skip
    buf = bytearray()
    t0 = time.perf_counter()
    with _connect(port, ctx) as s:
        s.sendall(frames.encode_hello(hello))
        while True:
            h = frames.decode_header(bytes(_recv_exact(s, frames.HEADER_SIZE, buf)))
            _recv_exact(s, h.length, buf)
            if h.type == frames.END:
                break
    return head / (time.perf_counter() - t0)


def wire_snapshot(port: int, ctx: ssl.SSLContext | None) -> float:
    """MB/s of a raw snapshot download (the file's bytes, after the offer)."""
    hello = frames.Hello(
        frames.PROTOCOL_VERSION, frames.MODE_SNAPSHOT, 0, uuid.uuid4().bytes, frames.ZERO_ID,
        0, 0, 0, frames.ZERO_SHA,
    )  # fmt: skip
    buf = bytearray()
    with _connect(port, ctx) as s:
        s.sendall(frames.encode_hello(hello))
        while True:
            h = frames.decode_header(bytes(_recv_exact(s, frames.HEADER_SIZE, buf)))
            body = bytes(_recv_exact(s, h.length, buf))
            if h.type == frames.SNAPSHOT:
                offer = frames.decode_snapshot(body)
                break
        t0 = time.perf_counter()  # the copy itself is made before the offer; time the bytes
        left = offer.size
        chunk = bytearray(4 << 20)
        view = memoryview(chunk)
        while left:
            k = s.recv_into(view, min(len(chunk), left))
            if not k:
                raise ConnectionError("closed early")
            left -= k
    return offer.size / (time.perf_counter() - t0) / 1e6


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Tree:
    """A root (and later a replica) of one mode, stopped by PID."""

    def __init__(self, procs: Procs, d: Path, mode: str, root_dir: Path) -> None:
        self.procs, self.d, self.mode = procs, d, mode
        self.tls = mode == "mutual_tls"
        self.scheme = "https" if self.tls else "http"
        self.verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(d / "certs" / "ca.crt")) if self.tls else False
        )
        self.http, self.repl = free_port(), free_port()
        self.root = procs.start_mercury(
            "root", str(root_dir), "--listen", f"127.0.0.1:{self.http}",
            "--repl-listen", f"127.0.0.1:{self.repl}", "--batch-window-ms", "2",
            *self._tls("root"), name=f"root-{mode}",
        )  # fmt: skip
        self.url = f"{self.scheme}://127.0.0.1:{self.http}"
        self._wait(f"{self.url}/healthz", self.root)
        self.replica: Any = None
        self.loop_replica: Any = None

    def _tls(self, node: str) -> list[str]:
        if not self.tls:
            return []
        c = self.d / "certs"
        return [
            "--tls-cert", str(c / f"{node}.crt"), "--tls-key", str(c / f"{node}.key"),
            "--tls-ca", str(c / "ca.crt"),
        ]  # fmt: skip

    def _wait(self, url: str, proc: Any, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{url}: process exited with {proc.returncode}")
            try:
                if httpx.get(url, verify=self.verify, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(url)

    def _token(self) -> str:
        admin = (self.d / "root" / "admin.token").read_text().strip()
        h = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(verify=self.verify, timeout=10) as c:
            c.put(f"{self.url}/v1/admin/producers/bench", json={"keyspaces": ["p/"]}, headers=h)
            r = c.post(f"{self.url}/v1/admin/producers/bench/tokens", headers=h)
            return str(r.json()["token"])

    def head(self) -> int:
        r = httpx.get(f"{self.url}/v1/status", verify=self.verify, timeout=10)
        return int(r.json()["seq"])

    def start_replica(self, fresh: bool) -> float:
        rdir = self.d / f"replica-{self.mode}"
        if fresh:
            shutil.rmtree(rdir, ignore_errors=True)
            self.rhttp = free_port()
        self.replica = self.procs.start_mercury(
            "replica", str(rdir), "--source", f"127.0.0.1:{self.repl}",
            "--listen", f"127.0.0.1:{self.rhttp}", *self._tls("replica"),
            name=f"replica-{self.mode}",
        )  # fmt: skip
        self.rurl = f"{self.scheme}://127.0.0.1:{self.rhttp}"
        return time.perf_counter()

    def follow(self, t0: float, since: int, head: int) -> dict[str, float]:
        """Poll the replica's applied seq until `head`: entries/s from the first seq past
        `since` to `head`, and seconds from `t0`."""
        first: tuple[float, int] | None = None
        with httpx.Client(verify=self.verify, timeout=5) as c:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                if self.replica.poll() is not None:
                    raise RuntimeError("the replica exited")
                try:
                    seq = int(c.get(f"{self.rurl}/v1/status").json()["seq"])
                except (httpx.HTTPError, ValueError, KeyError):
                    seq = 0
                now = time.perf_counter()
                if seq > since and first is None:
                    first = (now, seq)
                if seq >= head:
                    assert first is not None
                    window = now - first[0]
                    rate = (head - first[1]) / window if window > 0 else float("nan")
                    return {"entries_per_s": rate, "seconds_from_start": now - t0}
                time.sleep(0.02)
        raise TimeoutError("the replica did not catch up")

    def bootstrap(self) -> float:
        """Seconds for a fresh replica to reach the root's head."""
        head = self.head()
        t0 = self.start_replica(fresh=True)
        return self.follow(t0, 0, head)["seconds_from_start"]

    def catch_up(self, entries: int, value_bytes: int) -> dict[str, float]:
        """Stop the replica, write `entries` on the root, restart it: its catch-up."""
        self.procs.terminate(self.replica, timeout=60)
        since = self.head()
        tok = {"Authorization": f"Bearer {self._token()}"}
        tag = uuid.uuid4().hex[:8]
        with httpx.Client(verify=self.verify, timeout=60) as c:
            for b in range(0, entries, 1000):
                ops = [
                    {
                        "op": "set",
                        "key": f"p/{tag}/{i:09d}",
                        "value_b64": base64.b64encode(os.urandom(value_bytes)).decode(),
                    }
                    for i in range(b, min(entries, b + 1000))
                ]
                c.post(f"{self.url}/v1/batch", json={"ops": ops}, headers=tok).raise_for_status()
        head = self.head()
        t0 = self.start_replica(fresh=False)
        return self.follow(t0, since, head)

    def propagation(self, writes: int) -> list[float]:
        """Milliseconds from each PUT's acknowledgement to the key read on the replica."""
        tok = self._token()
        out = []
        tag = uuid.uuid4().hex[:8]
        with (
            httpx.Client(verify=self.verify, timeout=10) as w,
            httpx.Client(verify=self.verify, timeout=10) as r,
        ):
            for i in range(writes):
                key = f"p/{tag}/{i}"
                resp = w.put(
                    f"{self.url}/v1/kv/{key}",
                    content=b"v",
                    headers={"Authorization": f"Bearer {tok}"},
                )
                resp.raise_for_status()
                t0 = time.perf_counter()
                deadline = t0 + 10
                while r.get(f"{self.rurl}/v1/kv/{key}").status_code != 200:
                    if time.perf_counter() > deadline:
                        raise TimeoutError(key)
                out.append((time.perf_counter() - t0) * 1e3)
        return out

    def start_loop_tls_replica(self) -> tuple[Any, int]:
        """A second replica of the root whose HTTPS runs on the event loop's own TLS layer
        (`MERCURY_HTTPS_LOOP_TLS=1`) instead of `net/tlsconn.py`, once it serves: the
        A/B of the point reads. Stopped with the tree."""
        rdir = self.d / f"replica-{self.mode}-loop"
        shutil.rmtree(rdir, ignore_errors=True)
        port = free_port()
        os.environ["MERCURY_HTTPS_LOOP_TLS"] = "1"
        try:
            self.loop_replica = self.procs.start_mercury(
                "replica", str(rdir), "--source", f"127.0.0.1:{self.repl}",
                "--listen", f"127.0.0.1:{port}", *self._tls("replica"),
                name=f"replica-{self.mode}-loop",
            )  # fmt: skip
        finally:
            del os.environ["MERCURY_HTTPS_LOOP_TLS"]
        self._wait(f"{self.scheme}://127.0.0.1:{port}{READ_PATH}", self.loop_replica, 600)
        # Caught up, so that no applying runs beside its reads.
        head = self.head()
        deadline = time.monotonic() + 600
        with httpx.Client(verify=self.verify, timeout=5) as c:
            while int(c.get(f"{self.scheme}://127.0.0.1:{port}/v1/status").json()["seq"]) < head:
                if time.monotonic() > deadline:
                    raise TimeoutError("the loop-TLS replica did not catch up")
                time.sleep(0.05)
        return self.loop_replica, port

    def point_reads(
        self, reads: int, other: tuple[Any, int] | None = None
    ) -> tuple[list[float], float]:
        """Microseconds of `reads` GETs over one keep-alive connection (`http.client`: a
        light client, so the server's share of each read shows), and the replica's CPU
        microseconds per read; `other`: (process, port) of another replica to read from."""
        proc, port = other if other is not None else (self.replica, self.rhttp)
        out = []
        conn: http.client.HTTPConnection
        if isinstance(self.verify, ssl.SSLContext):
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=self.verify)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", port)
        try:
            c0 = cpu_seconds(proc.pid)
            for _ in range(reads):
                t0 = time.perf_counter()
                conn.request("GET", READ_PATH)
                resp = conn.getresponse()
                resp.read()
                out.append((time.perf_counter() - t0) * 1e6)
                assert resp.status == 200
            cpu_us = (cpu_seconds(proc.pid) - c0) / reads * 1e6
        finally:
            conn.close()
        return out, cpu_us

    def stop(self) -> None:
        for p in (self.loop_replica, self.replica, self.root):
            if p is not None:
                self.procs.terminate(p, timeout=60)


def one_run(
    tree: Tree, d: Path, head: int, db_id: bytes, args: argparse.Namespace, rnd: int
) -> dict[str, float]:
    ctx = None
    if tree.tls:
        c = d / "certs"
        ctx = client_context(
            TlsFiles(str(c / "client.crt"), str(c / "client.key"), str(c / "ca.crt"))
        )
    out: dict[str, float] = {}
    c0 = cpu_seconds(tree.root.pid)
    out["wire_stream_entries_per_s"] = wire_stream(tree.repl, db_id, head, ctx)
    out["wire_stream_root_cpu_s"] = cpu_seconds(tree.root.pid) - c0
    wire_snapshot(tree.repl, ctx)  # makes the snapshot
    c0 = cpu_seconds(tree.root.pid)
    out["wire_snapshot_MB_per_s"] = wire_snapshot(tree.repl, ctx)
    out["wire_snapshot_root_cpu_s"] = cpu_seconds(tree.root.pid) - c0
    out["bootstrap_seconds"] = tree.bootstrap()
    cu = tree.catch_up(args.catch_up, args.value_bytes)
    out["catch_up_entries_per_s"] = cu["entries_per_s"]
    out["catch_up_seconds_from_start"] = cu["seconds_from_start"]
    prop = tree.propagation(args.writes)
    out["propagation_p50_ms"] = _pct(prop, 0.5)
    out["propagation_p99_ms"] = _pct(prop, 0.99)
    loop = tree.start_loop_tls_replica() if tree.tls else None
    passes: dict[str, tuple[list[float], float]] = {}
    # Over TLS, the same reads on the loop's TLS layer, in alternating order by round.
    order = ["", "_loop_tls"] if rnd % 2 == 0 else ["_loop_tls", ""]
    for suffix in order:
        if suffix == "" or loop is not None:
            passes[suffix] = tree.point_reads(args.reads, loop if suffix else None)
    for suffix, (reads, cpu_us) in passes.items():
        out[f"read_p50_us{suffix}"] = _pct(reads, 0.5)
        out[f"read_p99_us{suffix}"] = _pct(reads, 0.99)
        out[f"read_replica_cpu_us{suffix}"] = cpu_us
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=300_000)
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record-entries", type=int, default=1000)
    ap.add_argument("--catch-up", type=int, default=100_000)
    ap.add_argument("--writes", type=int, default=200)
    ap.add_argument("--reads", type=int, default=1000)
    args = ap.parse_args()
    # SIGTERM ends the run through the `finally`s below, which stop every process by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        certs.ensure(d / "certs", {"root": "root", "replica": "replica", "client": "replica"})
        root_dir = d / "root"
        r = run_mercury("init", str(root_dir))
        assert r.returncode == 0, r.stderr
        store = Store.open(str(root_dir), sync=False)
        try:
            step = args.record_entries
            for b in range(0, args.entries, step):
                n = min(step, args.entries - b)
                store.apply(
                    [
                        Op(SET, f"k{i:09d}".encode(), os.urandom(args.value_bytes), owner="b")
                        for i in range(b, b + n)
                    ]
                )
            db_id = uuid.UUID(store.db_id).bytes
        finally:
            store.close()
        (d / "logs").mkdir()
        procs = Procs(d / "logs")
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        try:
            for rnd in range(args.rounds):
                for mode in MODES if rnd % 2 == 0 else MODES[::-1]:
                    tree = Tree(procs, d, mode, root_dir)
                    try:
                        runs[mode].append(one_run(tree, d, tree.head(), db_id, args, rnd))
                    finally:
                        tree.stop()
                    print(f"round {rnd + 1} {mode}: {json.dumps(runs[mode][-1])}", file=sys.stderr)
        finally:
            procs.stop_all()
    out: dict[str, Any] = {
        "entries": args.entries,
        "value_bytes": args.value_bytes,
        "rounds": args.rounds,
        "runs": {m: [{k: round(v, 3) for k, v in x.items()} for x in runs[m]] for m in MODES},
    }
    ratios: dict[str, Any] = {}
    for key in runs["plaintext"][0]:
        per = [
            t[key] / p[key] if p[key] else float("nan")  # a CPU reading below one tick
            for p, t in zip(runs["plaintext"], runs["mutual_tls"], strict=True)
        ]
        ratios[key] = {
            "median": round(statistics.median(per), 2),
            "min": round(min(per), 2),
            "max": round(max(per), 2),
        }
    # The point reads over TLS on the loop's own TLS layer (the A/B of net/tlsconn.py),
    # over the same round's plaintext reads.
    for key in ("read_p50_us", "read_p99_us", "read_replica_cpu_us"):
        pairs = zip(runs["plaintext"], runs["mutual_tls"], strict=True)
        per = [t[f"{key}_loop_tls"] / p[key] for p, t in pairs]
        ratios[f"{key}_loop_tls"] = {
            "median": round(statistics.median(per), 2),
            "min": round(min(per), 2),
            "max": round(max(per), 2),
        }
    out["tls_over_plaintext"] = ratios
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
