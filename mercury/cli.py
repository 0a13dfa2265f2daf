"""The `mercury` console script: a thin composition root.

Each component's commands live in a `mercury/cmd_*.py` module with a ``register(sub)``
function that adds its subparsers; this module only assembles them, gives every command
`--log-level` (one logging setup for every process: `mercury/logsetup.py`) and turns
Mercury errors into a clear message and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from core.errors import MercuryError
from mercury import logsetup

COMMAND_MODULES = (
    "mercury.cmd_store",
    "mercury.cmd_gateway",
    "mercury.cmd_usage",
    "mercury.cmd_acl",
    "mercury.cmd_replica",
    "mercury.cmd_kv",
    "mercury.cmd_kt_bridge",
    "mercury.cmd_certs",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, every command with its --help."""
    parser = argparse.ArgumentParser(
        prog="mercury",
        description="Mercury: configuration distribution (gateway, store, replication, reads).",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {logsetup.mercury_version()}"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _add_log_level(parser)
    return parser


def _add_log_level(parser: argparse.ArgumentParser) -> None:
    """Give every leaf command (`root`, `acl apply`, ...) the same `--log-level`."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        parser.add_argument(
            "--log-level",
            default="info",
            choices=logsetup.LEVELS,
            help="log level of this process's JSON log lines on stderr (default info)",
        )
        return
    for action in subs:
        for child in set(action.choices.values()):
            _add_log_level(child)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status."""
    args = build_parser().parse_args(argv)
    logsetup.setup(args.log_level)
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
