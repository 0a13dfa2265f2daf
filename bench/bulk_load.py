"""Bulk load durable at ack: a Mercury root against Redis `appendfsync always`, one run.

Each server runs on one CPU (`--server-cpu`, `taskset`), the client on another
(`--client-cpu`): one asyncio client in this process, the same for both, sending requests
built before the clock starts (so its own cost per pair is a memcpy, not a JSON encoder) over
`--conns` connections with one request in flight each. A request carries `--per-request`
pairs of new keys in ascending order and `--value-bytes` values:

- Mercury: `POST /v1/batch` (JSON `{"ops": [{"op": "set", "key", "value"}, ...]}`), a real
  `mercury root` with its default 500 ms window; 200 means committed with fsync.
- Redis: one `MSET` of the same pairs (RESP), `appendonly yes`, `appendfsync always` (Redis 7
  writes and fsyncs its AOF before it sends the replies of an event-loop pass), no RDB saves.
- raw py-lmdb (the limit: what the store's own library does with the pairs and no server):
  a child on the server CPU putting the same pairs sorted, in append mode, in transactions of
  the root's measured mean batch size, fsync at each commit.

`--trees .,../other-checkout` also runs a root from each other checkout (its own modules and
compiled extensions, this interpreter), named `mercury@<dir>`, in the same rounds: a
before/after ratio measured side by side.

Rounds interleave the systems (each keeps its store and grows like the others); the figure
is the median round. Also each server's CPU seconds per 100k pairs (all threads, `procstat`)
so the ratio can be read on a machine whose load moves. Kyoto Tycoon is left out where
`ktserver` is not installed (the output says so). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

REPO = Path(__file__).resolve().parents[1]

from bench.gateway_write import (  # noqa: E402
    Conn,
    add_producer,
    batch_metrics,
    init_root,
    mean_batch,
    req,
)
from testkit.procs import free_port, mercury_cmd, wait_http, wait_port  # noqa: E402
from testkit.procstat import cpu_seconds  # noqa: E402


def keys_of(first: int, n: int) -> list[bytes]:
    """`n` ascending keys from index `first` (same bytes for every system)."""
    return [b"b/a%015d" % i for i in range(first, first + n)]


def value_of(n: int) -> bytes:
    return b"v" * n


def mercury_request(keys: list[bytes], value: bytes, token: str) -> bytes:
    v = value.decode()
    ops = ",".join(f'{{"op":"set","key":"{k.decode()}","value":"{v}"}}' for k in keys)
    return req("POST", "/v1/batch", ('{"ops":[' + ops + "]}").encode(), token, "application/json")


def redis_request(keys: list[bytes], value: bytes) -> bytes:
    parts = [b"*%d\r\n$4\r\nMSET\r\n" % (1 + 2 * len(keys))]
    vhead = b"$%d\r\n" % len(value)
    for k in keys:
        parts.append(b"$%d\r\n%s\r\n%s%s\r\n" % (len(k), k, vhead, value))
    return b"".join(parts)


class RespConn(Conn):
    """One Redis connection, one command in flight: a simple-string or error reply."""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None:
            return
        i = self.buf.find(b"\r\n")
        if i < 0:
            return
        ok = self.buf[:1] == b"+"
        del self.buf[: i + 2]
        w, self.waiter = self.waiter, None
        w.set_result(200 if ok else 500)


async def drive(port: int, requests: list[bytes], conns: int, proto: type[Conn]) -> dict[str, Any]:
    """Send every request over `conns` connections, one in flight each; seconds taken."""
    loop = asyncio.get_running_loop()
    cs = []
    for _ in range(conns):
        _, c = await loop.create_connection(proto, "127.0.0.1", port)
        cs.append(c)
    it = iter(requests)
    bad: dict[int, int] = {}

    async def run(c: Conn) -> None:
        for raw in it:
            status = await c.request(raw)
            if status != 200:
                bad[status] = bad.get(status, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(run(c) for c in cs))
    dt = time.perf_counter() - t0
    for c in cs:
        c.transport.close()
    if bad:
        raise RuntimeError(f"answers other than success: {bad}")
    return {"seconds": dt}


def measure(
    pid: int, port: int, requests: list[bytes], conns: int, proto: type[Conn], pairs: int
) -> dict[str, Any]:
    c0 = cpu_seconds(pid)
    r = asyncio.run(drive(port, requests, conns, proto))
    cpu = cpu_seconds(pid) - c0
    return {
        "pairs_per_s": round(pairs / r["seconds"]),
        "server_cores": round(cpu / r["seconds"], 3),
        "server_cpu_s_per_100k_pairs": round(cpu * 100_000 / pairs, 4),
    }


def raw_lmdb_child(path: str, first: int, n: int, batch: int, value_bytes: int) -> None:
    """Child: put the pairs sorted in append mode, `batch` per fsync'd transaction."""
    import lmdb

    env = lmdb.open(path, map_size=64 << 30, sync=True, metasync=True, readahead=False)
    value = value_of(value_bytes)
    keys = keys_of(first, n)
    t0 = time.perf_counter()
    c0 = time.process_time()
    for i in range(0, n, batch):
        with env.begin(write=True) as txn:
            cur = txn.cursor()
            for k in keys[i : i + batch]:
                cur.put(k, value, append=True)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    env.close()
    print(json.dumps({"seconds": dt, "cpu": cpu}))


def raw_lmdb(
    tmp: Path, cpu: int, first: int, n: int, batch: int, value_bytes: int
) -> dict[str, Any]:
    argv = ["taskset", "-c", str(cpu), sys.executable, __file__, "--raw-lmdb-child"]
    argv += [str(tmp / "raw"), str(first), str(n), str(batch), str(value_bytes)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    r = json.loads(out.stdout)
    return {
        "pairs_per_s": round(n / r["seconds"]),
        "server_cores": round(r["cpu"] / r["seconds"], 3),
        "server_cpu_s_per_100k_pairs": round(r["cpu"] * 100_000 / n, 4),
        "txn_pairs": batch,
    }


def redis_server(tmp: Path, cpu: int) -> tuple[Any, int]:
    port = free_port()
    d = tmp / "redis"
    d.mkdir()
    argv = ["taskset", "-c", str(cpu), "redis-server", "--bind", "127.0.0.1", "--port", str(port)]
    argv += ["--dir", str(d), "--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    argv += ["--protected-mode", "no", "--logfile", str(d / "redis.log")]
    p = subprocess.Popen(argv, start_new_session=True)
    wait_port(port, timeout=30, proc=p)
    return p, port


@contextlib.contextmanager
def root_process(tree: Path, data: Path, cpu: int, extra: list[str], log: Path) -> Iterator[Any]:
    """A `mercury root` of checkout `tree` on CPU `cpu`: (process, port); stopped on exit."""
    port = free_port()
    argv = [
        "taskset", "-c", str(cpu),
        *mercury_cmd(
            "root", str(data), "--listen", f"127.0.0.1:{port}",
            "--repl-listen", f"127.0.0.1:{free_port()}", "--log-level", "warning", *extra,
        ),
    ]  # fmt: skip
    with open(log, "ab") as out:
        p = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=tree, start_new_session=True
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=p)
        pin(p.pid, cpu)
        yield p, port
    finally:
        p.terminate()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def stop(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    p.wait(30)


def pin(pid: int, cpu: int) -> None:
    """Pin every thread of `pid` (a server already started) to `cpu`."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        subprocess.run(["taskset", "-pc", str(cpu), tid], capture_output=True, check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=300_000, help="pairs per system and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--per-request", type=int, default=1000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--systems", default="mercury,redis,raw-lmdb")
    ap.add_argument("--root-args", default="", help="more `mercury root` flags, space-separated")
    ap.add_argument("--trees", default=".", help="checkouts whose roots to run, comma-separated")
    ap.add_argument("--quick", action="store_true", help="60k pairs, one round (a smoke run)")
    ap.add_argument("--raw-lmdb-child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.raw_lmdb_child:
        path, first, n, batch, vb = args.raw_lmdb_child
        raw_lmdb_child(path, int(first), int(n), int(batch), int(vb))
        return
    if args.quick:
        args.pairs, args.rounds = 60_000, 1
    systems = args.systems.split(",")
    if "redis" in systems and shutil.which("redis-server") is None:
        systems.remove("redis")
    os.sched_setaffinity(0, {args.client_cpu})
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    value = value_of(args.value_bytes)
    n_req = args.pairs // args.per_request
    pairs = n_req * args.per_request
    out: dict[str, Any] = {
        "settings": {**{k: v for k, v in vars(args).items() if k != "raw_lmdb_child"}},
        "systems": systems,
        "not_measured": {}
        if shutil.which("ktserver")
        else {"kyoto_tycoon": "ktserver not installed"},
        "load_average_start": os.getloadavg(),
    }
    if "redis" not in systems and "redis" in args.systems:
        out["not_measured"]["redis"] = "redis-server not installed"
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    names = ["mercury" if t == REPO else f"mercury@{t.name}" for t in trees]
    if "mercury" not in systems:
        names, trees = [], []
    order = [*names, *(s for s in systems if s != "mercury")]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in order}
    with tempfile.TemporaryDirectory(prefix="mercury-bulk-") as t, contextlib.ExitStack() as stack:
        tmp = Path(t)
        roots: dict[str, tuple[Any, int, str]] = {}
        for i, (name, tree) in enumerate(zip(names, trees, strict=True)):
            data = tmp / f"mercury{i}"
            admin = init_root(data)
            extra = args.root_args.split()
            p, port = stack.enter_context(
                root_process(tree, data, args.server_cpu, extra, tmp / f"root{i}.log")
            )
            url = f"http://127.0.0.1:{port}"
            roots[name] = (p, port, add_producer(url, admin, "bench", "b/"))
        rp, rport = redis_server(tmp, args.server_cpu) if "redis" in systems else (None, 0)
        if rp is not None:
            stack.callback(stop, rp)
        for rnd in range(args.rounds):
            first = rnd * pairs
            keys = [keys_of(first + i * args.per_request, args.per_request) for i in range(n_req)]
            for name, (p, port, tok) in roots.items():
                url = f"http://127.0.0.1:{port}"
                reqs = [mercury_request(k, value, tok) for k in keys]
                before = batch_metrics(url)
                r = measure(p.pid, port, reqs, args.conns, Conn, pairs)
                r["mean_batch_pairs"] = mean_batch(before, batch_metrics(url))
                runs[name].append(r)
                del reqs
            if rp is not None:
                reqs = [redis_request(k, value) for k in keys]
                runs["redis"].append(measure(rp.pid, rport, reqs, args.conns, RespConn, pairs))
                del reqs
            del keys
            if "raw-lmdb" in systems:
                batch = runs["mercury"][-1]["mean_batch_pairs"] if runs.get("mercury") else 10_000
                runs["raw-lmdb"].append(
                    raw_lmdb(tmp, args.server_cpu, first, pairs, batch, args.value_bytes)
                )
    out["load_average_end"] = os.getloadavg()
    out["rounds"] = runs
    med = {s: statistics.median(r["pairs_per_s"] for r in rs) for s, rs in runs.items() if rs}
    cpu = {
        s: statistics.median(r["server_cpu_s_per_100k_pairs"] for r in rs)
        for s, rs in runs.items()
        if rs
    }
    out["median_pairs_per_s"] = med
    out["median_server_cpu_s_per_100k_pairs"] = cpu
    ratios: dict[str, Any] = {}
    for name in names:
        for other in ("redis", "raw-lmdb", *(n for n in names if n != name and name == "mercury")):
            if name in med and other in med:
                ratios[f"{name}_vs_{other}"] = round(med[name] / med[other], 3)
                ratios[f"{name}_vs_{other}_cpu_per_pair"] = round(cpu[name] / cpu[other], 3)
                # paired per round: the machine's load moves between rounds, less within one
                ratios[f"{name}_vs_{other}_per_round"] = [
                    round(a["pairs_per_s"] / b["pairs_per_s"], 3)
                    for a, b in zip(runs[name], runs[other], strict=True)
                ]
    out["ratios"] = ratios
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
