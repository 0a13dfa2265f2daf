"""What publishing the replica's status costs the worker: in place against by rename (JSON).

The worker publishes `DATA_DIR/replication.json` up to 20 times a second, on the core that
serves reads (`replicator/status.py`). This times `StatusBoard.flush` — the document
rewritten in place — against the same document written the way it was before: a temp file
renamed over the old one (the baseline below: same document, same directory). Per flush:
this process's CPU (user + system) and wall time; rounds alternate the two.

Usage: .venv/bin/python bench/status_flush.py [--flushes N] [--rounds R] [--dir DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from replicator.status import StatusBoard, status_path  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def by_rename(board: StatusBoard) -> None:
    """The baseline: the earlier release's flush (temp file + rename)."""
    board.status.updated_us = time.time_ns() // 1000
    board.status.cpu_seconds = time.process_time()
    os.makedirs(board.data_dir, exist_ok=True)
    path = status_path(board.data_dir)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(asdict(board.status), f)
    os.replace(tmp, path)


def measure(board: StatusBoard, flush: Callable[[], None], n: int) -> dict[str, float]:
    t0, c0 = time.perf_counter(), _cpu()
    for i in range(n):
        board.status.applied_seq = i
        flush()
    return {
        "cpu_us": round((_cpu() - c0) / n * 1e6, 1),
        "wall_us": round((time.perf_counter() - t0) / n * 1e6, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--flushes", type=int, default=2000, help="flushes per round and way")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="directory on the filesystem to measure")
    a = ap.parse_args()
    if not 1 <= a.flushes <= 100_000 or not 1 <= a.rounds <= 50:
        ap.error("--flushes 1-100000, --rounds 1-50")
    runs: dict[str, list[dict[str, float]]] = {"in_place": [], "by_rename": []}
    with tempfile.TemporaryDirectory(prefix="status-flush-", dir=a.dir) as d:
        for r in range(a.rounds):
            ways = ["in_place", "by_rename"] if r % 2 == 0 else ["by_rename", "in_place"]
            for way in ways:
                sub = os.path.join(d, way)
                board = StatusBoard(sub)
                board.status.error = "x" * 40  # a document of the usual size
                fn = board.flush if way == "in_place" else functools.partial(by_rename, board)
                runs[way].append(measure(board, fn, a.flushes))
                board.close()
    med = {w: statistics.median(x["cpu_us"] for x in v) for w, v in runs.items()}
    out = {
        "settings": {"flushes": a.flushes, "rounds": a.rounds, "kernel": os.uname().release},
        "cpu_us_per_flush_median": med,
        "wall_us_per_flush_median": {
            w: statistics.median(x["wall_us"] for x in v) for w, v in runs.items()
        },
        "cpu_ratio_in_place_vs_rename": round(med["in_place"] / med["by_rename"], 3),
        "rounds": runs,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
