"""Usage series costs, each beside its baseline or goal in the same run (JSON).

- ``load``: bulk-load pairs/s through the real `Batcher` committing to a real store (fsync
  on, 5 ms window, 1,000 new ascending keys per request, 16 concurrent writers in this
  process), with the usage series on and off, in interleaved rounds (off, on, on, off…);
  the median round of each and their ratio (goal >= 0.97), each round's ratio, and the
  same in pairs per CPU second of the process (steadier on a shared machine).
- ``acks``: ack latency of single-pair PUTs paced at ``--ack-rate`` (2,000/s) through the
  real `Batcher` (fsync on) for 4 s a round, with the series on and off in interleaved
  rounds, at the gateway's default 500 ms window and at a 10 ms one: P50/P99 of each side
  and the P99 ratio (an ack waits for its batch's window and commit; the series' share of
  that is what shows).
- ``storage``: one producer-keyspace active every minute of a day (the worst case for the
  minute-slot layout): bytes its documents hold at the end of the day (names + bodies +
  the 8-byte version), and bytes the day's document rewrites carried in the log.
  Goal <= 100 kB stored per producer-keyspace per day.
- ``query``: `GET /v1/usage/series` latency on a real root over 30 days x 100 producers of
  synthetic documents (each minute active with probability ``--active``): one producer's
  30 days hourly, one producer's last 24 h by minute, and the admin's sum of every
  producer over 7 days hourly; median and max of ``--queries`` requests. Goal <= 50 ms for
  one producer.
- ``reads``: the cost of counting reads for unused-key analytics (`reads/readstats.py`) on
  the point-read path: two read servers (`python -m mercury.readserve`) over one store of 10,000
  keys, one counting reads and one not, each asked by one keep-alive connection of a raw
  HTTP/1.1 client for random keys, the two requests of each step back to back in
  alternating order; P50 of each side per round and their ratio (goal: on <= 1.03 x off).

Usage: .venv/bin/python bench/usage.py [--quick] [--rounds N] [--requests N]
       [--producers N] [--days N] [--active F] [--queries N] [--reads N] [--ack-rate R]
       [--only load,acks,storage,query,reads]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway import usage_series as us  # noqa: E402
from gateway.batcher import Batcher  # noqa: E402
from store.ops import SET, Op, Result, Status  # noqa: E402
from store.store import Store  # noqa: E402
from testkit.procs import (  # noqa: E402
    Procs,
    free_port,
    run_mercury,
    wait_http,
)

# --- load --------------------------------------------------------------------------------


async def _load_round(
    path: Path, series_on: bool, requests: int, pairs: int
) -> tuple[float, float]:
    """(pairs/s, pairs per CPU second of this process: the event loop, the commit thread
    and the in-process writers; less sensitive than wall time to other load)."""
    store = Store.create(str(path))
    b = Batcher(store, window_s=0.005, max_ops=16_000, max_bytes=16 << 20, max_queued=2)
    if series_on:
        b.series = us.for_store(store, lambda _p: ("bulk/",), dict)
    b.start()
    value = b"v" * 100
    next_req = iter(range(requests))

    async def writer() -> None:
        for r in next_req:
            ops = [Op(SET, b"bulk/%012d" % (r * pairs + i), value, "bulk") for i in range(pairs)]
            nbytes = sum(len(o.key) + len(o.value) for o in ops)
            while True:
                try:
                    fut = b.submit(ops, nbytes, "bulk")
                    break
                except Exception:  # queue full (503): wait for a commit, as a client would
                    await asyncio.sleep(0.002)
            await fut

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(writer() for _ in range(16)))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    await b.close()
    store.close()
    shutil.rmtree(path)
    return requests * pairs / dt, requests * pairs / cpu


async def _ack_round(
    path: Path, series_on: bool, window_s: float, rate: float, seconds: float
) -> tuple[list[float], int]:
    """Ack latencies (s) of single-pair writes submitted at `rate`/s for `seconds`, and how
    many the batcher refused as overloaded."""
    store = Store.create(str(path))
    b = Batcher(store, window_s=window_s, max_ops=16_000, max_bytes=16 << 20, max_queued=4)
    if series_on:
        b.series = us.for_store(store, lambda _p: ("acks/",), dict)
    b.start()
    lat: list[float] = []
    refused = 0
    value = b"v" * 100

    async def one(i: int) -> None:
        nonlocal refused
        ops = [Op(SET, b"acks/%09d" % i, value, "acks")]
        t0 = time.perf_counter()
        try:
            fut = b.submit(ops, len(ops[0].key) + len(value), "acks")
        except Exception:
            refused += 1
            return
        await fut
        lat.append(time.perf_counter() - t0)

    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0.001:
            await asyncio.sleep(delay)
        t = asyncio.ensure_future(one(i))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    await b.close()
    store.close()
    shutil.rmtree(path)
    return lat, refused


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def bench_acks(tmp: Path, rounds: int, rate: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for window_ms in (500, 10):
        per: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        refused = 0
        for i in range(rounds):
            for series_on in (False, True) if i % 2 == 0 else (True, False):
                lat, n = asyncio.run(
                    _ack_round(tmp / f"acks{i}{series_on}", series_on, window_ms / 1000, rate, 4)
                )
                refused += n
                per[series_on].append((_pct(lat, 0.5) * 1e3, _pct(lat, 0.99) * 1e3))
        p99_off = statistics.median(p[1] for p in per[False])
        p99_on = statistics.median(p[1] for p in per[True])
        out[f"window_{window_ms}ms"] = {
            "p50_ms_off": [round(p[0], 2) for p in per[False]],
            "p50_ms_on": [round(p[0], 2) for p in per[True]],
            "p99_ms_off": [round(p[1], 2) for p in per[False]],
            "p99_ms_on": [round(p[1], 2) for p in per[True]],
            "p99_ratio_on_over_off": round(p99_on / p99_off, 3),
            "refused_overloaded": refused,
        }
    return out


def bench_load(tmp: Path, rounds: int, requests: int) -> dict[str, Any]:
    off: list[float] = []
    on: list[float] = []
    cpu_off: list[float] = []
    cpu_on: list[float] = []
    for i in range(rounds):
        sides = ((False, off, cpu_off), (True, on, cpu_on))
        # Alternate which side runs first: the first of a pair pays more of the warm-up.
        for series_on, out, cpu in sides if i % 2 == 0 else sides[::-1]:
            rate, per_cpu = asyncio.run(
                _load_round(tmp / f"load{i}{series_on}", series_on, requests, 1000)
            )
            out.append(rate)
            cpu.append(per_cpu)
    r = statistics.median(on) / statistics.median(off)
    pairwise = [b / a for a, b in zip(off, on, strict=True)]  # each round's pair
    cpu_pairwise = [b / a for a, b in zip(cpu_off, cpu_on, strict=True)]
    return {
        "ratio_per_round": [round(x, 3) for x in pairwise],
        "ratio_per_round_median": round(statistics.median(pairwise), 3),
        "pairs_per_cpu_s_ratio_per_round": [round(x, 3) for x in cpu_pairwise],
        "pairs_per_cpu_s_ratio_median": round(statistics.median(cpu_pairwise), 3),
        "pairs_per_s_series_off": round(statistics.median(off)),
        "pairs_per_s_series_on": round(statistics.median(on)),
        "rounds_off": [round(x) for x in off],
        "rounds_on": [round(x) for x in on],
        "ratio_on_vs_off": round(r, 3),
        "goal": ">= 0.97",
    }


# --- storage -----------------------------------------------------------------------------


def bench_storage() -> dict[str, Any]:
    saved: dict[str, bytes | None] = {}
    t0 = 1_795_000_000 // 86400 * 86400
    s = us.UsageSeries(saved.get, lambda *_: [], lambda _p: ("ks/",), clock=lambda: t0)
    rnd = random.Random(1)
    carried = 0
    keys = 0
    for minute in range(1440):
        now = t0 + minute * 60 + 1
        state = {"p": (keys, keys * 180)}
        changes = s.due(now, lambda: state, starting=["p"])  # noqa: B023 - called at once
        carried += sum(len(n) + len(v or b"") for n, v in changes.items())
        saved.update(changes)
        s.written(changes)
        n = rnd.randint(100, 20_000)  # busy every minute: counters of 3 to 5 digits
        ops = [Op(SET, b"ks/k", b"x" * 100, "p")] * n
        res = [Result(Status.WRITTEN, 1)] * (n - 7) + [Result(Status.DUPLICATE, 0)] * 7
        s.add_results("p", ops, res, now)
        keys += n
    final = s.due(t0 + 86400 + 1, lambda: {"p": (keys, keys * 180)})
    saved.update(final)
    day_docs = {n: v for n, v in saved.items() if v and us.day_name("p", t0) != n}
    stored = sum(len(n) + len(v) + 8 for n, v in day_docs.items() if v)
    rollup = saved[us.day_name("p", t0)] or b""
    return {
        "minute_docs": len(day_docs),
        "minute_docs_bytes_per_day": stored,
        "hour_rollup_doc_bytes": len(rollup),
        "stored_bytes_per_producer_keyspace_day": stored + len(rollup),
        "log_bytes_carried_per_day": carried,
        "goal_stored": "<= 100000",
    }


# --- query -------------------------------------------------------------------------------


def _synth(store: Store, producers: int, days: int, active: float, now: int) -> int:
    """`days` of block and day documents per producer; returns documents written."""
    rnd = random.Random(7)
    start = (now - days * 86400) // 86400 * 86400
    written = 0
    for p in range(producers):
        name = f"prod{p:03d}"
        batch: dict[str, bytes | None] = {}
        stored = 0
        for day in range(start, now, 86400):
            ddoc = us.SlotDoc(day, {}, {})
            for block in range(day, min(day + 86400, now), us.BLOCK):
                bdoc = us.SlotDoc(block, {}, {})
                for m in range(us.BLOCK // 60):
                    if rnd.random() >= active:
                        continue
                    w = rnd.randint(1, 5000)
                    stored += w * 150
                    cols = [w, w * 150, w // 50, w // 20, 0, 0, 0]
                    hour_slot = (block - day) // 3600
                    bdoc.add(f"{name}/", m, cols)
                    ddoc.add(f"{name}/", hour_slot, cols)
                    bdoc.snap[m] = (stored // 150, stored, None)
                    ddoc.snap[hour_slot] = (stored // 150, stored, None)
                batch[us.block_name(name, block)] = bdoc.encode()
            batch[us.day_name(name, day)] = ddoc.encode()
            if len(batch) >= 400:
                store.put_docs(batch)
                written += len(batch)
                batch = {}
        if batch:
            store.put_docs(batch)
            written += len(batch)
    return written


def bench_query(
    tmp: Path, producers: int, days: int, active: float, queries: int
) -> dict[str, Any]:
    data = tmp / "root"
    r = run_mercury("init", str(data))
    assert r.returncode == 0, r.stderr
    token = (data / "admin.token").read_text().strip()
    now = int(time.time())
    t0 = time.perf_counter()
    with Store.open(str(data), sync=False) as store:  # synthetic history: no fsync per doc
        docs = _synth(store, producers, days, active, now)
        size = store.stat()["file_size"]
    synth_s = time.perf_counter() - t0
    logs = tmp / "logs"
    logs.mkdir()
    procs = Procs(logs)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        args = ("--listen", f"127.0.0.1:{port}", "--repl-listen", f"127.0.0.1:{free_port()}")
        proc = procs.start_mercury("root", str(data), *args, name="root")
        wait_http(url + "/healthz", proc=proc, timeout=120)
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as c:
            for p in range(producers):
                resp = c.put(
                    f"/v1/admin/producers/prod{p:03d}", json={"keyspaces": [f"prod{p:03d}/"]}
                )
                assert resp.status_code in (200, 201), resp.text

            one = f"prod{producers // 2:03d}"

            def timed(params: dict[str, str]) -> dict[str, Any]:
                ms = []
                npts = 0
                for _ in range(queries):
                    t = time.perf_counter()
                    resp = c.get("/v1/usage/series", params=params)
                    ms.append((time.perf_counter() - t) * 1000)
                    assert resp.status_code == 200, resp.text
                    npts = len(resp.json()["points"])
                return {
                    "points": npts,
                    "median_ms": round(statistics.median(ms), 2),
                    "max_ms": round(max(ms), 2),
                }

            out = {
                "producers": producers,
                "days": days,
                "active_fraction": active,
                "documents": docs,
                "store_file_bytes": size,
                "synthesis_s": round(synth_s, 1),
                "one_producer_30d_1h": timed({"producer": one, "since": f"-{days}d", "step": "1h"}),
                "one_producer_24h_1m": timed({"producer": one, "since": "-24h", "step": "1m"}),
                "admin_all_producers_7d_1h": timed({"since": "-7d", "step": "1h"}),
                "goal_one_producer_ms": "<= 50",
            }
    finally:
        procs.stop_all()
    return out


# --- reads -------------------------------------------------------------------------------

#: Both servers start the same way; only the first argument turns counting on.
_SERVER = (
    "import runpy, sys; from reads import readstats\n"
    "if sys.argv[1] == 'on': readstats.enable()\n"
    "sys.argv = ['mercury.readserve', *sys.argv[2:]]\n"
    "runpy.run_module('mercury.readserve', run_name='__main__')"
)


def _get(sock: socket.socket, request: bytes) -> float:
    """One request on a keep-alive connection; seconds until the whole answer arrived."""
    t0 = time.perf_counter()
    sock.sendall(request)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, body = buf.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return time.perf_counter() - t0


def bench_reads(tmp: Path, rounds: int, requests: int) -> dict[str, Any]:
    data = tmp / "reads-store"
    store = Store.create(str(data))
    for b in range(0, 10_000, 1000):
        store.apply([Op(SET, b"app/k%05d" % i, b"v" * 200, "app") for i in range(b, b + 1000)])
    store.close()
    logs = tmp / "reads-logs"
    logs.mkdir()
    procs = Procs(logs)
    try:
        ports = {"off": free_port(), "on": free_port()}
        for side, port in ports.items():
            argv = [sys.executable, "-c", _SERVER, side, str(data), "--listen", f"127.0.0.1:{port}"]
            procs.start(argv, name=side)
        for port in ports.values():
            wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        socks = {k: socket.create_connection(("127.0.0.1", p)) for k, p in ports.items()}
        for s in socks.values():
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rng = random.Random(7)
        per_round: list[dict[str, float]] = []
        for _ in range(rounds):
            lat: dict[str, list[float]] = {"off": [], "on": []}
            for i in range(requests):
                req = b"GET /v1/kv/app/k%05d HTTP/1.1\r\nHost: b\r\n\r\n" % rng.randrange(10_000)
                order = ("off", "on") if i % 2 else ("on", "off")
                for side in order:
                    lat[side].append(_get(socks[side], req))
            p50 = {k: statistics.median(v) * 1e6 for k, v in lat.items()}
            per_round.append(
                {"p50_off_us": p50["off"], "p50_on_us": p50["on"], "ratio": p50["on"] / p50["off"]}
            )
        for s in socks.values():
            s.close()
    finally:
        procs.stop_all()
    ratios = [r["ratio"] for r in per_round]
    return {
        "rounds": per_round,
        "ratio_on_over_off_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "goal": "<= 1.03",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, 20 producers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200, help="1,000-pair requests per round")
    ap.add_argument("--producers", type=int, default=100)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--active", type=float, default=0.25)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--reads", type=int, default=5000, help="point reads per side per round")
    ap.add_argument("--ack-rate", type=float, default=2000.0, help="PUT/s of the acks bench")
    ap.add_argument("--only", default="load,acks,storage,query,reads")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.requests, a.producers, a.queries = 2, 60, 20, 10
    only = set(a.only.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="mercury-bench-usage-"))
    out: dict[str, Any] = {"settings": vars(a)}
    try:
        if "load" in only:
            out["load"] = bench_load(tmp, a.rounds, a.requests)
        if "acks" in only:
            out["acks"] = bench_acks(tmp, max(a.rounds, 2), a.ack_rate)
        if "storage" in only:
            out["storage"] = bench_storage()
        if "query" in only:
            out["query"] = bench_query(tmp, a.producers, a.days, a.active, a.queries)
        if "reads" in only:
            out["reads"] = bench_reads(tmp, max(a.rounds, 5), a.reads)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
