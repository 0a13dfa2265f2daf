"""The log retention flags shared by `mercury root` and `mercury replica`, and the policy
they describe (`store.retention.RetentionPolicy`)."""

from __future__ import annotations

import argparse

from store.retention import WEEK, RetentionPolicy


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The retention flags shared by `mercury root` and `mercury replica`."""
    p.add_argument(
        "--log-keep-seconds",
        type=float,
        default=WEEK,
        help="drop log records older than this (default: one week; 0 disables)",
    )
    p.add_argument(
        "--log-keep-entries",
        type=int,
        default=None,
        help="drop log records more than N entries behind the head (default: no count bound)",
    )
    p.add_argument(
        "--log-gc-interval-s",
        type=float,
        default=10.0,
        help="seconds between log retention passes (default 10)",
    )
    p.add_argument(
        "--log-min-entries",
        type=int,
        default=100_000,
        help="never keep fewer than N log entries (default 100000)",
    )


def policy_from_args(args: argparse.Namespace) -> RetentionPolicy:
    """The policy the retention flags (`add_arguments`) describe."""
    return RetentionPolicy(
        keep_entries=args.log_keep_entries,
        keep_seconds=args.log_keep_seconds or None,
        min_entries=args.log_min_entries,
        interval=args.log_gc_interval_s,
    )
