"""`mercury certs`: a CA and per-node certificates for a deployment (`net/certs.py`;
docs/security.md, "Running a secure node")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add `certs` to the `mercury` parser."""
    p = sub.add_parser(
        "certs",
        help="make a CA and per-node certificates (only what is missing)",
        description="Write OUT/ca.crt (its key in --ca-key-dir, default OUT) and, for each "
        "--node N, OUT/N.crt and OUT/N.key signed by that CA, valid for server and client "
        "authentication and naming N, localhost and 127.0.0.1 (plus every --san). Existing "
        "files are kept: run it again to add nodes.",
    )
    p.add_argument("out", metavar="OUT", help="directory for ca.crt and the nodes' files")
    p.add_argument("--node", action="append", default=[], metavar="N", help="a node (repeat)")
    p.add_argument("--ca-key-dir", metavar="D", help="where the CA's key lives (default OUT)")
    p.add_argument(
        "--san", action="append", default=[], metavar="NAME", help="extra DNS name or IP"
    )
    p.set_defaults(func=_certs)


def _certs(args: argparse.Namespace) -> int:
    from net import certs

    written = certs.ensure(
        Path(args.out),
        args.node,
        ca_key_dir=Path(args.ca_key_dir) if args.ca_key_dir else None,
        san=args.san,
    )
    for f in written:
        print(f"wrote {f}")
    if not written:
        print("nothing to do: every file exists")
    return 0
