"""Not a system: the machine. What a pause costs the work that follows it, with nothing of
ours running in between.

The same small piece of work — copy a working set (`--set-mb`, 2 MB) and hash a quarter of
it with SHA-256, an applier's copy and chain hash in miniature — is timed on its own
thread's CPU clock, back to back and after a pause of each `--pauses-ms`, in three modes:

- ``spin``: the thread busy-waits through the pause (no idle state, no other task of ours;
  the loop touches a few cache lines of its own);
- ``touch``: the thread reads the working set again and again through the pause (kept warm);
- ``sleep``: the thread sleeps (the CPU may idle; on a VM its vCPU may halt).

On a machine whose caches are its own, ``spin`` should cost nothing: nothing else touched the
caches. Where a pause makes the next piece slower under ``spin`` and ``touch`` does not,
something outside this process evicted the working set meanwhile (a VM host's other
guests on the shared caches) — a cost a paced stream's applier pays per record whatever
its code does (`docs/reads.md`, "Apply cost"). `bench/apply_pause.py` measures the same
pauses on the replica's real apply.

Prints one JSON document: settings, each mode's median µs per piece per pause, and the
ratio of each to back to back. Bounded: `--pieces` pieces per mode and pause. Run it
pinned (`taskset -c 1 ...`) so the thread stays on one CPU.

Usage: .venv/bin/python bench/cache_decay.py [--set-mb 2] [--pieces 150]
       [--pauses-ms 1,3,10,30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable

MODES = ("spin", "touch", "sleep")


class Piece:
    """The timed work and its working set."""

    def __init__(self, set_bytes: int) -> None:
        self.src = bytearray(os.urandom(set_bytes))
        self.dst = bytearray(set_bytes)
        self.hashed = memoryview(self.dst)[: set_bytes // 4]

    def work(self) -> None:
        self.dst[:] = self.src
        hashlib.sha256(self.hashed).digest()

    def warm(self) -> None:
        """Read the whole working set (what ``touch`` repeats through a pause): a byte count
        scans it and writes nothing (a copy would also write a fresh buffer)."""
        self.src.count(0)
        self.dst.count(0)


def pause(mode: str, seconds: float, piece: Piece) -> None:
    if mode == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    step: Callable[[], object] = piece.warm if mode == "touch" else time.perf_counter
    while time.perf_counter() < end:
        step()


def timed(piece: Piece, mode: str, pause_s: float, pieces: int) -> float:
    """Median µs of thread CPU per piece, each piece after a pause of `pause_s`."""
    xs = []
    for _ in range(pieces):
        t = time.thread_time_ns()
        piece.work()
        xs.append(time.thread_time_ns() - t)
        if pause_s:
            pause(mode, pause_s, piece)
    return statistics.median(xs) / 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--set-mb", type=float, default=2.0)
    ap.add_argument("--pieces", type=int, default=150)
    ap.add_argument("--pauses-ms", default="1,3,10,30")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    pauses = [float(p) for p in a.pauses_ms.split(",") if p]
    piece = Piece(int(a.set_mb * (1 << 20)))
    runs: dict[str, list[float]] = {}
    for r in range(a.rounds):
        # Back to back and every mode and pause in each round, the order reversed every
        # other round, so a drift of the machine falls on all of them alike.
        cases = [("back_to_back", 0.0)] + [(m, p) for m in MODES for p in pauses]
        for mode, p in cases if r % 2 == 0 else reversed(cases):
            label = mode if mode == "back_to_back" else f"{mode}_{p:g}ms"
            runs.setdefault(label, []).append(timed(piece, mode, p / 1000, a.pieces))
    med = {k: round(statistics.median(v), 1) for k, v in runs.items()}
    base = med["back_to_back"]
    doc = {
        "bench": "cache_decay",
        "settings": {
            "set_mb": a.set_mb,
            "pieces": a.pieces,
            "pauses_ms": pauses,
            "rounds": a.rounds,
            "cpus": sorted(os.sched_getaffinity(0)),
        },
        "us_per_piece": med,
        "over_back_to_back": {k: round(v / base, 2) for k, v in med.items() if k != "back_to_back"},
        "rounds": runs,
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
