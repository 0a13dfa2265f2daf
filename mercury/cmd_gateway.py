"""Commands of the gateway side: `root` (docs/api.md lists every command; `acl` is
`mercury/cmd_acl.py`, `usage` is `mercury/cmd_usage.py`)."""

from __future__ import annotations

import argparse
from typing import Any

from mercury import ha_flags, retention_flags, tls, upgrade
from net import http_bounds
from net.tcp import add_listener_flags
from reads import watch


def register(sub: Any) -> None:
    """Add this module's subcommands to the `mercury` parser."""
    p = sub.add_parser(
        "root",
        help="run the root: gateway + store writer + replication source",
        description="Run the root node: the producer write gateway (HTTP), the store's only "
        "writer, the replication source and optional read listeners. SIGTERM commits and "
        "acknowledges the open batch, then exits.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="store directory (see `mercury init`)")
    p.add_argument("--listen", default="127.0.0.1:8080", help="gateway HTTP H:P")
    p.add_argument("--repl-listen", default="127.0.0.1:7070", help="replication source H:P")
    p.add_argument("--kt-listen", default=None, help="Kyoto Tycoon protocol listener H:P")
    p.add_argument(
        "--kt-producer",
        default=None,
        metavar="NAME",
        help="accept Kyoto Tycoon writes on --kt-listen as producer NAME (docs/kt-compat.md)",
    )
    p.add_argument(
        "--kt-db-alias",
        action="append",
        default=[],
        metavar="NAME",
        help="a KT database name accepted as database 0 (repeatable; e.g. casket.kch)",
    )
    p.add_argument(
        "--memcached-listen",
        default=None,
        metavar="H:P",
        help="memcached protocol: H:P, or unix:/path for local clients",
    )
    p.add_argument(
        "--unix-mode",
        default="660",
        metavar="OCTAL",
        help="file mode of a unix:/path --memcached-listen: who may connect (default 660)",
    )
    p.add_argument(
        "--memcached-producer",
        default=None,
        metavar="NAME",
        help="accept memcached writes on --memcached-listen as producer NAME (docs/kt-compat.md)",
    )
    p.add_argument(
        "--memcached-flags",
        action="store_true",
        help="memcached flags are each value's last 4 bytes (KT's memcached opts=f); "
        "with --memcached-producer, sets store them so",
    )
    add_listener_flags(p)
    http_bounds.add_flags(p)
    watch.add_flags(p)  # the watch streams' budget and bounds
    p.add_argument(
        "--batch-window-ms", type=float, default=500.0, help="batch window (default 500)"
    )
    p.add_argument(
        "--batch-max-ops", type=int, default=10_000, help="commit a batch early at N ops"
    )
    p.add_argument(
        "--batch-max-bytes", type=int, default=64 << 20, help="commit a batch early at N bytes"
    )
    p.add_argument(
        "--consumer-node",
        action="append",
        metavar="URL",
        help="consumer node named in the root's refusal of range reads (repeatable)",
    )
    p.add_argument(
        "--heartbeat-ms",
        type=int,
        default=1000,
        help="root heartbeat interval sent down the replication tree (default 1000)",
    )
    p.add_argument(
        "--max-bootstraps",
        type=int,
        default=1,
        help="concurrent snapshot transfers served to bootstrapping replicas (default 1)",
    )
    retention_flags.add_arguments(p)
    upgrade.add_arguments(p)
    tls.add_arguments(p)
    tls.add_read_arguments(p, read_auth=True)
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        default=0.5,
        help="Python GIL switch interval (default 0.5 ms; Python's own default is 5)",
    )
    p.add_argument(
        "--no-fast-path",
        action="store_true",
        help="serve PUT/DELETE /v1/kv and POST /v1/batch through FastAPI's routing too",
    )
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="do not fsync commits (tests and benchmarks only: acknowledged writes may be lost)",
    )
    ha_flags.add_arguments(p)
    p.set_defaults(func=_root)


def _root(args: argparse.Namespace) -> int:
    from mercury.root import run_root

    return run_root(args)
