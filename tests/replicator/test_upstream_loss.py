"""A replica that loses its source keeps serving readers and downstream replicas."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from testkit.procs import Procs
from testkit.replication import root_node, status, wait_for, wait_seq
from tests.faults.proxy import FaultProxy
from tests.replicator.nodes import start_replica


def test_reconnecting_upstream_causes_no_cascading_disconnect(tmp_path: Path, procs: Procs) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(200)
        link = FaultProxy(root.port)
        port = link.port
        t1 = start_replica(procs, tmp_path / "t1", [link.port], name="t1")
        t2 = start_replica(procs, tmp_path / "t2", [t1.repl], "--staleness-s", "30", name="t2")
        wait_seq(t2.http, 200)
        link.close()  # tier 1 loses the root
        wait_for(
            lambda: status(t1.http)["replication_errors"].get("unreachable", 0) >= 2,
            20,
            "tier 1 retrying its source",
        )
        # The case under test is an absence (tier 2 does not lose tier 1 while tier 1
        # retries its source), so there is nothing to wait for: a second of tier 1
        # retrying, then tier 2 must still stream with no error counted.
        time.sleep(1.0)
        st2 = status(t2.http)
        assert st2["replication_state"] == "streaming", st2
        assert st2["replication_errors"] == {}, st2  # tier 2 never lost tier 1
        assert httpx.get(f"http://127.0.0.1:{t1.http}/v1/kv/k00000199").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{t2.http}/v1/kv/k00000199").status_code == 200
        root.write(100, start=200)
        link = FaultProxy(root.port, port=port)  # the root is back
        try:
            st = wait_seq(t2.http, 300, timeout=30)
            assert st["replication_errors"] == {}, st
            assert st["hash_head"] == root.store.head()[1].hex()
        finally:
            link.close()
