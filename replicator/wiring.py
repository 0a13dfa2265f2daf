"""Replication services a node runs (filled in by the replication component)."""

from __future__ import annotations

import argparse

from mercury.service import Service
from store.store import Store


def root_services(store: Store, args: argparse.Namespace) -> list[Service]:
    """Services the root runs beside the gateway: the replication source (`--repl-listen`)."""
    _ = (store, args)
    return []
