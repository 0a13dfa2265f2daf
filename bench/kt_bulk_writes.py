"""Write acknowledgements on a root while its KT listener serves big `get_bulk` calls.

A real root (`--kt-listen`, the default 500 ms batch window unless `--window-ms`) over a
store preloaded with `--keys` keys; one producer PUTs one key at a time and times each
acknowledgement, while 0, 1 and 3 (`--bulk`) clients call KT's `get_bulk` for all the
keys back to back. Phases interleave over `--rounds`. Prints JSON: ack P50/P99 per phase
and the ratio to the phase without bulk reads, and how many get_bulk calls completed.

    .venv/bin/python bench/kt_bulk_writes.py [--keys 1000000] [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs, free_port, run_mercury
from testkit.wait import wait_until


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _preload(data: Path, keys: int) -> None:
    store = Store.open(str(data), sync=False)
    try:
        step = 20_000
        for b in range(0, keys, step):
            store.apply(
                [
                    Op(SET, b"k%09d" % i, b"v%d" % i, owner="bench")
                    for i in range(b, min(keys, b + step))
                ]
            )
    finally:
        store.close()


def _phase(
    url: str, token: str, kt: int, body: bytes, bulk: int, seconds: float, tag: str
) -> dict[str, Any]:
    stop = threading.Event()
    bulk_done: list[float] = []

    def reader() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{kt}", timeout=300) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                r = c.post(
                    "/rpc/get_bulk",
                    content=body,
                    headers={"Content-Type": "text/tab-separated-values"},
                )
                assert r.status_code == 200, r.status_code
                bulk_done.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(bulk)]
    for t in threads:
        t.start()
    if bulk:
        time.sleep(1.0)  # deliberate: the bulk calls are under way before timing writes
    acks: list[float] = []
    h = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=60) as c:
        i = 0
        while time.monotonic() < deadline:  # bounded in time
            t0 = time.perf_counter()
            r = c.put(f"/v1/kv/w/{tag}-{i}", content=b"x", headers=h)
            assert r.status_code in (200, 201), r.text
            acks.append(time.perf_counter() - t0)
            i += 1
    stop.set()
    for t in threads:
        t.join(300)
    return {
        "acks": len(acks),
        "ack_p50_s": round(_pct(acks, 0.5), 4),
        "ack_p99_s": round(_pct(acks, 0.99), 4),
        "ack_max_s": round(max(acks), 4),
        "get_bulk_done": len(bulk_done),
        "get_bulk_p50_s": round(statistics.median(bulk_done), 3) if bulk_done else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bulk", default="0,1,3", help="concurrent get_bulk clients per phase")
    ap.add_argument("--window-ms", type=int, default=500)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    phases = [int(x) for x in args.bulk.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        data = d / "root"
        r = run_mercury("init", str(data))
        assert r.returncode == 0, r.stderr
        _preload(data, args.keys)
        (d / "logs").mkdir()
        procs = Procs(d / "logs")
        try:
            gw, kt = free_port(), free_port()
            root = procs.start_mercury(
                "root", str(data), "--listen", f"127.0.0.1:{gw}", "--repl-listen",
                f"127.0.0.1:{free_port()}", "--kt-listen", f"127.0.0.1:{kt}",
                "--batch-window-ms", str(args.window_ms), name="root",
            )  # fmt: skip
            url = f"http://127.0.0.1:{gw}"

            def up() -> bool:
                assert root.poll() is None, "root exited"
                try:
                    return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(up, 120, "root up")
            admin = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
            r2 = httpx.put(
                f"{url}/v1/admin/producers/bw", json={"keyspaces": ["w/"]}, headers=admin
            )
            assert r2.status_code in (200, 201), r2.text
            token = httpx.post(f"{url}/v1/admin/producers/bw/tokens", headers=admin).json()["token"]
            body = b"".join(b"_k%09d\t\n" % i for i in range(args.keys))
            runs: dict[str, list[dict[str, Any]]] = {str(b): [] for b in phases}
            for rnd in range(args.rounds):
                for b in phases if rnd % 2 == 0 else phases[::-1]:
                    res = _phase(url, token, kt, body, b, args.seconds, f"r{rnd}b{b}")
                    runs[str(b)].append(res)
                    print(f"round {rnd + 1} bulk={b}: {json.dumps(res)}", file=sys.stderr)
            procs.terminate(root)
        finally:
            procs.stop_all()
    base = statistics.median(x["ack_p99_s"] for x in runs[str(phases[0])])
    out = {
        "keys": args.keys,
        "window_ms": args.window_ms,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "runs": runs,
        "ack_p50_s": {b: statistics.median(x["ack_p50_s"] for x in v) for b, v in runs.items()},
        "ack_p99_s": {b: statistics.median(x["ack_p99_s"] for x in v) for b, v in runs.items()},
        "ack_p99_over_no_bulk": {
            b: round(statistics.median(x["ack_p99_s"] for x in v) / base, 3)
            for b, v in runs.items()
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
