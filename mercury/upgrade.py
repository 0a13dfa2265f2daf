"""The hand-over upgrade's flags (`kill -USR2 PID`) and their defaults.

The mechanism and the sequence every node kind runs on SIGUSR2 (`Upgrader`, `hand_over`)
live in `net/handover.py`; this module is the command line's part of it.
"""

from __future__ import annotations

import argparse

#: How long the new process may take to be ready (`--handover-timeout-s`).
HANDOVER_TIMEOUT_S = 60.0
#: Bound on the old process's drain after the hand-over (`--drain-s`).
DRAIN_S = 10.0
#: A root's idle keep-alive connection gets this long for one last request while the old
#: root drains (a replica's gets the whole `--drain-s`: nothing waits for its drain).
ROOT_IDLE_GRACE_S = 0.1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The hand-over flags (root and replica)."""
    p.add_argument(
        "--handover-timeout-s",
        type=float,
        default=HANDOVER_TIMEOUT_S,
        metavar="S",
        help="on SIGUSR2, how long the new executable may take to be ready before the "
        f"hand-over is abandoned and this process keeps serving (default {HANDOVER_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--drain-s",
        type=float,
        default=DRAIN_S,
        metavar="S",
        help="after a hand-over, how long this process may take to finish the requests in "
        f"flight before it exits anyway (default {DRAIN_S:g})",
    )
