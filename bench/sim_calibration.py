"""Calibration of `mercury sim` against real processes (prints JSON).

The same three-tier tree (1 root -> 3 -> 9 by default) with the same write load, three ways:

(a) real: a `mercury root` and `mercury replica` processes on 127.0.0.1 over TCP (every
    store `--no-sync`, as the simulator's stores are never synced; the root's batch window
    1 ms, the simulator's root commits each batch at once). Every replica's HTTP listener
    carries one `GET /v1/watch` stream read by a thread of this process; a producer PUTs
    one fresh key at a time at Poisson instants (`--rate` a second, `--samples` writes).
    A sample is, per write and replica, the time from the PUT's acknowledgement (sent
    once the batch is committed: a little after the commit) to the change's line on the
    replica's stream (a little after the replica's commit: its read process is woken,
    reads the change and writes the line). A watch on the root as the reference instead
    was tried: its lines came after tier 1's at the median (the root's HTTP process is
    busy answering the PUT), so the acknowledgement is the nearer instant.
(b) simulated: `sim.run.simulate` with the same tree, the same write rate (batches of one
    op, `--value-bytes`), no faults, every link's one-way delay drawn uniformly from what
    loopback TCP shows on this machine (P10..P90 of half a measured round trip between two
    processes): propagation is root commit -> replica commit in virtual time.
(c) fitted: the simulation again with each link's delay drawn from the real tier-1
    delays (one measured hop, its CPU and process wake-ups included; negative ones as 0):
    does the simulator's composition of two hops then predict the real tier 2?

(d) CPU-modelled: (b) again with the simulator's CPU cost model (`sim/cpu.py`): each node
    one core, whose sends, parses, commits and apply-thread hand-offs take virtual time
    drawn from what this process measures first with the real code (`measure_cpu`:
    `frames.encode_record` + a socket send, `memnet.parse_unit`, `Store.apply_log_records`
    of one record on an unsynced store at two sizes for a slope, and the loop <-> apply
    thread hand-offs of `replicator.client`: a `SimpleQueue` and `call_soon_threadsafe`).
    `--measure-cpu` prints only those measured costs.

Without (d) the simulator's clock stands still while code runs, so a commit, a frame's
parse or a process wake-up costs 0 ms; (b) measures what the links alone explain. Nothing
models 13 processes contending for the machine's cores (each simulated node has a core of
its own). Bounded in count (`--samples`, `--cpu-rounds`) and time (`--max-seconds` for
the real run); every process started is stopped by its PID.

Usage: .venv/bin/python bench/sim_calibration.py [--fanout 3] [--samples 300] [--rate 20]
       .venv/bin/python bench/sim_calibration.py --measure-cpu [--cpu-rounds 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator import frames
from replicator.memnet import parse_unit
from sim.cpu import CpuCosts
from sim.run import MAP_SIZE, Params, simulate
from store.ops import SET, LogRecord, Op
from store.store import Store
from testkit.procs import Procs, free_port, run_mercury, wait_http

#: What the simulator models of the CPU, printed with the figures.
CPU_MODEL = (
    "sim_loopback_links: none (the clock stands still while code runs: commits, frame "
    "parsing and wake-ups cost 0 ms); sim_cpu_model: each node one core, sends, parses, "
    "commits and apply-thread hand-offs drawn from cpu_costs (measured here with the real "
    "code); neither models 13 processes contending for the machine's cores, nor the "
    "replica's watch line (the real samples end there, the simulated ones at the commit); "
    "the fitted one adds one measured hop's cost (CPU included) per link"
)


def _timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def measure_cpu(tmp: Path, rounds: int, value_bytes: int) -> CpuCosts:
    """The costs of `sim/cpu.py`, timed with the real code on this machine (`rounds` each)."""
    db_id = str(uuid.uuid4())
    big = value_bytes * 16
    root = Store.create(str(tmp / "cpu-root"), db_id=db_id, sync=False, map_size=MAP_SIZE)
    for i in range(2 * rounds):
        # Random bytes, as the simulator's writes: a repeated byte compresses to nothing.
        value = os.urandom(value_bytes if i < rounds else big)
        root.apply([Op(SET, b"cal/k%d" % i, value, owner="cal")], time_us=time.time_ns() // 1000)
    recs: list[LogRecord] = []
    while len(recs) < 2 * rounds:
        recs += root.read_log(len(recs) + 1, max_records=1000)
    root.close()
    units = [frames.encode_record(r.header, r.payload) for r in recs]
    replica = Store.create(str(tmp / "cpu-replica"), db_id=db_id, sync=False, map_size=MAP_SIZE)
    commits = [_timed(replica.apply_log_records, [r]) for r in recs]
    replica.close()
    small, large = commits[:rounds], commits[rounds:]
    slope = (statistics.median(large) - statistics.median(small)) / (
        len(units[rounds]) - len(units[0])
    )
    parse = [_timed(parse_unit, u, None) for u in units[:rounds]]
    a, b = socket.socketpair()
    send = []
    for r in recs[:rounds]:
        t0 = time.perf_counter()
        a.send(frames.encode_record(r.header, r.payload))
        send.append(time.perf_counter() - t0)
        b.recv(1 << 16)  # untimed: the peer's read
    a.close()
    b.close()
    return CpuCosts(
        parse=tuple(parse),
        commit=tuple(small),
        commit_bytes=len(units[0]),
        commit_per_byte=max(0.0, slope),
        handoff=tuple(_handoffs(rounds)),
        send=tuple(send),
    )


def _handoffs(rounds: int) -> list[float]:
    """What `replicator.client._ApplyThread` pays per record: the loop hands it to the
    apply thread over a `SimpleQueue`, the thread reports back with
    `call_soon_threadsafe`; each hand-off timed from the giving to the taking side."""
    out: list[float] = []
    q: queue.SimpleQueue[tuple[float, asyncio.Future[None]] | None] = queue.SimpleQueue()

    async def go() -> None:
        loop = asyncio.get_running_loop()

        def back(fut: asyncio.Future[None], t0: float) -> None:
            out.append(time.perf_counter() - t0)
            fut.set_result(None)

        def worker() -> None:
            while (item := q.get()) is not None:
                t0, fut = item
                out.append(time.perf_counter() - t0)
                loop.call_soon_threadsafe(back, fut, time.perf_counter())

        th = threading.Thread(target=worker, daemon=True)
        th.start()
        for _ in range(rounds):
            fut = loop.create_future()
            q.put((time.perf_counter(), fut))
            await fut
        q.put(None)
        th.join(10)

    asyncio.run(go())
    return out


def costs_summary(c: CpuCosts) -> dict[str, Any]:
    """P50/P99 (µs) of each measured cost, and the commit's slope."""

    def us(xs: tuple[float, ...]) -> dict[str, float]:
        s = sorted(xs)
        at = [s[min(len(s) - 1, int(q / 100 * len(s)))] * 1e6 for q in (50, 99)]
        return {"p50_us": round(at[0], 2), "p99_us": round(at[1], 2)}

    return {
        "samples_each": len(c.parse),
        "parse": us(c.parse),
        "commit": {**us(c.commit), "frame_bytes": c.commit_bytes},
        "commit_per_kib_us": round(c.commit_per_byte * 1024 * 1e6, 3),
        "handoff": us(c.handoff),
        "send": us(c.send),
    }


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of xs, in ms."""
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p / 100 * len(s)))] * 1000, 3)


ECHO = (
    "import socket,sys\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', 0)); s.listen(1); print(s.getsockname()[1], flush=True)\n"
    "c,_=s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
    "while True:\n"
    "    d=c.recv(65536)\n"
    "    if not d: break\n"
    "    c.sendall(d)\n"
)


def loopback_one_way(rounds: int, size: int) -> list[float]:
    """Half the round trip of a `size`-byte message to an echo process over loopback TCP
    (seconds), `rounds` times."""
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE)
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = b"x" * size
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            s.sendall(msg)
            got = 0
            while got < size:
                got += len(s.recv(65536))
            out.append((time.perf_counter() - t0) / 2)
        s.close()
    finally:
        if echo.poll() is None:
            os.kill(echo.pid, 15)
        echo.wait(10)
    return out


class Watcher(threading.Thread):
    """One replica's watch stream: the arrival instant of every key's change line."""

    def __init__(self, port: int, token: str | None = None) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.seen: dict[str, float] = {}
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            with (
                httpx.Client(
                    base_url=f"http://127.0.0.1:{self.port}", headers=self.headers, timeout=None
                ) as c,
                c.stream("GET", "/v1/watch", params={"prefix": "cal/"}) as r,
            ):
                for line in r.iter_lines():
                    now = time.perf_counter()
                    if not line:
                        continue
                    doc = json.loads(line)
                    if doc.get("heartbeat"):
                        self.ready.set()
                    elif "key" in doc:
                        self.seen[doc["key"]] = now
        except (httpx.HTTPError, OSError):
            return  # the node stopped: the run is over


def real(tmp: Path, procs: Procs, a: argparse.Namespace) -> dict[str, Any]:
    """The tree as processes; per-tier ack -> watch line delays."""
    r = run_mercury("init", str(tmp / "root"))
    assert r.returncode == 0, r.stderr
    token = (tmp / "root" / "admin.token").read_text().strip()
    gw, repl = free_port(), free_port()
    root = procs.start_mercury(
        "root",
        str(tmp / "root"),
        "--listen",
        f"127.0.0.1:{gw}",
        "--repl-listen",
        f"127.0.0.1:{repl}",
        "--batch-window-ms",
        "1",
        "--no-sync",
        name="root",
    )
    wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
    admin = httpx.Client(
        base_url=f"http://127.0.0.1:{gw}", headers={"Authorization": f"Bearer {token}"}
    )
    admin.put("/v1/admin/producers/cal", json={"keyspaces": ["cal/"]}).raise_for_status()
    ptoken = admin.post("/v1/admin/producers/cal/tokens").json()["token"]
    admin.close()
    producer = httpx.Client(
        base_url=f"http://127.0.0.1:{gw}", headers={"Authorization": f"Bearer {ptoken}"}
    )
    tiers: list[list[tuple[int, int]]] = [[(0, repl)]]  # (http, repl) ports per node
    for t in (1, 2):
        nodes = []
        for j in range(a.fanout**t):
            up = tiers[t - 1][j // a.fanout][1]
            http, rp = free_port(), free_port()
            p = procs.start_mercury(
                "replica",
                str(tmp / f"t{t}-{j}"),
                "--source",
                f"127.0.0.1:{up}",
                "--listen",
                f"127.0.0.1:{http}",
                "--repl-listen",
                f"127.0.0.1:{rp}",
                "--no-sync",
                name=f"t{t}-{j}",
            )
            wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60, proc=p)
            nodes.append((http, rp))
        tiers.append(nodes)
    watchers = [[Watcher(http) for http, _ in tier] for tier in tiers[1:]]
    for w in (w for tier in watchers for w in tier):
        w.start()
        if not w.ready.wait(30):
            raise TimeoutError(f"the watch on port {w.port} never caught up")
    value = "v" * a.value_bytes
    # A first write through the whole tree: every stream is live before the clock starts.
    producer.put("/v1/kv/cal/warm", content=value).raise_for_status()
    all_w = [w for tier in watchers for w in tier]
    deadline = time.monotonic() + 30
    while not all("cal/warm" in w.seen for w in all_w):
        if time.monotonic() > deadline:
            raise TimeoutError("the warm-up write never reached every replica")
        time.sleep(0.01)
    rng = random.Random(1)
    acks: dict[str, float] = {}
    started = time.monotonic()
    nxt = time.perf_counter()
    for i in range(a.samples):
        if time.monotonic() - started > a.max_seconds:
            break
        nxt += rng.expovariate(a.rate)
        pause = nxt - time.perf_counter()
        if pause > 0:
            time.sleep(pause)  # the load's own schedule, not a wait for a condition
        key = f"cal/k{i}"
        producer.put(f"/v1/kv/{key}", content=value).raise_for_status()
        acks[key] = time.perf_counter()
    deadline = time.monotonic() + 30
    while not all(k in w.seen for w in all_w for k in acks):
        if time.monotonic() > deadline:
            break  # a line missing after 30 s: reported as `missing`
        time.sleep(0.01)
    producer.close()
    for p in reversed(procs.started):
        procs.terminate(p)
    out = []
    missing = 0
    hops: list[float] = []
    for t, tier in enumerate(watchers, start=1):
        d = []
        for w in tier:
            for k, t_ack in acks.items():
                if k in w.seen:
                    d.append(w.seen[k] - t_ack)
                else:
                    missing += 1
        if t == 1:
            hops = d
        out.append(
            {
                "tier": t,
                "nodes": len(tier),
                "samples": len(d),
                "p50_ms": pct(d, 50),
                "p99_ms": pct(d, 99),
            }
        )
    return {"writes": len(acks), "missing_lines": missing, "per_tier": out, "hops": hops}


def simulated(
    a: argparse.Namespace,
    writes: int,
    delay: tuple[float, float],
    samples: tuple[float, ...] = (),
    cpu: CpuCosts | None = None,
) -> dict[str, Any]:
    """The same tree and load in the simulator, every link `delay` (seconds, uniform) or
    drawn from `samples`."""
    nodes = 1 + a.fanout + a.fanout**2
    p = Params(
        nodes=nodes,
        tiers=3,
        seed=1,
        virtual_seconds=writes / a.rate,
        write_rate=a.rate,
        batch=1,
        value_bytes=a.value_bytes,
        settle=0.0,
        link_delay=delay,
        link_delay_samples=samples,
        cpu=cpu,
    )
    doc = simulate(p, timing=True)
    return {
        "link_delay_ms": (
            {
                "measured_samples": len(samples),
                "p50": pct(list(samples), 50),
                "p99": pct(list(samples), 99),
            }
            if samples
            else [round(delay[0] * 1000, 4), round(delay[1] * 1000, 4)]
        ),
        "records": doc["root_records"],
        "invariants_ok": doc["invariants_ok"],
        **({"cpu_busy": doc["cpu_busy"]} if cpu is not None else {}),
        "wall_seconds": doc["wall_seconds"],
        "per_tier": [
            {k: t[k] for k in ("tier", "nodes", "records_applied", "p50_ms", "p99_ms")}
            for t in doc["per_tier"]
        ],
    }


def ratios(sim: dict[str, Any], real_: dict[str, Any]) -> list[dict[str, Any]]:
    """sim / real of P50 and P99, per tier."""
    out = []
    for s, r in zip(sim["per_tier"], real_["per_tier"], strict=True):
        out.append(
            {
                "tier": s["tier"],
                "p50": round(s["p50_ms"] / r["p50_ms"], 3) if r["p50_ms"] > 0 else None,
                "p99": round(s["p99_ms"] / r["p99_ms"], 3) if r["p99_ms"] > 0 else None,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fanout", type=int, default=3, help="1 root -> F -> F*F (default 3)")
    ap.add_argument("--samples", type=int, default=300, help="writes at the root")
    ap.add_argument("--rate", type=float, default=20.0, help="writes a second (Poisson)")
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--max-seconds", type=float, default=60.0, help="bound of the write phase")
    ap.add_argument("--rounds", type=int, default=2000, help="loopback round trips measured")
    ap.add_argument("--cpu-rounds", type=int, default=2000, help="timings of each CPU cost")
    ap.add_argument("--measure-cpu", action="store_true", help="print only the CPU costs")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mercury-simcpu-") as d:
        costs = measure_cpu(Path(d), a.cpu_rounds, a.value_bytes)
    if a.measure_cpu:
        print(json.dumps({"cpu_costs": costs_summary(costs)}, indent=1))
        return
    hop = loopback_one_way(a.rounds, 200 + a.value_bytes)
    link = (pct(hop, 10) / 1000, pct(hop, 90) / 1000)
    with tempfile.TemporaryDirectory(prefix="mercury-simcal-") as d:
        procs = Procs(Path(d))
        try:
            real_ = real(Path(d), procs, a)
        finally:
            procs.stop_all()
    sim = simulated(a, real_["writes"], link)
    modelled = simulated(a, real_["writes"], link, cpu=costs)
    # (c) every link's delay drawn from the real tier-1 delays (one measured hop, CPU and
    # process wake-ups included): does the simulator then predict the real tier 2?
    hops = tuple(max(0.0, h) for h in real_.pop("hops"))
    fitted = simulated(a, real_["writes"], link, hops)
    print(
        json.dumps(
            {
                "topology": [1, a.fanout, a.fanout**2],
                "write_rate": a.rate,
                "value_bytes": a.value_bytes,
                "loopback_one_way_ms": {
                    "p10": pct(hop, 10),
                    "p50": pct(hop, 50),
                    "p90": pct(hop, 90),
                    "p99": pct(hop, 99),
                },
                "real": real_,
                "sim_loopback_links": sim,
                "ratio_sim_loopback_to_real": ratios(sim, real_),
                "cpu_costs": costs_summary(costs),
                "sim_cpu_model": modelled,
                "ratio_sim_cpu_model_to_real": ratios(modelled, real_),
                "sim_fitted_to_real_tier1": fitted,
                "ratio_sim_fitted_to_real": ratios(fitted, real_),
                "cpu_model": CPU_MODEL,
                "machine": f"shared, load average {os.getloadavg()[0]:.1f} at the end "
                f"({os.cpu_count()} cores); compare within one run",
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
