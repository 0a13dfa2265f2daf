"""`mercury replica`: a follower node (registered by `mercury.cli`)."""

from __future__ import annotations

import argparse
from typing import Any

from mercury import retention_flags, tls, upgrade
from net import http_bounds
from net.tcp import add_listener_flags
from reads import watch
from replicator.client import APPLY_WINDOW
from replicator.heap import HEAP_KEEP_MB


def register(sub: Any) -> None:
    """Add the `replica` command to the `mercury` parser."""
    p = sub.add_parser(
        "replica",
        help="follow a source: stream its log, serve reads and downstream replicas",
        description=(
            "Follow the first healthy --source (others in order on failure or staleness), "
            "apply its log, serve reads (HTTP, KT, memcached) and downstream replicas. "
            "A missing or empty DATA_DIR is bootstrapped from a snapshot of the source."
        ),
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="store directory of this replica")
    p.add_argument(
        "--source",
        action="append",
        required=True,
        metavar="H:P",
        help="replication source (repeat: ordered list, first healthy wins)",
    )
    p.add_argument(
        "--keyspace",
        action="append",
        default=None,
        metavar="PREFIX",
        help="hold only the keys under PREFIX (repeat for more): a filtered replica; its "
        "sources ship only those keys (docs/replication.md, Filtered replicas)",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8081",
        metavar="H:P",
        help="HTTP read API: H:P, or unix:/path for local consumers (see --unix-mode)",
    )
    p.add_argument(
        "--unix-mode",
        default="660",
        metavar="OCTAL",
        help="file mode of unix:/path listeners (--listen, --memcached-listen): who may "
        "connect (default 660: the owner and its group)",
    )
    p.add_argument(
        "--repl-listen",
        default=None,
        metavar="H:P",
        help="serve downstream replicas on this address (default: none)",
    )
    p.add_argument("--kt-listen", default=None, metavar="H:P", help="Kyoto Tycoon protocol")
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
        help="memcached protocol: H:P, or unix:/path for local consumers",
    )
    p.add_argument(
        "--memcached-flags",
        action="store_true",
        help="memcached flags are each value's last 4 bytes (KT's memcached opts=f)",
    )
    add_listener_flags(p)
    http_bounds.add_flags(p)  # the read API's bounds, named and defaulted as the root's
    watch.add_flags(p)  # the watch streams' budget and bounds, as the root's
    p.add_argument(
        "--read-workers",
        type=int,
        default=1,
        metavar="N",
        help="serve reads with N processes sharing the HTTP, KT and memcached ports "
        "(SO_REUSEPORT); a dead one is restarted (default 1)",
    )
    p.add_argument(
        "--staleness-s",
        type=float,
        default=30.0,
        help="move to the next source after this many seconds without a new entry or "
        "heartbeat (default 30)",
    )
    p.add_argument(
        "--applier-nice",
        type=int,
        default=5,
        metavar="N",
        help="run the replication worker N niceness levels below the read server, so reads "
        "win the CPU on a busy machine (default 5; 0 = same priority)",
    )
    p.add_argument(
        "--applier-cpus",
        default=None,
        metavar="LIST",
        help="pin the replication worker to these CPUs (as taskset -c writes them: 3, "
        "2-3) and the read server to the others, so reads never share a core with the "
        "applier (default: unpinned)",
    )
    p.add_argument(
        "--failback-s",
        type=float,
        default=30.0,
        help="while on a fallback source, check the preferred ones this often and move "
        "back to the first healthy one (default 30; 0 disables)",
    )
    p.add_argument(
        "--apply-window-ms",
        type=float,
        default=APPLY_WINDOW * 1000,
        metavar="MS",
        help="while the stream from the source is heavy (1 MiB a second or more), start "
        "a commit at most every MS and let the records arriving meanwhile join it, so a "
        "replica of a root sending many small records commits and fsyncs a few at a "
        "time instead of each one; a light stream is committed at once. Costs reads on "
        "the applier's core a longer wait behind each commit "
        f"(default {APPLY_WINDOW * 1000:g}: off; e.g. 20)",
    )
    p.add_argument(
        "--applier-heap-keep-mb",
        type=int,
        default=HEAP_KEEP_MB,
        metavar="MB",
        help="let the replication worker keep up to MB of memory it freed (per thread) "
        "for the next records instead of handing it back to the kernel and faulting it in "
        "again for each record (glibc; costs up to that much resident memory per thread "
        f"after a large record; default {HEAP_KEEP_MB}; 0 = the C library's own thresholds)",
    )
    p.add_argument(
        "--max-bootstraps",
        type=int,
        default=1,
        help="concurrent snapshot transfers this node serves downstream (default 1)",
    )
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="do not fsync applied batches: faster catch-up, but a machine crash may lose "
        "or corrupt the last commits (then re-bootstrap: empty DATA_DIR and restart)",
    )
    retention_flags.add_arguments(p)
    upgrade.add_arguments(p)
    tls.add_arguments(p)
    tls.add_read_arguments(p, read_auth=True)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from mercury.replica import run_replica

    return run_replica(args)
