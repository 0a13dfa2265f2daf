"""The root's unused-key analytics, wired: read summaries in, the ledger, its flushes.

Summaries arrive from replicas over the replication link (`replicator/upstream.py`, kind
READS, dispatched on the source's event loop) and from the root's own readers (KT,
memcached: `reads/readstats.py`); both go into one `gateway.usage_reads.ReadLedger`, which
`GET /v1/usage/unused` reads (through `app.state.read_ledger`) and which is persisted in the
gateway's commit thread.
"""

from __future__ import annotations

from concurrent.futures import Executor

from fastapi import FastAPI

from core.service import Service
from gateway.usage_reads import LedgerService, ReadLedger
from reads import readstats
from reads.readstats import ReadStatsService
from replicator.upstream import READS, Origin, UpstreamRouter
from store.store import Store


class RootUnused:
    """The router for the root's replication source, the services to run, and `attach`."""

    def __init__(self, store: Store) -> None:
        self.ledger = ReadLedger(store, readstats.key_hash)
        self.router = UpstreamRouter()
        self.router.register(READS, self._summary)
        self._app: FastAPI | None = None
        # Stopped in reverse: the readers' last summary lands before the ledger's last flush.
        self.services: list[Service] = [
            LedgerService(self.ledger, self._executor),
            ReadStatsService(self.add),
        ]

    def add(self, payload: bytes) -> None:
        """Merge one summary payload (`reads/readstats.py`); ValueError when malformed."""
        self.ledger.add(*readstats.decode(payload))

    def _summary(self, _origin: Origin, _kind: int, payload: bytes) -> None:
        self.add(payload)

    def _executor(self) -> Executor:
        assert self._app is not None
        executor: Executor = self._app.state.gw.batcher.executor
        return executor

    def attach(self, app: FastAPI) -> None:
        """Make the ledger reachable from the routes; flush in `app`'s commit thread."""
        self._app = app
        app.state.read_ledger = self.ledger
        # The gateway's own GET /v1/kv counts too (it imports nothing of `reads`).
        app.state.note_read = readstats.note_read
