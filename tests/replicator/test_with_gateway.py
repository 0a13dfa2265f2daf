"""End to end with the real root: PUT through the gateway, read on a tier-2 replica."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from testkit.logged import entries_since
from testkit.procs import Procs, free_port, run_mercury, wait_http
from testkit.replication import status, wait_for
from tests.replicator.nodes import start_replica


def test_put_on_root_is_readable_on_tier_2_and_metrics_are_exported(
    tmp_path: Path, procs: Procs
) -> None:
    assert run_mercury("init", str(tmp_path / "root")).returncode == 0
    token = (tmp_path / "root" / "admin.token").read_text().strip()
    gw, repl = free_port(), free_port()
    root = procs.start_mercury(
        "root",
        str(tmp_path / "root"),
        "--listen",
        f"127.0.0.1:{gw}",
        "--repl-listen",
        f"127.0.0.1:{repl}",
        "--batch-window-ms",
        "10",
        name="root",
    )
    wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
    base = f"http://127.0.0.1:{gw}"
    admin = {"Authorization": f"Bearer {token}"}
    httpx.put(f"{base}/v1/admin/producers/p", json={"keyspaces": ["cfg/"]}, headers=admin)
    ptoken = httpx.post(f"{base}/v1/admin/producers/p/tokens", headers=admin).json()["token"]
    producer = {"Authorization": f"Bearer {ptoken}"}
    t1 = start_replica(procs, tmp_path / "t1", [repl], name="t1")
    t2 = start_replica(procs, tmp_path / "t2", [t1.repl], repl=False, name="t2")
    r = httpx.put(f"{base}/v1/kv/cfg/a", content=b"hello", headers=producer)
    assert r.status_code == 200, r.text
    seq = r.json()["seq"]
    wait_for(lambda: status(t2.http)["seq"] >= seq, 30, "write on tier 2")
    got = httpx.get(f"http://127.0.0.1:{t2.http}/v1/kv/cfg/a")
    assert got.status_code == 200 and got.content == b"hello"
    root_status = httpx.get(f"{base}/v1/status").json()
    assert status(t2.http)["hash_head"] == root_status["hash_head"]
    root_metrics = httpx.get(f"{base}/metrics").text
    # (>= seq: the root logs documents of its own too, e.g. a minute's usage series)
    applied = re.search(r"^mercury_replication_applied_seq (\S+)$", root_metrics, re.M)
    assert applied is not None and float(applied.group(1)) >= seq, root_metrics
    assert "mercury_replication_lag_seconds 0.0" in root_metrics
    # A duplicate write logs nothing and heartbeats stay out of the log.
    dup = httpx.put(f"{base}/v1/kv/cfg/a", content=b"hello", headers=producer)
    assert dup.json()["status"] == "duplicate"
    wait_for(lambda: status(t2.http)["lag_seconds"] == 0.0, 10, "lag 0 on tier 2")
    assert [k for _, k in entries_since(tmp_path / "root", seq) if k.startswith(b"cfg/")] == []
