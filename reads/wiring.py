"""Read listeners a node runs (filled in by the reads component)."""

from __future__ import annotations

import argparse

from mercury.service import Service
from store.store import Store


def root_services(store: Store, args: argparse.Namespace) -> list[Service]:
    """Read listeners the root runs beside the gateway (`--kt-listen`: point reads only)."""
    _ = (store, args)
    return []
