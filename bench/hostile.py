"""Hostile-client benchmark: the red team's trickled-body attack at full size (prints JSON).

A real `mercury root` and `mercury replica`, both with their default bounds (connection cap
1,000 each). Two attacks, each measured beside a baseline in the same run:

1. ``root_writes``: `--conns` (default 1,000) connections that send a PUT head with one
   producer's token and then one body byte every `--every` seconds (default 2, inside the
   red team's 1-4 s), reconnecting whenever they are cut, while a second producer PUTs one
   key at a time on a keep-alive connection (the root's batch window `--window-ms`, default
   20: a write is answered once its batch commits);
2. ``replica_get_bulk``: the same with POST /v1/get_bulk heads and no credentials on the
   replica, while a reader sends get_bulks of two keys.

For each: the well-behaved client's success share, P50/P99 (ms) without and under the
attack, and the attacked process's anonymous RSS before and at its highest during it
(sampled every 0.25 s; `testkit.procs.anon_rss_mb`), with the listener's eviction and
cut counts from `/metrics`. The attackers run in a child process of their own (one thread
over non-blocking sockets, `testkit/trickle.py`), so the good client's timings are not
their client-side work. Goals (docs/security.md): success >= 99 %, P99 <= 100 ms, RSS
growth <= 256 MB. Bounded: `--seconds` per phase, every process stopped by PID.

Usage: .venv/bin/python bench/hostile.py [--conns N] [--seconds S] [--every S]
       [--only root_writes,replica_get_bulk]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import guestmem
from testkit import metrics
from testkit.procs import Procs, anon_rss_mb, free_port, run_mercury, wait_http
from testkit.trickle import Trickler, post_head, put_head


def pct(xs: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank) of xs, in ms."""
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p / 100 * len(s)))] * 1000, 2)


def _attack(port: int, head: bytes, conns: int, every: float, seconds: float, out: Any) -> None:
    t = Trickler(port, head, conns=conns, every_s=every, max_s=seconds + 30)
    t.start()
    time.sleep(seconds)
    peak = t.open_now
    t.stop()
    out.put(
        {
            "opened": t.opened,
            "closed_by_server": t.closed,
            "connect_failed": t.refused,
            "open_at_end": peak,
        }
    )


def _good(call: Callable[[], bool], seconds: float) -> dict[str, Any]:
    lat: list[float] = []
    ok = fail = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            good = call()
        except httpx.HTTPError:
            good = False
        dt = time.perf_counter() - t0
        if good:
            ok += 1
            lat.append(dt)
        else:
            fail += 1
    n = ok + fail
    return {
        "requests": n,
        "success_pct": round(100 * ok / n, 2) if n else None,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
    }


def _rss_watch(pid: int, stop: threading.Event, peak: list[float]) -> None:
    while not stop.wait(0.25):
        try:
            peak[0] = max(peak[0], anon_rss_mb(pid))
        except Exception:
            return


def _phase(
    name: str,
    pid: int,
    port: int,
    head: bytes,
    call: Callable[[], bool],
    metrics_url: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    base = _good(call, args.seconds)
    rss0 = anon_rss_mb(pid)
    peak = [rss0]
    stop = threading.Event()
    watcher = threading.Thread(target=_rss_watch, args=(pid, stop, peak), daemon=True)
    watcher.start()
    q: Any = multiprocessing.Queue()
    child = multiprocessing.Process(
        target=_attack, args=(port, head, args.conns, args.every, args.seconds + args.ramp, q)
    )
    child.start()
    try:
        time.sleep(args.ramp)  # the attack takes the cap first
        attacked = _good(call, args.seconds)
        attack = q.get(timeout=args.seconds + 120)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
        stop.set()
        watcher.join(5)
    text = httpx.get(metrics_url, timeout=30).text
    closed = {
        r: metrics.value(text, "mercury_budget_closed_total", budget="http", reason=r)
        for r in ("evicted", "share", "share_refused", "refused", "slow_body", "body")
    }
    return {
        "baseline": base,
        "attacked": attacked,
        "attack": attack,
        "rss_mb_before": round(rss0, 1),
        "rss_mb_peak": round(peak[0], 1),
        "rss_growth_mb": round(peak[0] - rss0, 1),
        "budget_closed": closed,
        "goals_met": bool(
            attacked["success_pct"] is not None
            and attacked["success_pct"] >= 99
            and (attacked["p99_ms"] or 1e9) <= 100
            and peak[0] - rss0 <= 256
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conns", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--ramp", type=float, default=5.0, help="seconds the attack runs first")
    p.add_argument("--only", default="root_writes,replica_get_bulk")
    p.add_argument(
        "--window-ms",
        type=int,
        default=20,
        help="the root's batch window: a write is answered after its batch commits, so the "
        "default 500 ms window alone would be every write's latency",
    )
    p.add_argument(
        "--hold-freed-memory",
        action="store_true",
        help="hold the VM's free page reporting off for the run (bench/guestmem.py): the RSS "
        "figures then do not depend on what the host took back meanwhile",
    )
    args = p.parse_args()
    memory = guestmem.hold_for_run(args.hold_freed_memory)
    only = set(args.only.split(","))
    out: dict[str, Any] = {
        "settings": vars(args),
        "cores": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="mercury-hostile-bench-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "logs").mkdir()
        procs = Procs(tmp / "logs")
        try:
            r = run_mercury("init", str(tmp / "root"))
            assert r.returncode == 0, r.stderr
            token = (tmp / "root" / "admin.token").read_text().strip()
            gw, repl, http = free_port(), free_port(), free_port()
            root = procs.start_mercury(
                "root",
                str(tmp / "root"),
                "--listen",
                f"127.0.0.1:{gw}",
                "--repl-listen",
                f"127.0.0.1:{repl}",
                "--batch-window-ms",
                str(args.window_ms),
                name="root",
            )
            wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
            tokens = {}
            with httpx.Client(
                base_url=f"http://127.0.0.1:{gw}", headers={"Authorization": f"Bearer {token}"}
            ) as admin:
                for name in ("hostile", "good"):
                    admin.put(
                        f"/v1/admin/producers/{name}", json={"keyspaces": [f"{name}/"]}
                    ).raise_for_status()
                    tokens[name] = admin.post(f"/v1/admin/producers/{name}/tokens").json()["token"]
            good = httpx.Client(
                base_url=f"http://127.0.0.1:{gw}",
                headers={"Authorization": f"Bearer {tokens['good']}"},
                timeout=10,
            )
            for i in range(10):
                good.put(f"/v1/kv/good/k{i}", content=b"v").raise_for_status()
            n = [0]

            def put() -> bool:
                n[0] += 1
                return good.put(f"/v1/kv/good/w{n[0] % 1000}", content=b"v").status_code == 200

            if "root_writes" in only:
                out["root_writes"] = _phase(
                    "root_writes",
                    root.pid,
                    gw,
                    put_head("/v1/kv/hostile/x", tokens["hostile"]),
                    put,
                    f"http://127.0.0.1:{gw}/metrics",
                    args,
                )
            if "replica_get_bulk" in only:
                replica = procs.start_mercury(
                    "replica",
                    str(tmp / "replica"),
                    "--source",
                    f"127.0.0.1:{repl}",
                    "--listen",
                    f"127.0.0.1:{http}",
                    name="replica",
                )
                wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60, proc=replica)
                reader = httpx.Client(base_url=f"http://127.0.0.1:{http}", timeout=10)
                deadline = time.monotonic() + 60
                while reader.get("/v1/kv/good/k9").status_code != 200:
                    assert time.monotonic() < deadline, "the replica never caught up"
                    time.sleep(0.1)

                def bulk() -> bool:
                    r = reader.post("/v1/get_bulk", json={"keys": ["good/k1", "good/k2"]})
                    return r.status_code == 200 and "good/k1" in r.text

                out["replica_get_bulk"] = _phase(
                    "replica_get_bulk",
                    replica.pid,
                    http,
                    post_head("/v1/get_bulk", None),
                    bulk,
                    f"http://127.0.0.1:{http}/metrics",
                    args,
                )
        except BaseException:
            print(procs.logs()[-6000:], file=sys.stderr)
            raise
        finally:
            procs.stop_all()
    out["load_avg_at_end"] = os.getloadavg()
    out |= memory
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
