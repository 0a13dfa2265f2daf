"""What a pause between records costs the applier by itself (JSON).

A replica following a root that batches every 10 ms applies a record, then waits for the
next. This applies the same log records (four fresh 40 KiB values each, as a 10 ms batch at
16 MB/s holds) into fresh replica stores, opened and with the heap kept as the replica's
worker does, one record per transaction (fsync on), in one thread: back to back, and
with a pause of `--pause-ms` between two records, slept or spun; and with twice the pause
slept, then two records in one transaction (`sleep_pairs`: what an apply window of twice
the pause makes of a paced stream). Per record: the thread's
CPU inside the apply call only (`CLOCK_THREAD_CPUTIME_ID`, which is read to the
nanosecond; `getrusage`'s thread times only move at the scheduler's ticks), so the pause
itself is not counted; its minor page faults. Rounds alternate the modes; each figure is the median
round, each ratio a mode's CPU per record over back to back's.

Usage: .venv/bin/python bench/apply_pause.py [--records 400] [--rounds 3] [--pause-ms 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from replicator import heap  # noqa: E402
from store.ops import SET, Op  # noqa: E402
from store.store import Store  # noqa: E402

VALUE = 40 << 10
PER_RECORD = 4
MODES = ("back_to_back", "sleep", "spin", "sleep_pairs")
#: Records per transaction in each mode: `sleep_pairs` sleeps twice as long, then applies
#: two records in one transaction, as an apply window of twice the pause groups a paced
#: stream.
GROUP = {"sleep_pairs": 2}


def _pause(mode: str, seconds: float) -> None:
    if mode == "sleep":
        time.sleep(seconds)
    elif mode == "spin":  # the CPU stays busy: no idle state, no other task
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


def run(tmp: str, db_id: str, recs: list[Any], mode: str, pause_s: float) -> dict[str, float]:
    """Apply `recs` into a fresh store, one per transaction; CPU and faults per record."""
    path = tempfile.mkdtemp(prefix=f"{mode}-", dir=tmp)
    Store.create(path, db_id=db_id, sync=True, map_size=4 << 30).close()
    store = Store.open(path, sync=True, map_size=4 << 30, last_commit_durable=False)
    cpu = 0.0
    faults = 0
    try:
        group = GROUP.get(mode, 1)
        for i in range(0, len(recs), group):
            f0, c0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt, time.thread_time()
            store.apply_log_records(recs[i : i + group])
            cpu += time.thread_time() - c0
            faults += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
            _pause("sleep" if mode == "sleep_pairs" else mode, pause_s * group)
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    n = len(recs)
    mb = n * PER_RECORD * VALUE / 1e6
    return {
        "cpu_us_per_record": round(cpu / n * 1e6, 1),
        "cpu_ms_per_mb": round(cpu * 1e3 / mb, 2),
        "faults_per_record": round(faults / n, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pause-ms", type=float, default=10.0)
    a = ap.parse_args()
    heap.keep_freed_memory()  # as the worker does (replicator/heap.py)
    tmp = tempfile.mkdtemp(prefix="mercury-apply-pause-")
    try:
        root = Store.create(os.path.join(tmp, "root"), sync=False, map_size=4 << 30)
        for i in range(a.records):
            root.apply(
                [
                    Op(SET, f"k{i:06d}-{j}".encode(), os.urandom(VALUE), owner="bench")
                    for j in range(PER_RECORD)
                ]
            )
        recs = root.read_log(1, max_records=a.records + 1, max_bytes=1 << 30)
        db_id = root.db_id
        root.close()
        rounds: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for r in range(a.rounds):
            for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                rounds[mode].append(run(tmp, db_id, recs, mode, a.pause_ms / 1000))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(mode: str, key: str) -> float:
        return statistics.median(x[key] for x in rounds[mode])

    base = med("back_to_back", "cpu_us_per_record")
    print(
        json.dumps(
            {
                "bench": "apply_pause",
                "settings": {
                    "records": a.records,
                    "rounds": a.rounds,
                    "pause_ms": a.pause_ms,
                    "record_bytes": PER_RECORD * VALUE,
                },
                "load_avg": os.getloadavg()[0],
                "median": {m: {k: med(m, k) for k in rounds[m][0]} for m in MODES},
                "cpu_vs_back_to_back": {
                    m: round(med(m, "cpu_us_per_record") / base, 2) for m in MODES[1:]
                },
                "rounds": rounds,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
