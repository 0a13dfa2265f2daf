"""A sweep: one simulation per seed (`make sim`, tests/sim); prints one JSON summary —
the failing seeds with their first violation and the command that replays each.

    python -m sim.sweep --seeds 200 --nodes 50 --tiers 4 --virtual-seconds 120 --faults all
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any

import orjson

from sim.faults import parse_kinds
from sim.run import Params, simulate


def sweep(base: Params, seeds: range) -> dict[str, Any]:
    """Run `base` under every seed of `seeds`; the summary of what failed."""
    failed = []
    faults = 0
    for seed in seeds:
        doc = simulate(replace(base, seed=seed))
        faults += sum(doc["faults"].values())
        if not doc["invariants_ok"]:
            failed.append(
                {"seed": seed, "violation": doc["violations"][0], "replay": doc["replay"]}
            )
    return {
        "seeds": len(seeds),
        "first_seed": seeds.start,
        "nodes": base.nodes,
        "tiers": base.tiers,
        "virtual_seconds": base.virtual_seconds,
        "faults_injected": faults,
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.sweep", description=__doc__)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--tiers", type=int, default=4)
    ap.add_argument("--virtual-seconds", type=float, default=120.0)
    ap.add_argument("--faults", default="all")
    ap.add_argument("--fault-rate", type=float)
    ap.add_argument("--retain-records", type=int, default=100)
    a = ap.parse_args(argv)
    base = Params(
        nodes=a.nodes,
        tiers=a.tiers,
        virtual_seconds=a.virtual_seconds,
        faults=parse_kinds(a.faults),
        fault_rate=a.fault_rate,
        retain_records=a.retain_records,
    )
    started = time.perf_counter()
    doc = sweep(base, range(a.first_seed, a.first_seed + a.seeds))
    doc["wall_seconds"] = round(time.perf_counter() - started, 3)
    sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
