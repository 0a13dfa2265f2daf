"""`mercury sim`: a deterministic simulation of the replication tree (`sim/`,
docs/replication.md): prints one JSON report; exit 1 when an invariant failed."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from core.errors import ConfigError
from sim.faults import KINDS, parse_kinds


def register(sub: Any) -> None:
    """Add `mercury sim` to the `mercury` parser."""
    p = sub.add_parser(
        "sim",
        help="simulate a replication tree of N nodes on a virtual clock (one JSON report)",
        description="Runs the production replication code (source, client, source "
        "selection, heartbeats, lag, bootstrap) for N nodes in one process over an "
        "in-memory network on a virtual clock, with faults drawn from --seed: the same "
        "arguments print the same report. Checks that no node applies a gap, a replay or "
        "a corrupt record, that every node converges to the root's seq and hash head "
        "after the faults, that no source-selection cycle forms and that reported lag "
        "is the real lag; a violation is printed with the seed and the events that led "
        "to it (exit status 1).",
    )
    p.add_argument("--nodes", type=int, default=20, help="nodes, the root included (default 20)")
    p.add_argument("--tiers", type=int, default=3, help="tiers, the root's included (default 3)")
    p.add_argument("--seed", type=int, default=1, help="the run's seed (default 1)")
    p.add_argument(
        "--virtual-seconds", type=float, default=60.0, help="virtual seconds of writes (default 60)"
    )
    p.add_argument(
        "--faults",
        default="",
        help=f"comma-separated fault kinds, or all: {','.join(KINDS)} (default: none)",
    )
    p.add_argument(
        "--fault-rate",
        type=float,
        help="faults per virtual second over the tree (default: nodes/600, each replica "
        "about once in ten virtual minutes)",
    )
    p.add_argument(
        "--write-rate", type=float, default=2.0, help="root batches per virtual second (default 2)"
    )
    p.add_argument("--batch", type=int, default=10, help="ops per batch (default 10)")
    p.add_argument("--value-bytes", type=int, default=100, help="bytes per value (default 100)")
    p.add_argument(
        "--retain-records",
        type=int,
        default=0,
        help="log records every node keeps (default 0: all); a node down longer bootstraps",
    )
    p.add_argument(
        "--timing",
        action="store_true",
        help="add wall_seconds to the report (which then differs run to run)",
    )
    p.set_defaults(func=_sim)


def _sim(args: argparse.Namespace) -> int:
    # Imported here: every other command's start stays free of the whole replication stack.
    from sim.run import Params, simulate

    try:
        kinds = parse_kinds(args.faults)
    except ValueError as err:
        raise ConfigError(f"--faults: {err}") from None
    if args.nodes < args.tiers or args.tiers < 2:
        raise ConfigError("--tiers must be at least 2 and --nodes at least --tiers")
    if args.virtual_seconds <= 0:
        raise ConfigError("--virtual-seconds must be positive")
    params = Params(
        nodes=args.nodes,
        tiers=args.tiers,
        seed=args.seed,
        virtual_seconds=args.virtual_seconds,
        faults=kinds,
        fault_rate=args.fault_rate,
        write_rate=args.write_rate,
        batch=args.batch,
        value_bytes=args.value_bytes,
        retain_records=args.retain_records,
    )
    doc = simulate(params, timing=args.timing)
    sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    return 0 if doc["invariants_ok"] else 1
