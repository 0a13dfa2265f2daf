"""The `mercury` console script: a thin composition root.

Each component's commands live in a `mercury/cmd_*.py` module with a ``register(sub)``
function that adds its subparsers; this module only assembles them and turns Mercury
errors into a clear message and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from core.errors import MercuryError

COMMAND_MODULES = (
    "mercury.cmd_store",
    "mercury.cmd_gateway",
    "mercury.cmd_replica",
    "mercury.cmd_kv",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, every command with its --help."""
    parser = argparse.ArgumentParser(
        prog="mercury",
        description="Mercury: configuration distribution (gateway, store, replication, reads).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except MercuryError as err:
        print(f"mercury: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
