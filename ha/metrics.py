"""A standby's own metrics, served on its front's `GET /metrics`.

A candidate that does not lead runs its standby's replication client in its own process
(no worker process, no read server), and its address answers only through the front. So
the replication figures a replica's serving process exports are wired here instead, from
the same sources: the standby's status document (lag, divergence, the applier's counters,
and the CPU of this process, which is the one applying) and its store (the applied seq).
While no standby runs (an election, or the short wait before the root process takes the
address) the lag and applied seq are NaN and the applier's counters are absent: nothing
is being applied, and an old status document would describe a stream that is gone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Gauge, generate_latest

from ha.front import MetricsFn
from replicator.metrics import APPLIED_SEQ, APPLIER, DIVERGED, REPLICATION_LAG, STREAMING
from replicator.status import diverged, lag_gauge, read_status, streaming
from store.store import Store

#: The HA role, for "no leader" and "standbys out of sync" alerts (deploy/prometheus): a
#: candidate's process exports 0 (its front serves them while it does not lead), the
#: elected root process 1 with the sync figures of its gate.
LEADER = Gauge("mercury_ha_leader", "1 on the elected HA leader's root process, 0 on a candidate")
STANDBYS_IN_SYNC = Gauge(
    "mercury_ha_standbys_in_sync", "Standbys that reported applying recently (on the leader)"
)
SYNC_REQUIRED = Gauge(
    "mercury_ha_sync_standbys_required",
    "Standbys that must confirm a batch before the leader acknowledges it (--sync-standbys)",
)


def standby_metrics(data_dir: str, standby_store: Callable[[], Store | None]) -> MetricsFn:
    """Wire the replication metrics of the standby in `data_dir` (`standby_store`: its
    open store, None while no standby runs) and return the front's `/metrics` renderer."""

    def lag() -> float:
        return math.nan if standby_store() is None else lag_gauge(data_dir)

    def applied() -> float:
        store = standby_store()
        return math.nan if store is None else float(store.last_seq())

    REPLICATION_LAG.set_function(lag)
    APPLIED_SEQ.set_function(applied)
    DIVERGED.set_function(lambda: diverged(data_dir))
    STREAMING.set_function(lambda: streaming(data_dir) if standby_store() is not None else 0.0)
    APPLIER.source = lambda: read_status(data_dir) if standby_store() is not None else None

    def render() -> tuple[str, bytes]:
        return CONTENT_TYPE_LATEST, generate_latest(REGISTRY)

    return render
