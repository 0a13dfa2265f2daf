"""The worker's published applier counters and the parent's metrics made from them."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from replicator.metrics import _Applier
from replicator.status import ReplicaStatus, StatusBoard, read_status, status_path


def test_flush_publishes_the_counters_and_the_workers_cpu(tmp_path: Path) -> None:
    board = StatusBoard(str(tmp_path))
    board.update(applied_records=3, applied_bytes=4096, apply_commits=2, apply_seconds=0.25)
    before = time.process_time()
    board.flush()
    st = read_status(str(tmp_path))
    assert st is not None
    assert (st.applied_records, st.applied_bytes, st.apply_commits) == (3, 4096, 2)
    assert st.apply_seconds == 0.25
    assert before <= st.cpu_seconds <= time.process_time()


def test_a_status_document_without_the_counters_reads_as_zero(tmp_path: Path) -> None:
    """A worker of the previous release wrote none of them; its parent may be newer."""
    with open(status_path(str(tmp_path)), "w") as f:
        json.dump({"pid": 7, "state": "streaming", "applied_seq": 9}, f)
    st = read_status(str(tmp_path))
    assert st is not None and st.applied_seq == 9
    assert (st.applied_records, st.applied_bytes, st.apply_commits) == (0, 0, 0)
    assert st.apply_seconds == 0.0 and st.cpu_seconds == 0.0


def test_the_collector_exports_counters_only_once_the_worker_published() -> None:
    applier = _Applier()
    registry = CollectorRegistry()
    registry.register(applier)
    assert b"mercury_replication" not in generate_latest(registry)
    applier.source = lambda: ReplicaStatus(
        applied_records=5, applied_bytes=1000, apply_commits=2, apply_seconds=0.5, cpu_seconds=1.5
    )
    text = generate_latest(registry).decode()
    for line in (
        "mercury_replication_applied_records_total 5.0",
        "mercury_replication_applied_bytes_total 1000.0",
        "mercury_replication_apply_commits_total 2.0",
        "mercury_replication_apply_seconds_total 0.5",
        "mercury_replication_worker_cpu_seconds_total 1.5",
    ):
        assert line in text.splitlines()
    assert "# TYPE mercury_replication_applied_bytes_total counter" in text
