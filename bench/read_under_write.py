"""Reads never wait for writes: the experiment that condemned Kyoto Tycoon, on Mercury.

One reader, one keep-alive connection per protocol, loops over 20 two-byte keys on a
replica and records per-request latency (P50/P99/P99.9/max) in three phases:

  (a) idle, (b) while the replica applies a stream of 40 kB writes from one writer,
  (c) from two writers,

over HTTP (`GET /v1/kv/{key}`) and over memcached (`get`), requests of both protocols
interleaved so each phase treats them alike. Topology (`--mode stream`, the default): a root
store with a replication source (helper process), writer processes committing one 40 kB
value per transaction to the root store (fsync on), and a real `mercury replica` serving
reads and applying the stream. `--mode local` skips replication: the writers commit to the
read server's own store (the applier-is-another-process situation without the network).

Also, in the same run: point-read P50 over HTTP beside a no-op raw ASGI endpoint answering
the same bytes on the same server (`python -m reads.serve --noop-path`), requests
alternating, and the memcached get P50.

Kyoto Tycoon's published P99 went 9 -> 154 -> 701 ms; a real KT on this kind of machine
went 0.24 -> 1.1 -> 1.9 ms with stalls up to 740 ms. Prints one JSON document.

Usage: .venv/bin/python bench/read_under_write.py [--requests N] [--mode stream|local]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from store.ops import SET, Op  # noqa: E402
from store.store import Store  # noqa: E402
from tests.support.procs import free_port, wait_http, wait_port  # noqa: E402

KEYS = [f"{i:02d}".encode() for i in range(20)]
VALUE_40K = 40 << 10


# --- helper processes ------------------------------------------------------------------


def run_source(data_dir: str, port: int) -> None:
    """Serve the root store's log to replicas until SIGTERM (the root without a gateway)."""
    from replicator.heartbeat import RootHeartbeat
    from replicator.source import ReplicationSource

    async def main() -> None:
        store = Store.open(data_dir)
        src = ReplicationSource(
            store,
            "127.0.0.1",
            port,
            node_id=uuid.uuid4().bytes,
            heartbeat=RootHeartbeat(store, 200),
        )
        await src.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await src.stop()
        store.close()

    asyncio.run(main())


def run_writer(data_dir: str, seed: int, stream: bool) -> None:
    """Commit one 40 kB value per transaction (fsync on) until SIGTERM; print the count."""
    store = Store.open(data_dir)
    if stream:
        from replicator.notify import install_pinger

        install_pinger(store)  # wake the source in the other process after each commit
    rng = random.Random(seed)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    n = 0
    t0 = time.monotonic()
    while not stop:
        key = b"w/%d/%03d" % (seed, rng.randrange(100))
        store.apply([Op(SET, key, rng.randbytes(VALUE_40K), "bench")])
        n += 1
    dt = time.monotonic() - t0
    print(json.dumps({"writes": n, "seconds": round(dt, 2)}), flush=True)
    store.close()


def children(pid: int) -> list[int]:
    """Child process ids of `pid` (Linux /proc)."""
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def last_seq(data_dir: str) -> int:
    """The store's last applied seq (opened and closed again)."""
    with Store.open(data_dir, readonly=True) as s:
        return s.last_seq()


# --- clients ----------------------------------------------------------------------------


class HttpConn:
    """One keep-alive HTTP/1.1 connection doing GETs (minimal client: the same cost for
    every phase)."""

    def __init__(self, port: int) -> None:
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def get(self, path: bytes) -> bytes:
        self.s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: bench\r\n\r\n")
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.s.recv(65536)
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        while len(rest) < length:
            rest += self.s.recv(65536)
        self.buf = rest[length:]
        return rest[:length]


class McConn:
    """One memcached text-protocol connection doing single-key gets."""

    def __init__(self, port: int) -> None:
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get(self, key: bytes) -> bytes:
        self.s.sendall(b"get " + key + b"\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            buf += self.s.recv(65536)
        if not buf.startswith(b"VALUE"):
            raise RuntimeError(buf)
        return buf


def pct(samples_ns: list[int]) -> dict[str, float]:
    """P50/P99/P99.9/max in milliseconds."""
    s = sorted(samples_ns)
    n = len(s)

    def at(q: float) -> float:
        return round(s[min(n - 1, int(q * n))] / 1e6, 4)

    return {"n": n, "p50_ms": at(0.5), "p99_ms": at(0.99), "p999_ms": at(0.999), "max_ms": at(1.0)}


def measure(http: HttpConn, mc: McConn, n: int, max_s: float) -> tuple[list[int], list[int]]:
    """Interleaved HTTP and memcached gets over the 20 keys: latencies in ns."""
    h: list[int] = []
    m: list[int] = []
    clock = time.perf_counter_ns
    paths = [b"/v1/kv/" + k for k in KEYS]
    deadline = time.monotonic() + max_s
    for i in range(n):
        j = i % 20
        t = clock()
        http.get(paths[j])
        h.append(clock() - t)
        t = clock()
        mc.get(KEYS[j])
        m.append(clock() - t)
        if i % 256 == 0 and time.monotonic() > deadline:
            break
    return h, m


def kt_binary_get_p50_us(port: int, n: int) -> float:
    """P50 of a KT binary get (get_bulk of one key, as ukt's `get` sends it), one connection."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reqs = [struct.pack(">BIIHI", 0xBA, 0, 1, 0, len(k)) + k for k in KEYS]
    lat: list[int] = []
    clock = time.perf_counter_ns
    # reply: BA, hits (u32), one record header (18 bytes), the key, the value (b"v" + key)
    want = [5 + 18 + len(k) + len(b"v" + k) for k in KEYS]
    for i in range(n + 500):
        t = clock()
        s.sendall(reqs[i % 20])
        got = s.recv(4096)
        while len(got) < want[i % 20]:
            got += s.recv(4096)
        if i >= 500:
            lat.append(clock() - t)
    s.close()
    return round(pct(lat)["p50_ms"] * 1000, 1)


def noop_vs_get(port: int, n: int) -> dict[str, float]:
    """P50 of a point get and of the raw ASGI no-op, alternating on one connection."""
    c = HttpConn(port)
    for _ in range(500):
        c.get(b"/noop")
        c.get(b"/v1/kv/00")
    get_ns: list[int] = []
    noop_ns: list[int] = []
    clock = time.perf_counter_ns
    for i in range(n):
        t = clock()
        c.get(b"/v1/kv/" + KEYS[i % 20])
        get_ns.append(clock() - t)
        t = clock()
        c.get(b"/noop")
        noop_ns.append(clock() - t)
    g, o = pct(get_ns), pct(noop_ns)
    return {
        "get_p50_us": round(g["p50_ms"] * 1000, 1),
        "noop_p50_us": round(o["p50_ms"] * 1000, 1),
        "ratio": round(g["p50_ms"] / o["p50_ms"], 3),
    }


# --- orchestration ------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="gets per protocol and phase")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="time cap per phase")
    ap.add_argument("--mode", choices=("stream", "local"), default="stream")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the three phases")
    ap.add_argument("--role", choices=("source", "writer"), help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--nice-root-side",
        type=int,
        default=19,
        help="niceness of the writer and source processes, which stand for the root machine "
        "(on a real deployment they do not share the replica's cores); 0 = same priority",
    )
    ap.add_argument(
        "--nice-applier",
        type=int,
        default=0,
        help="experiment: renice the replica's applier process (its child) by this much",
    )
    args = ap.parse_args()
    if args.role in ("source", "writer") and args.nice_root_side:
        os.nice(args.nice_root_side)
    if args.role == "source":
        run_source(args.dir, args.port)
        return 0
    if args.role == "writer":
        run_writer(args.dir, args.seed, args.mode == "stream")
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="mercury-rw-"))
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def start(argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        log.close()
        procs.append(p)
        return p

    def stop(p: subprocess.Popen[bytes]) -> None:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)

    me = [sys.executable, str(Path(__file__).resolve())]
    out: dict[str, object] = {
        "mode": args.mode,
        "cores": os.cpu_count(),
        "nice_root_side": args.nice_root_side,
        "rounds": args.rounds,
        "nice_applier": args.nice_applier,
        "load_avg_at_start": os.getloadavg(),
    }
    try:
        root_dir = str(tmp / "root")
        root = Store.create(root_dir, map_size=8 << 30)
        root.apply([Op(SET, k, b"v" + k, "bench") for k in KEYS])
        seq0 = root.last_seq()
        root.close()
        if args.mode == "stream":
            src_port = free_port()
            src = start(
                [*me, "--role", "source", "--dir", root_dir, "--port", str(src_port),
                 "--nice-root-side", str(args.nice_root_side)],
                "source",
            )  # fmt: skip
            wait_port(src_port, proc=src)
            read_dir = str(tmp / "replica")
            http_port, mc_port = free_port(), free_port()
            rep = start(
                [
                    sys.executable, "-m", "mercury", "replica", read_dir,
                    "--source", f"127.0.0.1:{src_port}",
                    "--listen", f"127.0.0.1:{http_port}",
                    "--memcached-listen", f"127.0.0.1:{mc_port}",
                ],
                "replica",
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{http_port}/healthz", timeout=60, proc=rep)
            wait_port(mc_port, proc=rep)
            if args.nice_applier:
                # the replica's applier is its child process (`replicator.worker`)
                for child in children(rep.pid):
                    os.setpriority(os.PRIO_PROCESS, child, args.nice_applier)
                out["applier_pids_reniced"] = children(rep.pid)
            deadline = time.monotonic() + 60
            while last_seq(read_dir) < seq0:
                if time.monotonic() > deadline:
                    raise TimeoutError("replica did not catch up")
                time.sleep(0.05)
        else:
            read_dir = root_dir
        # the yardstick server (and, in local mode, the measured one)
        y_http, y_mc, y_kt = free_port(), free_port(), free_port()
        ys = start(
            [
                sys.executable, "-m", "reads.serve", read_dir,
                "--listen", f"127.0.0.1:{y_http}",
                "--memcached-listen", f"127.0.0.1:{y_mc}",
                "--kt-listen", f"127.0.0.1:{y_kt}",
                "--noop-path", "/noop",
            ],
            "reads",
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{y_http}/healthz", proc=ys)
        wait_port(y_mc, proc=ys)
        if args.mode == "local":
            http_port, mc_port = y_http, y_mc

        out["http_get_vs_noop_asgi_same_server"] = noop_vs_get(y_http, min(args.requests, 20_000))
        wait_port(y_kt, proc=ys)
        out["kt_binary_get_p50_us_same_server"] = kt_binary_get_p50_us(
            y_kt, min(args.requests, 20_000)
        )
        http, mc = HttpConn(http_port), McConn(mc_port)
        measure(http, mc, 1000, 10)  # warm up
        # Phases are interleaved over rounds (0, 1, 2 writers, then again...) so that load
        # drifting on a shared machine falls on every phase alike.
        samples: dict[int, tuple[list[int], list[int]]] = {w: ([], []) for w in (0, 1, 2)}
        applied_rate: dict[int, list[float]] = {w: [] for w in (0, 1, 2)}
        per_round = max(1, args.requests // args.rounds)
        for _round in range(args.rounds):
            for writers in (0, 1, 2):
                ws = [
                    start(
                        [
                            *me,
                            "--role",
                            "writer",
                            "--dir",
                            root_dir,
                            "--seed",
                            str(i + 1),
                            "--mode",
                            args.mode,
                            "--nice-root-side",
                            str(args.nice_root_side),
                        ],
                        f"writer{i}",
                    )
                    for i in range(writers)
                ]
                time.sleep(1.0 if writers else 0.2)  # let the write stream reach steady state
                seq_before = last_seq(read_dir)
                t0 = time.monotonic()
                h, m = measure(http, mc, per_round, args.max_seconds / args.rounds)
                dt = time.monotonic() - t0
                applied_rate[writers].append((last_seq(read_dir) - seq_before) / dt)
                for w in ws:
                    stop(w)
                samples[writers][0].extend(h)
                samples[writers][1].extend(m)
        phases: dict[str, dict[str, object]] = {
            f"writers_{w}": {
                "http": pct(samples[w][0]),
                "memcached": pct(samples[w][1]),
                "applied_40kB_writes_per_s": round(sum(applied_rate[w]) / len(applied_rate[w]), 1),
            }
            for w in (0, 1, 2)
        }
        out["phases"] = phases
        for proto in ("http", "memcached"):
            idle = pct(samples[0][0 if proto == "http" else 1])["p99_ms"]
            two = pct(samples[2][0 if proto == "http" else 1])["p99_ms"]
            out[f"{proto}_p99_two_writers_over_idle"] = round(two / idle, 3)
        out["goal"] = (
            "p99 with two writers <= 1.5x idle; HTTP get p50 <= 1.3x no-op; memcached p50 <= 0.1 ms"
        )
        out["kyoto_tycoon_reference_p99_ms"] = {
            "published": [9, 154, 701],
            "this_machine": [0.24, 1.1, 1.9],
        }
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
