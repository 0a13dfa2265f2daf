"""Expiry benchmark (prints JSON): keys with TTLs spread over a window expire on the root and
on two tiers of replicas at identical seqs, and how late. Run by `make bench`.

A real `mercury root` (batch window `--window-ms`, default the production 500 ms) with a
replica and a replica of that replica. `--keys` keys are written through `POST /v1/batch`
(10,000 a request) with deadlines spread evenly over `--spread` seconds after a lead long
enough for the load (so none is due before it is written); one writer PUTs other keys
(without TTL) one request at a time from 3 s before the load until every expiry is logged,
its acknowledgement latency recorded: in those first 3 s (the baseline) and while keys
expire.

Figures:

1. Lateness of each expiry on the root: its log record's commit time minus the key's
   deadline (both from the root's log: op 4 carries the deadline, op 5 is the expiry), P50,
   P99 and max, and the share within 1 s. Goal: all within deadline + 1 s.
   On each replica tier: the time its `GET /v1/watch?prefix=e/` stream delivered the
   expiry's line to this process, minus the deadline. A replica's log holds the root's
   commit times (its log is the root's, byte for byte), so its own apply time is not in the
   store; the watcher's receive time is an upper bound of it (apply, then the stream's
   wake-up and delivery).
2. Agreement: the (seq, key) of every expiry in both replicas' logs equals the root's.
3. Write P99 (and P50) of the single writer before the wave and during it, and the ratio.

The issue's scale is 100,000 keys over 10 s; on a loaded shared machine run fewer keys
(what the output's "keys" says).

Usage: .venv/bin/python bench/expiry.py [--keys N] [--spread S] [--window-ms W]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store import codec, replica_apply
from store.format import OP_EXPIRE, OP_SET_EXPIRING, split_expiring
from store.store import Store
from testkit.logged import records
from testkit.procs import Procs, free_port, run_mercury, wait_http
from testkit.replication import status, wait_for

PER_REQUEST = 10_000
BASELINE_S = 3.0


def pct(xs: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank) of xs."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]


def log_facts(data: Path) -> tuple[dict[bytes, int], list[tuple[int, bytes, int]]]:
    """From a store's log: each expiring key's last deadline, and each expiry as
    (seq, key, commit time µs)."""
    deadlines: dict[bytes, int] = {}
    expiries: list[tuple[int, bytes, int]] = []
    with Store.open(str(data), readonly=True) as store:
        first = store.status()["log_first_seq"]
        for rec in records(store, first):
            for e in codec.decode_entries(replica_apply.payload(rec)):
                if e.op == OP_SET_EXPIRING:
                    deadlines[e.key] = split_expiring(e.value)[0]
                elif e.op == OP_EXPIRE:
                    expiries.append((e.seq, bytes(e.key), rec.time_us))
    return deadlines, expiries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--spread", type=float, default=10.0)
    ap.add_argument("--window-ms", type=float, default=500.0)
    args = ap.parse_args()
    out: dict[str, Any] = {"keys": args.keys, "spread_s": args.spread, "window_ms": args.window_ms}
    with tempfile.TemporaryDirectory(prefix="mercury-expiry-bench-") as tmp_s:
        tmp = Path(tmp_s)
        procs = Procs(tmp)
        try:
            run(tmp, procs, args, out)
        finally:
            procs.stop_all()
    print(json.dumps(out, indent=2))


def run(tmp: Path, procs: Procs, args: argparse.Namespace, out: dict[str, Any]) -> None:
    data = tmp / "root"
    assert run_mercury("init", str(data)).returncode == 0
    gw, repl = free_port(), free_port()
    root = procs.start_mercury(
        "root", str(data), "--listen", f"127.0.0.1:{gw}", "--repl-listen",
        f"127.0.0.1:{repl}", "--batch-window-ms", str(args.window_ms), name="root",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
    base = f"http://127.0.0.1:{gw}"
    admin = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
    httpx.put(f"{base}/v1/admin/producers/p", json={"keyspaces": ["e/", "w/"]}, headers=admin)
    token = httpx.post(f"{base}/v1/admin/producers/p/tokens", headers=admin).json()["token"]
    p = {"Authorization": f"Bearer {token}"}
    tiers = []
    source = repl
    for name in ("t1", "t2"):
        http, rport = free_port(), free_port()
        proc = procs.start_mercury(
            "replica", str(tmp / name), "--listen", f"127.0.0.1:{http}", "--source",
            f"127.0.0.1:{source}", "--repl-listen", f"127.0.0.1:{rport}", name=name,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60, proc=proc)
        tiers.append((name, http))
        source = rport

    lat: list[tuple[float, float]] = []  # (send time, seconds to ack)
    stop = threading.Event()
    # Each tier's expiries as a watcher of it receives them: key -> receive time (s).
    seen: dict[str, dict[str, float]] = {name: {} for name, _ in tiers}

    def watcher(name: str, port: int) -> None:
        got = seen[name]
        url = f"http://127.0.0.1:{port}/v1/watch"
        with httpx.stream("GET", url, params={"prefix": "e/"}, timeout=None) as r:
            for line in r.iter_lines():  # ends when the replica stops (bench teardown)
                if '"expire"' in line:
                    ev = json.loads(line)
                    if ev.get("op") == "expire":
                        got[ev["key"]] = time.time()
                if stop.is_set() and len(got) >= args.keys:
                    return

    for name, http in tiers:
        threading.Thread(target=watcher, args=(name, http), daemon=True).start()

    def writer() -> None:
        with httpx.Client(base_url=base, headers=p, timeout=30) as c:
            i = 0
            while not stop.is_set() and i < 1_000_000:  # bounded in count and by `stop`
                t = time.time()
                c.put(f"/v1/kv/w/{i % 100}", content=b"%d" % i).raise_for_status()
                lat.append((t, time.time() - t))
                i += 1

    w = threading.Thread(target=writer, daemon=True)
    t_base = time.time()
    w.start()
    time.sleep(BASELINE_S)  # the writer alone: the baseline of its acks
    t_load = time.time()
    lead = 3.0 + 1.5 * args.keys / PER_REQUEST * max(0.1, args.window_ms / 1000)
    with httpx.Client(base_url=base, headers=p, timeout=120) as c:
        for start in range(0, args.keys, PER_REQUEST):
            n = min(PER_REQUEST, args.keys - start)
            # TTLs from the load's start: LEAD_S, then evenly over the spread
            ops = [
                {
                    "op": "set",
                    "key": f"e/{start + j:08d}",
                    "value": "x",
                    "expires_at": _rfc3339(
                        t_load + lead + args.spread * (start + j) / max(1, args.keys)
                    ),
                }
                for j in range(n)
            ]
            c.post("/v1/batch", json={"ops": ops}).raise_for_status()
    out["load_s"] = round(time.time() - t_load, 2)
    wave_start = t_load + lead
    out["lead_s"] = round(lead, 2)
    out["load_done_before_wave"] = t_load + out["load_s"] < wave_start
    wave_end = wave_start + args.spread
    wait_for(
        lambda: len(log_facts(data)[1]) >= args.keys,
        args.spread + 300,
        "every key's expiry on the root",
    )
    stop.set()
    w.join(30)
    root_seq = httpx.get(f"{base}/v1/status").json()["seq"]
    for name, http in tiers:

        def caught_up(port: int = http) -> bool:
            return bool(status(port)["seq"] >= root_seq)

        wait_for(caught_up, 300, f"{name} caught up")
    deadlines, expiries = log_facts(data)
    late = [(t - deadlines[k]) / 1e6 for _s, k, t in expiries]
    out["expired"] = len(expiries)
    out["lateness_s"] = {
        "p50": round(pct(late, 50) or 0, 3),
        "p99": round(pct(late, 99) or 0, 3),
        "max": round(max(late), 3),
        "within_1s": round(sum(x <= 1.0 for x in late) / len(late), 4),
        "early": sum(x < 0 for x in late),
    }
    for name, _ in tiers:
        got = seen[name]

        def all_seen(got: dict[str, float] = got) -> bool:
            return len(got) >= int(args.keys)

        wait_for(all_seen, 120, f"{name}'s watcher")
        tl = [t - deadlines[k.encode()] / 1e6 for k, t in got.items()]
        out[f"lateness_s_{name}_watch"] = {
            "n": len(tl),
            "p50": round(pct(tl, 50) or 0, 3),
            "p99": round(pct(tl, 99) or 0, 3),
            "max": round(max(tl), 3) if tl else None,
            "within_1s": round(sum(x <= 1.0 for x in tl) / len(tl), 4) if tl else None,
            "early": sum(x < 0 for x in tl),
        }
    root_pairs = [(s, k) for s, k, _t in expiries]
    out["identical_seqs_on_tiers"] = {
        name: [(s, k) for s, k, _t in log_facts(tmp / name)[1]] == root_pairs for name, _ in tiers
    }
    # the writer's acks: alone before the load, and while keys expired
    before = [d for t, d in lat if t_base <= t < t_load]
    during = [d for t, d in lat if wave_start <= t < max(wave_end, wave_start + 1)]
    out["write_ack_ms"] = {
        "before_wave": _summary(before),
        "during_wave": _summary(during),
    }
    b99, d99 = pct(before, 99), pct(during, 99)
    out["write_p99_ratio"] = round(d99 / b99, 3) if b99 and d99 else None


def _summary(xs: list[float]) -> dict[str, Any]:
    return {
        "n": len(xs),
        "p50": round((pct(xs, 50) or 0) * 1000, 1),
        "p99": round((pct(xs, 99) or 0) * 1000, 1),
    }


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


if __name__ == "__main__":
    main()
