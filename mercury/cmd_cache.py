"""`mercury cache`: a cache node (registered by `mercury.cli`)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from mercury import tls
from net import http_bounds
from net.tcp import add_listener_flags

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a size: ``1048576``, ``64M``, ``64MiB``, ``1.5G`` (powers of 1024)."""
    m = _SIZE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64MiB, 1G, 1048576)")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 1 << 20:
        raise argparse.ArgumentTypeError(f"--max-bytes must be at least 1 MiB, got {text!r}")
    return n


def register(sub: Any) -> None:
    """Add the `cache` command to the `mercury` parser."""
    p = sub.add_parser(
        "cache",
        help="a cache node: serve reads, holding only what is read, kept fresh by invalidations",
        description=(
            "Serve point and bulk reads like a replica, holding only the keys read (an LMDB "
            "cache bounded by --max-bytes, kept across restarts), kept consistent by the "
            "invalidation stream of the first reachable --source; misses are fetched from it."
        ),
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="the cache's directory")
    p.add_argument(
        "--source",
        action="append",
        required=True,
        metavar="H:P[,H:P...]",
        help="replication source(s), tried in order (repeat or comma-separate)",
    )
    p.add_argument(
        "--max-bytes",
        required=True,
        type=parse_size,
        metavar="SIZE",
        help="bytes of keys and values held (e.g. 512MiB; at least 1 MiB)",
    )
    p.add_argument("--listen", default="127.0.0.1:8082", metavar="H:P", help="HTTP read API")
    p.add_argument(
        "--memcached-listen",
        default=None,
        metavar="H:P",
        help="memcached text protocol reads (get, gets) on H:P (default: none)",
    )
    p.add_argument(
        "--kt-listen",
        default=None,
        metavar="H:P",
        help="Kyoto Tycoon reads (REST GET/HEAD, RPC get/check/get_bulk, binary get_bulk) "
        "on H:P (default: none)",
    )
    p.add_argument(
        "--kt-db-alias",
        action="append",
        default=[],
        metavar="NAME",
        help="a KT database name accepted as database 0 (repeatable; e.g. casket.kch)",
    )
    p.add_argument(
        "--max-lag",
        type=float,
        default=None,
        metavar="S",
        help="past this many seconds behind the root, /v1/status says lagging (default: never)",
    )
    p.add_argument(
        "--refuse-when-lagging",
        action="store_true",
        help="with --max-lag: while lagging, answer reads 503 + Retry-After",
    )
    http_bounds.add_flags(p)
    add_listener_flags(p)  # the memcached and KT listeners' bounds, as a replica's
    tls.add_arguments(p)  # mutual TLS to its sources (a replica-role certificate), HTTPS
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from mercury.cachenode import run_cache

    return run_cache(args)
