"""Store apply throughput and write amplification, side by side in one run (prints JSON).

- pairs/s committed by `Store.apply()` (Cython codec and pure-Python reference) for 100-byte
  values in batches of 1,000 and 10,000, beside raw py-lmdb puts of the same pairs in one
  transaction per batch (no log, no CRC), all with fsync on commit;
  for new keys in ascending order (a bulk load), new keys in random order, and random
  overwrites of an N-key store (`--keys`, default 1,000,000).
- write amplification: bytes this process wrote to disk (/proc/self/io write_bytes) per
  logical byte (key + value) for overwrites of random existing keys in batches of 1, 100 and
  10,000, beside raw py-lmdb doing the same overwrites.
- ``--shuffled-runs S`` (off by default): why the batcher sorts a batch by key. For S seconds
  each, `Store.apply` (Cython codec) of 16,000-op batches made of 16 runs of 1,000
  consecutive new keys in shuffled order (what 16 concurrent bulk loaders produce in one
  window), applied as they come and sorted by key: pairs/s per 5-second slice and bytes of
  LMDB file per stored pair.

Usage: .venv/bin/python bench/store_apply.py [--keys N] [--pairs N] [--quick]
       [--shuffled-runs SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import lmdb

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is not an installed package
    sys.path.insert(0, str(REPO))

from store import codec  # noqa: E402
from store.ops import SET, Op  # noqa: E402
from store.store import Store  # noqa: E402
from testkit import procstat  # noqa: E402

VALUE = 100
MAP = 16 << 30


def write_bytes() -> int:
    """Bytes this process has caused to be written to storage so far."""
    return procstat.write_bytes(os.getpid())


def keys_for(n: int) -> list[bytes]:
    """n distinct 16-byte keys in ascending order."""
    return [b"key:%012d" % i for i in range(n)]


class Raw:
    """Raw py-lmdb: the same pairs, one transaction per batch, no log, no CRC."""

    def __init__(self, path: str) -> None:
        self.env = lmdb.open(path, map_size=MAP, sync=True, metasync=True, readahead=False)

    def write(self, pairs: list[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            for k, v in pairs:
                txn.put(k, v)

    def load(self, pairs: list[tuple[bytes, bytes]]) -> None:
        # Same transaction sizes as `Ours.load`: LMDB's page layout and free list after the
        # load decide much of what later small commits write, so both start alike.
        for i in range(0, len(pairs), 10_000):
            self.write(pairs[i : i + 10_000])

    def close(self) -> None:
        self.env.close()


class Ours:
    """`Store.apply` with the chosen codec."""

    def __init__(self, path: str, impl: str) -> None:
        codec.use(impl)
        self.store = Store.create(path, map_size=MAP, sync=True)

    def write(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self.store.apply([Op(SET, k, v, "bench") for k, v in pairs])

    def load(self, pairs: list[tuple[bytes, bytes]]) -> None:
        for i in range(0, len(pairs), 10_000):
            self.write(pairs[i : i + 10_000])

    def close(self) -> None:
        self.store.close()


def make(kind: str, path: str) -> Raw | Ours:
    return Raw(path) if kind == "raw" else Ours(path, kind)


def timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_batches(target: Raw | Ours, pairs: list[tuple[bytes, bytes]], batch: int) -> float:
    def go() -> None:
        for i in range(0, len(pairs), batch):
            target.write(pairs[i : i + batch])

    return len(pairs) / timed(go)


def throughput(args: argparse.Namespace, tmp: str, kinds: list[str]) -> dict[str, object]:
    rnd = random.Random(1)
    out: dict[str, object] = {}
    n = args.pairs
    asc = [(k, rnd.randbytes(VALUE)) for k in keys_for(n)]
    shuffled = asc[:]
    rnd.shuffle(shuffled)
    for batch in (1_000, 10_000):
        for name, pairs in (("insert_ascending", asc), ("insert_random", shuffled)):
            row = {}
            for kind in kinds:
                d = tempfile.mkdtemp(dir=tmp)
                t = make(kind, d)
                row[kind] = round(run_batches(t, pairs, batch))
                t.close()
                shutil.rmtree(d)
            _ratios(row)
            out[f"{name}_batch{batch}_pairs_per_s"] = row
    # random overwrites of an N-key store, 10,000-key transactions
    base = [(k, rnd.randbytes(VALUE)) for k in keys_for(args.keys)]
    over = [(base[rnd.randrange(args.keys)][0], rnd.randbytes(VALUE)) for _ in range(args.over)]
    row = {}
    for kind in kinds:
        d = tempfile.mkdtemp(dir=tmp)
        t = make(kind, d)
        t.load(base)
        row[kind] = round(run_batches(t, over, 10_000))
        t.close()
        shutil.rmtree(d)
    _ratios(row)
    out[f"overwrite_random_{args.keys}_keys_batch10000_pairs_per_s"] = row
    return out


def amplification(args: argparse.Namespace, tmp: str) -> dict[str, object]:
    rnd = random.Random(2)
    base = [(k, rnd.randbytes(VALUE)) for k in keys_for(args.wa_keys)]
    out: dict[str, object] = {}
    for batch, ops in ((1, 2_000), (100, 20_000), (10_000, 100_000)):
        samples: dict[str, list[float]] = {"raw": [], "cython": []}
        # The same overwrites (keys, order, values) for every run, each from the same loaded
        # state: only the writer differs.
        pairs = [(base[rnd.randrange(len(base))][0], rnd.randbytes(VALUE)) for _ in range(ops)]
        logical = sum(len(k) + len(v) for k, v in pairs)
        # ABBA order: what a run writes depends on the state the previous one left in the
        # page cache and file system, so each side runs once first and once second.
        for kind in ("raw", "cython", "cython", "raw"):
            d = tempfile.mkdtemp(dir=tmp)
            t = make(kind, d)
            t.load(base)
            before = write_bytes()
            run_batches(t, pairs, batch)
            samples[kind].append((write_bytes() - before) / logical)
            t.close()
            shutil.rmtree(d)
        row = {f"{k}_bytes_per_logical_byte": round(sum(v) / len(v), 2) for k, v in samples.items()}
        row["ours_vs_raw"] = round(
            row["cython_bytes_per_logical_byte"] / row["raw_bytes_per_logical_byte"], 3
        )
        out[f"overwrite_batch{batch}"] = row
    return out


def dir_bytes(path: str) -> int:
    """Bytes of the files in directory `path` (the LMDB data and lock files)."""
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


def shuffled_runs(seconds: float, tmp: str) -> dict[str, object]:
    """16,000-op batches of 16 shuffled runs of 1,000 new consecutive keys, unsorted vs
    sorted by key (same keys, values and batches for both: one seed)."""
    out: dict[str, object] = {"batch_ops": 16_000, "runs_per_batch": 16, "seconds": seconds}
    codec.use("cython")
    for label, sort in (("unsorted", False), ("sorted_by_key", True)):
        d = tempfile.mkdtemp(dir=tmp)
        store = Store.create(d, map_size=MAP, sync=True)
        rnd = random.Random(4)
        first_run = n = slice_n = 0
        slices: list[int] = []
        t0 = slice_t = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            runs = list(range(first_run, first_run + 16))
            first_run += 16
            rnd.shuffle(runs)
            ops = [
                Op(SET, b"key:%012d" % (r * 1000 + j), rnd.randbytes(VALUE), "bench")
                for r in runs
                for j in range(1000)
            ]
            if sort:
                ops.sort(key=lambda o: o.key)
            store.apply(ops)
            n += len(ops)
            slice_n += len(ops)
            now = time.perf_counter()
            if now - slice_t >= 5.0:
                slices.append(round(slice_n / (now - slice_t)))
                slice_t, slice_n = now, 0
        dt = time.perf_counter() - t0
        store.close()
        out[label] = {
            "pairs": n,
            "pairs_per_s": round(n / dt),
            "pairs_per_s_per_5s_slice": slices,
            "file_bytes_per_pair": round(dir_bytes(d) / n, 1),
        }
        shutil.rmtree(d)
    return out


def codec_speed() -> dict[str, object]:
    """µs per call of each hot codec function, Cython beside the pure-Python reference."""
    import timeit

    from store import _codec as cy
    from store import format as ref

    rnd = random.Random(3)
    ops = [(1, b"bench", b"key:%012d" % i, rnd.randbytes(VALUE)) for i in range(10_000)]
    rec = ref.encode_record(b"bench-key", 5, b"bench", ops[0][3], False)
    payload, _ = ref.pack_entries(1, ops, ref.ZERO_HASH)
    out: dict[str, object] = {}
    cases: dict[str, tuple[Callable[[Any], object], int, int]] = {
        "encode_record": (
            lambda m: [m.encode_record(o[2], 5, b"bench", o[3], False) for o in ops],
            5,
            len(ops),
        ),
        "record_value": (lambda m: m.record_value(b"bench-key", rec), 100_000, 1),
        "decode_record_header": (lambda m: m.decode_record_header(rec), 100_000, 1),
        "pack_entries_per_entry": (lambda m: m.pack_entries(1, ops, ref.ZERO_HASH), 5, len(ops)),
        "unpack_entries_per_entry": (
            lambda m: m.unpack_entries(payload, ref.ZERO_HASH),
            5,
            len(ops),
        ),
    }
    for name, (fn, number, per) in cases.items():
        t_cy = min(timeit.repeat(partial(fn, cy), number=number, repeat=3)) / number / per
        t_py = min(timeit.repeat(partial(fn, ref), number=number, repeat=3)) / number / per
        out[name] = {
            "cython_us": round(t_cy * 1e6, 3),
            "python_us": round(t_py * 1e6, 3),
            "cython_speedup": round(t_py / t_cy, 2),
        }
    return out


def _ratios(row: dict[str, int]) -> None:
    if "raw" in row:
        for k in ("cython", "python"):
            if k in row:
                row[f"{k}_vs_raw"] = round(row[k] / row["raw"], 3)  # type: ignore[assignment]
    if "cython" in row and "python" in row:
        row["cython_vs_python"] = round(row["cython"] / row["python"], 2)  # type: ignore[assignment]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pairs", type=int, default=200_000, help="pairs per insert run")
    ap.add_argument("--keys", type=int, default=1_000_000, help="store size for overwrites")
    ap.add_argument("--over", type=int, default=100_000, help="overwrites per run")
    ap.add_argument("--wa-keys", type=int, default=200_000, help="store size for amplification")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument(
        "--shuffled-runs",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also run the shuffled-runs batches, unsorted vs sorted, SECONDS each (e.g. 30)",
    )
    args = ap.parse_args()
    if args.quick:
        args.pairs, args.keys, args.over, args.wa_keys = 20_000, 50_000, 20_000, 20_000
    tmp = tempfile.mkdtemp(prefix="mercury-bench-")
    try:
        result = {
            "bench": "store_apply",
            "value_bytes": VALUE,
            "sync": True,
            "codec": codec_speed(),
            "throughput": throughput(args, tmp, ["raw", "cython", "python"]),
            "write_amplification": amplification(args, tmp),
        }
        if args.shuffled_runs:
            result["shuffled_runs"] = shuffled_runs(args.shuffled_runs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        codec.use("cython")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
