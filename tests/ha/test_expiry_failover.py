"""A key's expiry survives failover: written with a TTL on the leader, which is SIGKILLed
before the deadline, the key is expired by the new leader — the killed leader never logged
it — and every node, the killed one rejoining too, removes it at the same seq. Three
candidates on a real etcd (`testkit.hacluster`), as in `test_failover.py`."""

from __future__ import annotations

from pathlib import Path

import httpx

from store.format import OP_EXPIRE
from testkit.etcd import Etcd
from testkit.hacluster import Cluster
from testkit.logged import seqs_since
from testkit.procs import Procs
from testkit.wait import wait_until

KEY = "k/temporary"


def _expiries(data_dir: Path) -> list[int]:
    """The seqs at which the store logged an expiry of KEY."""
    return [s for s, op, k in seqs_since(data_dir, 0) if op == OP_EXPIRE and k == KEY.encode()]


def test_a_key_expires_after_its_leader_is_killed_before_the_deadline(
    etcd: Etcd, procs: Procs, tmp_path: Path
) -> None:
    cluster = Cluster(procs, tmp_path, etcd.url, n=3)
    cluster.start()
    auth = {"Authorization": f"Bearer {cluster.token}"}
    old = cluster.wait_leader()
    # Acknowledged once a standby applied it (--sync-standbys 1): the deadline is on the
    # standbys' deadline index before the leader dies. 8 s: far beyond the kill right
    # after, so the old leader cannot have logged the expiry (checked below).
    r = httpx.put(f"{old.url}/v1/kv/{KEY}?ttl=8s", content=b"window", headers=auth)
    assert r.status_code == 200, r.text
    cluster.kill(old)
    new = cluster.wait_leader(not_=old)
    # The new leader inherited the deadline with the log and expires the key itself.
    wait_until(
        lambda: httpx.get(f"{new.url}/v1/kv/{KEY}", headers=auth).status_code == 404,
        60,
        "the key expired by the new leader",
    )
    assert _expiries(old.data_dir) == [], "the killed leader logged the expiry"
    cluster.start_node(old)  # rejoins as a standby and receives the expiry with the log
    cluster.wait_standbys(2)
    cluster.wait_converged()
    for node in cluster.nodes:
        cluster.stop(node)
    seqs = {node.name: _expiries(node.data_dir) for node in cluster.nodes}
    # Logged once, by the new leader, and removed by every node at that same seq.
    assert len({tuple(s) for s in seqs.values()}) == 1 and len(seqs[new.name]) == 1, seqs
