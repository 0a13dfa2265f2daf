"""Candidates with TLS: HTTPS on the gateway address whatever the role, mutual TLS on the
standby's stream from the leader (history probe, bootstrap, replication)."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx

from testkit.etcd import Etcd
from testkit.hacluster import Cluster, Node
from testkit.procs import Procs, run_mercury


def test_candidates_over_tls(etcd: Etcd, procs: Procs, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    # Candidates replicate from the leader as standbys: the root role.
    res = run_mercury("certs", str(certs), "--node", "n0", "--node", "n1", "--role", "root")
    assert res.returncode == 0, res.stderr

    class TlsCluster(Cluster):
        def argv(self, node: Node) -> list[str]:
            return [
                *super().argv(node),
                "--tls-cert",
                str(certs / f"{node.name}.crt"),
                "--tls-key",
                str(certs / f"{node.name}.key"),
                "--tls-ca",
                str(certs / "ca.crt"),
            ]

    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    cluster = TlsCluster(procs, tmp_path, etcd.url, n=2, https=ctx)
    cluster.start()
    leader = cluster.wait_leader()
    standby = next(n for n in cluster.nodes if n is not leader)
    st = standby.status()
    assert st is not None and st["role"] == "standby"
    assert st["leader_url"] == leader.url and leader.url.startswith("https://")
    h = {"Authorization": f"Bearer {cluster.token}"}
    r = httpx.put(f"{standby.url}/v1/kv/k/x", content=b"1", headers=h, verify=ctx)
    assert r.status_code == 307 and r.headers["location"] == f"{leader.url}/v1/kv/k/x"
    r = httpx.put(f"{leader.url}/v1/kv/k/x", content=b"1", headers=h, verify=ctx)
    assert r.status_code == 200, r.text  # confirmed by the standby over mutual TLS
    cluster.wait_converged()
