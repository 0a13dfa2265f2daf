"""Replication services a node runs (the composition seam used by `mercury root`)."""

from __future__ import annotations

import argparse
import uuid

from core.addr import parse_hostport
from core.service import Service
from replicator import notify
from replicator.heartbeat import RootHeartbeat
from replicator.metrics import APPLIED_SEQ, REPLICATION_LAG
from replicator.source import ReplicationSource
from store.store import Store


def root_services(store: Store, args: argparse.Namespace) -> list[Service]:
    """Services the root runs beside the gateway: the replication source (`--repl-listen`).

    Optional attributes of `args`: ``heartbeat_ms`` (root heartbeat interval, default
    1000) and ``max_bootstraps`` (concurrent snapshot transfers, default 1). Also makes
    every commit of this process ping sources of other processes on the same store, and
    exports `mercury_replication_lag_seconds` (0) and `mercury_replication_applied_seq`.
    """
    listen = getattr(args, "repl_listen", None)
    if not listen:
        return []
    host, port = parse_hostport(listen, "--repl-listen")
    notify.install_pinger(store)
    # The root is the reference: no lag by definition; its applied seq is its head.
    REPLICATION_LAG.set_function(lambda: 0.0)
    APPLIED_SEQ.set_function(lambda: float(store.last_seq()))
    source = ReplicationSource(
        store,
        host,
        port,
        node_id=uuid.uuid4().bytes,
        heartbeat=RootHeartbeat(store, int(getattr(args, "heartbeat_ms", 1000) or 1000)),
        max_bootstraps=int(getattr(args, "max_bootstraps", 1) or 1),
    )
    return [source]
