"""The `mercury root` flags of root candidates (docs/ha.md)."""

from __future__ import annotations

import argparse

from ha.lease import DEFAULT_TTL_S


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the HA flags to the `root` parser."""
    g = p.add_argument_group(
        "high availability (docs/ha.md)",
        "With --ha-etcd this process is a root candidate: it leads when it wins the etcd "
        "election and otherwise replicates from the leader as a standby.",
    )
    g.add_argument(
        "--ha-etcd", default=None, metavar="URL[,URL]", help="etcd client URLs (comma-separated)"
    )
    g.add_argument("--ha-group", default="mercury", metavar="NAME", help="election name")
    g.add_argument(
        "--ha-node",
        default=None,
        metavar="NAME",
        help="this candidate's name (default: its --advertise-url)",
    )
    g.add_argument(
        "--advertise-url",
        default=None,
        metavar="URL",
        help="gateway URL clients are redirected to while this node leads "
        "(default: http[s]://--listen)",
    )
    g.add_argument(
        "--advertise-repl",
        default=None,
        metavar="H:P",
        help="replication address standbys follow while this node leads (default: --repl-listen)",
    )
    g.add_argument(
        "--lease-ttl-s",
        type=int,
        default=DEFAULT_TTL_S,
        help=f"etcd lease TTL in seconds (default {DEFAULT_TTL_S})",
    )
    g.add_argument(
        "--ha-forward",
        action="store_true",
        help="a standby passes writes to the leader and returns its answer (instead of 307)",
    )
    g.add_argument(
        "--sync-standbys",
        type=int,
        default=None,
        metavar="N",
        help="acknowledge a batch only once N standbys applied it (default 1 with --ha-etcd)",
    )
    g.add_argument(
        "--sync-timeout-ms",
        type=float,
        default=2000.0,
        help="answer 503 when no standby confirmed a batch within this time (default 2000)",
    )
    # Set by the candidate on the warm root process it keeps ready (never by hand).
    g.add_argument("--ha-await-go", action="store_true", help=argparse.SUPPRESS)
