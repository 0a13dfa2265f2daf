"""What the log's hash chain costs per MB, against the hashes a next format could use (JSON).

Every node hashes every log entry into the chain (`store/format.py`: BLAKE2b-256 of the
previous head and the entry), on the root when it writes and on each replica when it
applies, so the chain's cost is paid per byte of every value written. This times one link
(`codec.chain`, libsodium's BLAKE2b in the compiled codec) over entries of `--entry-bytes`
(40 KiB and 100 bytes by default), beside the same link computed with `hashlib`'s SHA-256
(OpenSSL: SHA extensions where the CPU has them) and `hashlib`'s BLAKE2b. Each link is
one Python-level step, so at 40 KiB the bytes dominate; at 100 bytes the call does, and
that row bounds the per-entry overhead more than the hash. Rounds alternate the
candidates; each figure is the best round, each ratio a candidate's time over the chain's.

Usage: .venv/bin/python bench/chain_hash.py [--mb 256] [--rounds 3] [--entry-bytes 40960,100]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from store import codec  # noqa: E402
from store.format import HASH_SIZE, ZERO_HASH  # noqa: E402


def _sha256(prev: bytes, entry: bytes) -> bytes:
    h = hashlib.sha256(prev)
    h.update(entry)
    return h.digest()


def _blake2b(prev: bytes, entry: bytes) -> bytes:
    h = hashlib.blake2b(prev, digest_size=HASH_SIZE)
    h.update(entry)
    return h.digest()


CANDIDATES: dict[str, Callable[[bytes, bytes], bytes]] = {
    "chain": codec.chain,
    "hashlib_sha256": _sha256,
    "hashlib_blake2b": _blake2b,
}


def seconds_per_mb(link: Callable[[bytes, bytes], bytes], entry: bytes, mb: float) -> float:
    """Seconds per 10^6 entry bytes chained with `link` (about `mb` MB hashed)."""
    n = max(1, int(mb * 1e6 / len(entry)))
    h = ZERO_HASH
    t0 = time.perf_counter()
    for _ in range(n):
        h = link(h, entry)
    return (time.perf_counter() - t0) / (n * len(entry) / 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=float, default=256.0, help="MB hashed per candidate and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--entry-bytes", default="40960,100")
    a = ap.parse_args()
    out: dict[str, object] = {
        "bench": "chain_hash",
        "codec": codec.IMPLEMENTATION,
        "settings": {"mb": a.mb, "rounds": a.rounds},
    }
    for size in [int(s) for s in a.entry_bytes.split(",")]:
        entry = os.urandom(size)
        # 100-byte entries cost per call, not per byte: hash a tenth as many MB of them.
        mb = a.mb if size >= 4096 else a.mb / 10
        best: dict[str, float] = {}
        for r in range(a.rounds):
            order = list(CANDIDATES) if r % 2 == 0 else list(reversed(CANDIDATES))
            for name in order:
                s = seconds_per_mb(CANDIDATES[name], entry, mb)
                best[name] = min(best.get(name, s), s)
        out[f"entry_{size}"] = {
            "ms_per_mb": {k: round(v * 1e3, 3) for k, v in best.items()},
            "vs_chain": {k: round(v / best["chain"], 3) for k, v in best.items() if k != "chain"},
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
