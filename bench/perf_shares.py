"""Where a profiled process spent its CPU, by library (prints JSON).

Reads `perf record` files (such as `read_under_write.py --perf DIR` or `apply_cost.py
--perf DIR` write) with `perf report --sort dso`, groups the shared objects into the parts
of a Mercury node (the kernel, CPython, the store codec, LMDB, snappy, the hashes, the
CRC, libc) and prints each group's share of the samples, per file and averaged over the
files given (each file weighs the same). Shares under 0.5 % of a file fall into "other".
``--by symbol`` gives each function's share instead (library and symbol, the 40 largest
of the mean, under 0.2 % of a file into "other").

Usage: .venv/bin/python bench/perf_shares.py FILE_OR_DIR [...] [--match SUBSTRING]
       [--by library|symbol]
(without a path it prints an empty summary: `make bench` runs every script bare)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

#: (group, substring of the shared object's path), first match wins.
GROUPS: tuple[tuple[str, str], ...] = (
    ("kernel", "[kernel"),
    ("cpython", "libpython"),
    ("store codec (Cython)", "store/_codec"),
    ("read fast path (Cython)", "reads/_fast"),
    ("py-lmdb and LMDB", "/lmdb/"),
    ("snappy (cramjam)", "cramjam"),
    ("uvloop", "uvloop"),
    ("SHA-256 (OpenSSL libcrypto)", "libcrypto"),
    ("BLAKE2b (libsodium)", "libsodium"),
    ("CRC-32 (libdeflate)", "libdeflate"),
    ("libc (memmove, malloc)", "libc.so"),
)
_LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S.*?)\s*$")


def _symbol(rest: str) -> str:
    """``library symbol`` from a `--sort dso,sym -v` line's text after the percentage."""
    parts = rest.split()
    lib = Path(parts[0]).name if parts else "?"
    sym = parts[-1] if len(parts) > 1 else "?"
    return f"{lib} {sym}"


def group_of(dso: str) -> str:
    for name, needle in GROUPS:
        if needle in dso:
            return name
    return "other"


def shares(path: Path, by_symbol: bool = False) -> dict[str, float]:
    """Percent of `path`'s samples per group (or per library and symbol)."""
    sort, limit = ("dso,sym", "0.2") if by_symbol else ("dso", "0.5")
    out = subprocess.run(
        ["perf", "report", "-i", str(path), "--stdio", "--sort", sort, "--no-children",
         "-g", "none", "-v", "--percent-limit", limit],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    got: dict[str, float] = {}
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            g = _symbol(m.group(2)) if by_symbol else group_of(m.group(2))
            got[g] = got.get(g, 0.0) + float(m.group(1))
    got["other"] = got.get("other", 0.0) + max(0.0, 100.0 - sum(got.values()))
    return {k: round(v, 1) for k, v in sorted(got.items(), key=lambda kv: -kv[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="*", help="perf.data files, or directories of *.perf files")
    ap.add_argument("--match", default="", help="only files whose name contains this")
    ap.add_argument("--by", choices=("library", "symbol"), default="library")
    a = ap.parse_args()
    files: list[Path] = []
    for p in map(Path, a.paths):
        files += sorted(p.glob("*.perf")) if p.is_dir() else [p]
    files = [f for f in files if a.match in f.name]
    if not a.paths:  # `make bench` runs every script bare: nothing to read, say how
        print(json.dumps({"files": 0, "usage": "perf_shares.py FILE_OR_DIR [...]"}))
        return
    if not files:
        raise SystemExit("no perf files")
    per = {f.name: shares(f, a.by == "symbol") for f in files}
    groups = {g for s in per.values() for g in s}
    mean = {g: round(sum(s.get(g, 0.0) for s in per.values()) / len(per), 2) for g in groups}
    if a.by == "symbol":  # the largest only; per file they are in "per_file"
        mean = dict(sorted(mean.items(), key=lambda kv: -kv[1])[:40])
    print(
        json.dumps(
            {
                "files": len(per),
                "mean_percent": dict(sorted(mean.items(), key=lambda kv: -kv[1])),
                "per_file": per,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
