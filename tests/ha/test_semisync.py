"""Semi-synchronous acknowledgement: a batch is answered only once a standby applied it.

Three candidates with `--sync-standbys 1`: with one standby killed, writes go on (the other
confirms them); with both killed, a write is committed on the leader but answered 503
`not-in-sync` saying so, after `--sync-timeout-ms`; a standby brought back catches up and
writes are acknowledged again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from testkit import metrics
from testkit.etcd import Etcd
from testkit.hacluster import Cluster
from testkit.procs import Procs
from testkit.wait import wait_until


def test_writes_need_a_standby_in_sync(etcd: Etcd, procs: Procs, tmp_path: Path) -> None:
    cluster = Cluster(procs, tmp_path, etcd.url, n=3, extra=("--sync-timeout-ms", "1000"))
    cluster.start()
    leader = cluster.wait_leader()
    standbys = [n for n in cluster.nodes if n is not leader]
    h = {"Authorization": f"Bearer {cluster.token}"}

    def put(key: str) -> httpx.Response:
        return httpx.put(f"{leader.url}/v1/kv/k/{key}", content=b"v", headers=h, timeout=10)

    assert put("a").status_code == 200

    # The write needed one standby's ack; the other's report of being in sync may come
    # after the answer (the assertion read it at once, and passed only while each test
    # client spent ~27 ms loading a CA bundle first).
    def both_in_sync() -> dict[str, Any] | None:
        st = leader.status()
        return st if st is not None and st["standbys_in_sync"] == 2 else None

    st = wait_until(both_in_sync, 10, "the leader counting both standbys in sync")
    assert st["role"] == "leader" and st["standbys_in_sync"] == 2

    # a standby's /metrics are its own: what it applied, not a redirect to the leader's
    def applied() -> dict[str, float] | None:
        r = httpx.get(f"{standbys[0].url}/metrics", timeout=5)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        got = metrics.unlabelled(r.text)
        return got if got.get("mercury_replication_applied_records_total", 0) >= 1 else None

    got = wait_until(applied, 10, "the standby's metrics counting the applied record")
    assert got["mercury_replication_applied_seq"] >= 1
    assert got["mercury_replication_apply_commits_total"] >= 1
    assert got["mercury_replication_lag_seconds"] >= 0  # a number: it streams
    assert got["mercury_replication_diverged"] == 0
    # What the HA alerts watch (deploy/prometheus/alerts.yml): one leader, its standbys.
    assert got["mercury_ha_leader"] == 0 and got["mercury_replication_streaming"] == 1
    lm = metrics.unlabelled(httpx.get(f"{leader.url}/metrics", timeout=5).text)
    assert lm["mercury_ha_leader"] == 1 and lm["mercury_ha_sync_standbys_required"] == 1
    assert lm["mercury_ha_standbys_in_sync"] == 2
    # A history a standby set aside (ha/standby.py) shows in its status until pruned.
    (standbys[0].data_dir / ".diverged-1000").mkdir()
    sst = standbys[0].status()
    assert sst is not None and [s["name"] for s in sst["set_aside"]] == [".diverged-1000"]
    cluster.kill(standbys[0])
    assert put("b").status_code == 200  # the other standby confirms
    cluster.kill(standbys[1])
    r = put("c")
    assert r.status_code == 503, r.text
    problem = r.json()
    assert problem["type"].endswith("/not-in-sync")
    assert "not confirmed by 1 standby" in problem["detail"]
    assert "not acknowledged" in problem["detail"]
    cluster.start_node(standbys[1])  # catches up, then confirms again
    cluster.wait_standbys(1)
    r = put("d")
    assert r.status_code == 200, r.text
    # "c" was committed (not acknowledged): a retry is answered from what the store holds.
    assert put("c").json()["status"] == "duplicate"
    seq, _ = cluster.wait_converged()
    assert seq >= r.json()["seq"]
    # A clean SIGTERM is a clean exit for every candidate, leading or standing by.
    for node in (leader, standbys[1]):
        assert node.proc is not None
        assert Procs.terminate(node.proc, timeout=30) == 0, procs.logs()
