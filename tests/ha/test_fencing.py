"""Cut the leader from etcd: it stops acknowledging within its lease; one history.

Three candidates; the leader reaches etcd through a fault proxy that black-holes the link.
The leader can no longer renew its lease, so its root process stops acknowledging at the
lease deadline (last renewal sent + TTL - margin) — before etcd expires the lease and
another candidate can win. Writers pinned to each node record which node acknowledged what
and when. After the link heals, the deposed leader rejoins as a standby (discarding any tail
it committed that nobody acknowledged) and every node holds the same log, record by
record, with every acknowledged write.
"""

from __future__ import annotations

import time
from pathlib import Path

from testkit.etcd import Etcd
from testkit.hacluster import Cluster, Writers, log_records, lost_writes
from testkit.procs import Procs, free_port
from tests.ha.faultproxy import FaultProxy

TTL_S = 2


def test_leader_cut_from_etcd_stops_acknowledging_within_its_lease(
    etcd: Etcd, procs: Procs, tmp_path: Path
) -> None:
    proxy = FaultProxy(free_port(), etcd.client_port)
    try:
        cluster = Cluster(procs, tmp_path, etcd.url, n=3, ttl_s=TTL_S)
        _start(cluster, proxy)
        n0 = cluster.nodes[0]
        assert cluster.wait_leader() is n0
        with Writers(cluster, 9, pins=cluster.nodes) as writers:
            # Cut once the leader acknowledges, with writes in flight (a fixed pause may
            # pass before its first answer on a loaded machine).
            writers.wait_acks(20, by=n0, timeout=30)
            proxy.cut()
            # Taken once the cut is in place: every renewal that reached n0 was sent before.
            t_cut = time.monotonic()
            new = cluster.wait_leader(not_=n0)
            writers.wait_acks(1, by=new, after=t_cut, timeout=30)  # the new leader's first
            proxy.heal()
            cluster.wait_standbys(2)
            # Writes acknowledged with n0 back as a standby, before they stop.
            writers.wait_acks(20, by=new, after=time.monotonic())
        # When n0 acknowledged is known to lie between the request's send and the answer's
        # arrival; the bounds are checked against the send, which cannot come out late on a
        # loaded machine (the arrival can), and writers pinned to n0 keep sending to it, so
        # a node that went on acknowledging is still caught.
        sent_n0 = [writers.sent[a[1]] for a in writers.acked if a[3] == n0.name]
        by_new = [a[0] for a in writers.acked if a[3] == new.name and a[0] > t_cut]
        assert sent_n0 and by_new, writers.errors
        assert max(sent_n0) < t_cut + TTL_S, (
            f"a request sent {max(sent_n0) - t_cut:.2f}s after the cut was acknowledged"
        )
        assert max(sent_n0) < min(by_new), "two leaders acknowledged at the same time"
        cluster.wait_converged()
        for node in cluster.nodes:
            cluster.stop(node)
        for node in cluster.nodes:
            assert lost_writes(node.data_dir, writers.acked) == [], node.name
        logs = [{s: (n, h) for s, n, h in log_records(node.data_dir)} for node in cluster.nodes]
        common = set.intersection(*(set(lg) for lg in logs))
        assert common
        for s in sorted(common):
            assert len({lg[s] for lg in logs}) == 1, f"seq {s} has two contents"
    finally:
        proxy.close()


def _start(cluster: Cluster, proxy: FaultProxy) -> None:
    from testkit.hacluster import Node

    for i in range(cluster.n):
        cluster.nodes.append(
            Node(
                f"n{i}",
                cluster.base / f"n{i}",
                free_port(),
                free_port(),
                etcd_urls=proxy.url if i == 0 else None,
            )
        )
    cluster.start()
