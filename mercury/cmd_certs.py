"""`mercury certs`: a CA and per-node certificates for a deployment (`net/certs.py`;
docs/security.md, "Running a secure node")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from core.errors import ConfigError


def register(sub: Any) -> None:
    """Add `certs` to the `mercury` parser."""
    p = sub.add_parser(
        "certs",
        help="make a CA and per-node certificates (only what is missing)",
        description="Write OUT/ca.crt (its key in --ca-key-dir, default OUT) and, for each "
        "--node N, OUT/N.crt and OUT/N.key signed by that CA, carrying N's --role (the SAN "
        "URI urn:mercury:role:ROLE) and naming N, localhost and 127.0.0.1 (plus every "
        "--san). root and replica certificates serve both ends of replication and HTTPS; a "
        "consumer certificate is for HTTPS reads only. Existing files are kept: run it "
        "again to add nodes.",
    )
    p.add_argument("out", metavar="OUT", help="directory for ca.crt and the nodes' files")
    p.add_argument("--node", action="append", default=[], metavar="N", help="a node (repeat)")
    p.add_argument(
        "--role",
        action="append",
        default=[],
        choices=("root", "replica", "consumer"),
        help="the certificate's role: once for every --node, or once per --node in the "
        "same order (required with --node)",
    )
    p.add_argument("--ca-key-dir", metavar="D", help="where the CA's key lives (default OUT)")
    p.add_argument(
        "--san", action="append", default=[], metavar="NAME", help="extra DNS name or IP"
    )
    p.set_defaults(func=_certs)


def _roles(nodes: list[str], roles: list[str]) -> dict[str, str]:
    """node -> role: one --role for all, or one per --node in order."""
    if nodes and not roles:
        raise ConfigError(
            "--node needs --role root|replica|consumer",
            hint="a certificate's role says what it may do (docs/security.md)",
        )
    if len(roles) == 1:
        return dict.fromkeys(nodes, roles[0])
    if len(roles) != len(nodes):
        raise ConfigError(f"{len(roles)} --role for {len(nodes)} --node: give one, or one each")
    return dict(zip(nodes, roles, strict=True))


def _certs(args: argparse.Namespace) -> int:
    from net import certs

    written = certs.ensure(
        Path(args.out),
        _roles(args.node, args.role),
        ca_key_dir=Path(args.ca_key_dir) if args.ca_key_dir else None,
        san=args.san,
    )
    for f in written:
        print(f"wrote {f}")
    if not written:
        print("nothing to do: every file exists")
    return 0
