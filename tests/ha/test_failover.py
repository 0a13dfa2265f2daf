"""SIGKILL the leader while 8 writers write: no acknowledged write lost, one history.

Three candidates (the leader and two standbys, `--sync-standbys 1`, lease TTL 2 s). Each
round kills the leader's candidate process (its root process dies with it), waits for the
first write acknowledged by the new leader, and restarts the killed node, which rejoins as a
standby (moving aside any tail it committed that nobody acknowledged). A plain replica lists
every candidate with `--source`. At the end every node holds the same seq and hash head,
the same log record for record, and every acknowledged write, and the replica reached the
same head without bootstrapping again. `bench/failover.py` runs 20 rounds and reports the
failover times.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from testkit.etcd import Etcd
from testkit.hacluster import Cluster, Writers, log_records, lost_writes, start_replica
from testkit.procs import Procs
from testkit.wait import wait_until

ROUNDS = 2


def test_sigkill_leader_under_writers_loses_nothing(
    etcd: Etcd, procs: Procs, tmp_path: Path
) -> None:
    cluster = Cluster(procs, tmp_path, etcd.url, n=3)
    cluster.start()
    replica = start_replica(cluster, tmp_path / "replica")
    failovers = []
    with Writers(cluster, 8) as writers:
        for _ in range(ROUNDS):
            # The kill lands mid-stream: once the writers are acknowledged again, not
            # after a pause a loaded machine may spend before their first answer.
            writers.wait_acks(len(writers.acked) + 50)
            old = cluster.wait_leader()
            cluster.kill(old)
            t0 = time.monotonic()
            failovers.append(writers.first_ack_after(t0, not_by=old))
            new = cluster.wait_leader(not_=old)
            assert new is not old
            cluster.start_node(old)  # rejoins as a standby
            cluster.wait_standbys(2)
        # Writes acknowledged with the restarted node back as a standby, before they stop.
        writers.wait_acks(20, after=time.monotonic())
    seq, head = cluster.wait_converged()
    # The replica follows whichever candidate leads, without a gap or a bootstrap: it never
    # got a record a failover undid (leaders stream replicas only what standbys confirmed).

    def replica_head() -> tuple[object, object]:
        rst = replica.status() or {}
        return rst.get("seq"), rst.get("hash_head")

    with contextlib.suppress(TimeoutError):
        wait_until(lambda: replica_head() == (seq, head), 60, "the replica at the leader's head")
    assert replica_head() == (seq, head), replica.status()
    log = (tmp_path / "logs").glob("replica-*.log")
    text = "".join(p.read_text(errors="replace") for p in log)
    assert text.count("installed snapshot") == 1, "the replica bootstrapped again"
    assert "diverged" not in text
    assert replica.proc is not None
    procs.terminate(replica.proc)
    for node in cluster.nodes:
        cluster.stop(node)
    acked = writers.acked
    assert len(acked) > 50, writers.errors
    for node in cluster.nodes:
        assert lost_writes(node.data_dir, acked) == [], node.name
    # One history: the same records, record by record, on every node (from the first
    # seq all of them still hold).
    logs = [dict((s, (n, h)) for s, n, h in log_records(node.data_dir)) for node in cluster.nodes]
    common = set.intersection(*(set(lg) for lg in logs))
    assert common, "no common log records"
    for s in sorted(common):
        assert len({lg[s] for lg in logs}) == 1, f"seq {s} has two contents"
    # The failover bound: lease TTL + election poll + the warm root's start (generous:
    # the machine is shared).
    assert max(failovers) < 30, failovers
    print(f"failovers {failovers} seq {seq} head {head} acked {len(acked)} {writers.errors}")
