"""The `mercury` console script: a thin composition root.

Each component's commands live in a `mercury/cmd_*.py` module with a ``register(sub)``
function that adds its subparsers; this module only assembles them, gives every command
`--log-level` (one logging setup for every process: `mercury/logsetup.py`) and turns
every failure into one line on stderr and a documented exit status (`EXIT_STATUSES`): no
traceback reaches a user (`--log-level debug` logs it, for a bug report).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import ssl
import sys
from collections.abc import Sequence

import httpx

from core.errors import MercuryError
from mercury import logsetup

log = logging.getLogger("mercury.cli")

#: The exit statuses of every command (`mercury kv` adds 3 not found and 4 refused).
EXIT_STATUSES = """\
exit status: 0 done; 1 a failure the command reports (e.g. verify) or an internal error;
2 bad arguments, an unreadable or malformed file, or a refusal by the node; 5 the node
could not be reached (connection refused or cut, TLS, timeout)"""

COMMAND_MODULES = (
    "mercury.cmd_store",
    "mercury.cmd_gateway",
    "mercury.cmd_usage",
    "mercury.cmd_acl",
    "mercury.cmd_replica",
    "mercury.cmd_cache",
    "mercury.cmd_kv",
    "mercury.cmd_kt_bridge",
    "mercury.cmd_certs",
    "mercury.cmd_sim",
    "mercury.cmd_completion",
)

#: The module of COMMAND_MODULES that registers each command. A run of one command builds
#: its parser from that module alone: importing every module costs each process about half
#: a CPU second (the daemons' flags pull in FastAPI, uvicorn and the read API), which a
#: short command such as `mercury init` or `mercury acl` then spent on nothing. A command
#: missing here still runs (on the full parser); tests/test_process_shape.py checks this map
#: against what each module registers.
COMMANDS = {
    **dict.fromkeys(
        ("init", "migrate", "promote", "prune-aside", "restore", "snapshot", "status", "verify"),
        "mercury.cmd_store",
    ),
    "root": "mercury.cmd_gateway",
    "usage": "mercury.cmd_usage",
    "acl": "mercury.cmd_acl",
    "replica": "mercury.cmd_replica",
    "cache": "mercury.cmd_cache",
    "sim": "mercury.cmd_sim",
    "kv": "mercury.cmd_kv",
    "kt-bridge": "mercury.cmd_kt_bridge",
    "certs": "mercury.cmd_certs",
    "completion": "mercury.cmd_completion",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full argument parser, every command with its --help; with `command` (a key of
    `COMMANDS`), the same parser holding that command alone, which parses its arguments
    exactly as the full one does."""
    parser = argparse.ArgumentParser(
        prog="mercury",
        description="Mercury: configuration distribution (gateway, store, replication, reads).",
        epilog=EXIT_STATUSES,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {logsetup.mercury_version()}"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = (COMMANDS[command],) if command is not None else COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(sub)
    _add_log_level(parser)
    return parser


def _add_log_level(parser: argparse.ArgumentParser) -> None:
    """Give every leaf command (`root`, `acl apply`, ...) the same `--log-level`."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        # main() reports an unknown flag with this command's usage, not the top level's
        parser.set_defaults(_parser=parser)
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
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command is the first argument (the top level has no option but --help and
    # --version); anything else (help, a mistyped command) gets the full parser.
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args, extra = build_parser(command).parse_known_args(argv)
    if extra:
        # argparse lets a subcommand's unknown flags reach the top-level parser, whose usage
        # says nothing of them: the command's own parser reports them.
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logsetup.setup(args.log_level)
    try:
        status = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `mercury acl log | head`
        sys.stderr.close()
        return 0
    except Exception as err:  # every failure becomes one line and a status
        message, status = describe(err)
        print(f"mercury: error: {message}", file=sys.stderr)
        log.debug("command failed", exc_info=err)
        return status
    return int(status or 0)


def describe(err: BaseException) -> tuple[str, int]:
    """One line naming what failed (the URL, the file, the answer) with a hint, and the
    exit status (`EXIT_STATUSES`)."""
    if isinstance(err, MercuryError):
        return str(err), 2
    if isinstance(err, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return f"{err}: --url must be http://HOST:PORT or https://HOST:PORT", 2
    if isinstance(err, httpx.TransportError):
        return transport_message(err), 5
    if isinstance(err, OSError) and err.filename is not None:
        return f"cannot open {err.filename}: {err.strerror or err}", 2
    if isinstance(err, OSError):
        return (err.strerror if err.errno and err.strerror else str(err)), 2
    return (
        f"internal error ({type(err).__name__}: {err}); "
        "run with --log-level debug for the traceback",
        1,
    )


def transport_message(err: BaseException, flag: str = "--url") -> str:
    """A failed connection as one line: the URL, what happened, what to check (`flag`: the
    option that gave the URL)."""
    url = failed_url(err)
    what = str(err) or type(err).__name__
    where = f"cannot reach {url}" if url else "cannot reach the node"
    if _tls_failure(err):
        hint = "the node's TLS certificate was not verified: give its CA with --ca FILE"
    elif isinstance(err, httpx.TimeoutException):
        hint = "the node did not answer in time (--timeout)"
    else:
        hint = f"is the node running and listening there? ({flag})"
    return f"{where}: {what} (hint: {hint})"


def failed_url(err: BaseException) -> str:
    """The URL an httpx request error was for ("" when it carries none)."""
    with contextlib.suppress(RuntimeError):  # an httpx error without its request
        return str(err.request.url) if isinstance(err, httpx.RequestError) else ""
    return ""


def _tls_failure(err: BaseException | None) -> bool:
    seen = 0
    while err is not None and seen < 8:  # the ssl error is a cause of httpx's
        if isinstance(err, ssl.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(err):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


if __name__ == "__main__":
    sys.exit(main())
