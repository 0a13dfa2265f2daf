"""Replication services a node runs (the composition seam used by `mercury root`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from core.service import Service
from net.tlsconf import TlsContexts
from replicator import notify
from replicator.heartbeat import RootHeartbeat
from replicator.metrics import APPLIED_SEQ, REPLICATION_LAG
from replicator.source import ReplicationSource
from replicator.tcp import TcpTransport
from replicator.upstream import UpstreamRouter
from store.store import Store


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """The root's replication source: where it listens (None: no source), how often it
    sends heartbeats down the tree, how many snapshot transfers it serves at once."""

    listen: tuple[str, int] | None
    heartbeat_ms: int = 1000
    max_bootstraps: int = 1


def root_services(
    store: Store,
    settings: SourceSettings,
    tls: TlsContexts | None = None,
    upstream: UpstreamRouter | None = None,
) -> list[Service]:
    """Services the root runs beside the gateway: the replication source.

    Also makes every commit of this process ping sources of other processes on the same
    store, and exports `mercury_replication_lag_seconds` (0) and
    `mercury_replication_applied_seq`. With `tls`, every replica must present a
    certificate signed by the CA (mutual TLS). `upstream` dispatches the frames replicas
    send up (`replicator/upstream.py`).
    """
    if settings.listen is None:
        return []
    host, port = settings.listen
    notify.install_pinger(store)
    # The root is the reference: no lag by definition; its applied seq is its head.
    REPLICATION_LAG.set_function(lambda: 0.0)
    APPLIED_SEQ.set_function(lambda: float(store.last_seq()))
    source = ReplicationSource(
        store,
        host,
        port,
        node_id=uuid.uuid4().bytes,
        heartbeat=RootHeartbeat(store, settings.heartbeat_ms),
        max_bootstraps=settings.max_bootstraps,
        tls=tls,
        upstream=upstream,
        transport=TcpTransport(tls),
    )
    return [source]
