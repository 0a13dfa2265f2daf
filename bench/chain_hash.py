"""What the log's hash chain costs per MB with each chain hash a store can name (JSON).

Every node hashes every log entry into the chain (`store/format.py`: H of the previous head
and the entry), on the root when it writes and on each replica when it applies, so the
chain's cost is paid per byte of every value written. A store names its hash when its
lineage begins (`store/chainhash.py`): SHA-256 (OpenSSL) or BLAKE2b-256 (libsodium).

This times the replica's own pass, `codec.scan_entries` (check every entry, fold it into
the chain, in C), over one payload of entries of `--entry-bytes` (40 KiB and 100-byte
values by default), once per chain hash, rounds alternating the order; each figure is the
best round, `sha256_vs_blake2b` the ratio of the two. Run with `--without-sha-extensions`
it also runs the same in a child process where OpenSSL is told the CPU has no SHA
extensions (``OPENSSL_ia32cap``, x86 only): what `mercury init`'s choice guards against on
such CPUs. The scan also checks each entry's header, the same work under both hashes.

``decode`` times what a watch stream's reader does with each record (`reads/watch.py`):
decode its entries into Python objects, which `codec.decode_entries` does without the
chain (checked when the record was applied), against `codec.unpack_entries`, which decodes
and chains (what the reader called before), with each hash.

Usage: .venv/bin/python bench/chain_hash.py [--mb 256] [--rounds 3] [--entry-bytes 40960,100]
       [--without-sha-extensions]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from core.cpuflags import cpu_flags  # noqa: E402
from store import chainhash, codec  # noqa: E402
from store import format as fmt  # noqa: E402

# OpenSSL's CPU capability mask: clear bit 29 of the second word (CPUID leaf 7 EBX, SHA).
NO_SHA_EXT = ":~0x20000000"
PAYLOAD_MB = 16  # one payload this big, scanned as often as `--mb` asks


def payload_of(value_bytes: int) -> tuple[bytes, int]:
    """A payload of entries with `value_bytes`-byte values (about PAYLOAD_MB MB) and its
    entry count."""
    n = max(1, PAYLOAD_MB * 1_000_000 // (value_bytes + 30))
    value = os.urandom(value_bytes)
    ops = [(fmt.OP_SET, b"team-a", b"cfg/%08d" % i, value) for i in range(n)]
    payload, _ = codec.pack_entries(1, ops, fmt.ZERO_HASH)
    return payload, n


def ms_per_mb(payload: bytes, n: int, alg: int, mb: float) -> float:
    """Milliseconds per 10^6 payload bytes scanned and chained with `alg`."""
    return _timed(lambda: codec.scan_entries(payload, fmt.ZERO_HASH, 1, n, alg), payload, mb)


def _timed(fn: Callable[[], object], payload: bytes, mb: float) -> float:
    """Milliseconds per 10^6 bytes of `payload` for `fn`, called about `mb` MB's worth."""
    reps = max(1, round(mb * 1e6 / len(payload)))
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / (reps * len(payload) / 1e6)


def decode_ms_per_mb(payload: bytes, mb: float, rounds: int) -> dict[str, float]:
    """A watch reader's decode per MB: without the chain, and with each hash's chain."""
    cases: dict[str, Callable[[], object]] = {
        "decode_entries": lambda: codec.decode_entries(payload)
    }
    for name in sorted(chainhash.BY_NAME):
        alg = chainhash.code(name)
        cases[f"unpack_entries_{name}"] = lambda alg=alg: codec.unpack_entries(  # type: ignore[misc]
            payload, fmt.ZERO_HASH, alg
        )
    best: dict[str, float] = {}
    for r in range(rounds):
        for name in cases if r % 2 == 0 else reversed(list(cases)):
            t = _timed(cases[name], payload, mb)
            best[name] = min(best.get(name, t), t)
    return {k: round(v, 3) for k, v in best.items()}


def measure(sizes: list[int], mb: float, rounds: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for size in sizes:
        payload, n = payload_of(size)
        best: dict[str, float] = {}
        for r in range(rounds):
            names = sorted(chainhash.BY_NAME)
            for name in names if r % 2 == 0 else reversed(names):
                t = ms_per_mb(payload, n, chainhash.code(name), mb)
                best[name] = min(best.get(name, t), t)
        out[f"values_{size}"] = {
            "entries": n,
            "ms_per_mb": {k: round(v, 3) for k, v in best.items()},
            "ns_per_entry": {k: round(v * 1e6 * len(payload) / 1e6 / n) for k, v in best.items()},
            "sha256_vs_blake2b": round(best["sha256"] / best["blake2b-256"], 3),
            "decode_ms_per_mb": decode_ms_per_mb(payload, mb / 4, rounds),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=float, default=256.0, help="MB scanned per hash and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--entry-bytes", default="40960,100", help="value sizes, comma-separated")
    ap.add_argument("--without-sha-extensions", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if codec.IMPLEMENTATION != "cython":
        sys.exit("build the compiled codec first (make build): this times the C pass")
    sizes = [int(s) for s in a.entry_bytes.split(",")]
    result = measure(sizes, a.mb, a.rounds)
    if a.child:
        print(json.dumps(result))
        return
    out: dict[str, object] = {
        "bench": "chain_hash",
        "settings": {"mb": a.mb, "rounds": a.rounds},
        "cpu_has_sha_extensions": chainhash.pick(cpu_flags()) == "sha256",
        "with_cpu_as_is": result,
    }
    if a.without_sha_extensions:
        env = dict(os.environ, OPENSSL_ia32cap=NO_SHA_EXT)
        argv = [sys.executable, __file__, "--child", "--mb", str(a.mb)]
        argv += ["--rounds", str(a.rounds), "--entry-bytes", a.entry_bytes]
        child = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        out["without_sha_extensions"] = json.loads(child.stdout)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
