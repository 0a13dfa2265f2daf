"""A root restored with `mercury restore` from an older snapshot, its replicas real
`mercury replica` processes: one that applied writes the restore took back stops as
diverged as soon as it reconnects, though the root takes no write at all (before the
`restore` record it waited out `ROLLBACK_MARGIN`, a minute, reporting lag 0); one at the
snapshot's seq streams on."""

from __future__ import annotations

from pathlib import Path

from testkit.procs import Procs, run_mercury
from testkit.replication import root_node, status, wait_for, wait_seq
from tests.replicator.nodes import restart, start_replica

#: How long a reconnecting replica may take: its reconnect backoff is capped at 5 s
#: (`selection.Selector.cap`) and the root's first heartbeat goes out on connect; the rest
#: is margin for a loaded machine. A condition wait, not a timing assert.
DETECT_WITHIN_S = 15.0


def test_replicas_of_a_restored_root_diverge_or_continue(tmp_path: Path, procs: Procs) -> None:
    live, snap = tmp_path / "root", tmp_path / "backup.mdb"
    with root_node(str(live)) as root:
        root.write(50, batch=10)
        port = root.port
        behind = start_replica(procs, tmp_path / "behind", [port], repl=False, name="behind")
        wait_seq(behind.http, 50)
        assert procs.terminate(behind.proc) == 0
    r = run_mercury("snapshot", str(live), str(snap))
    assert r.returncode == 0, r.stderr
    with root_node(str(live), port=port, reopen=True) as root:
        root.write(50, start=50, batch=10)
        ahead = start_replica(procs, tmp_path / "ahead", [port], repl=False, name="ahead")
        wait_seq(ahead.http, 100)
    r = run_mercury("restore", str(snap), str(live))
    assert r.returncode == 0, r.stderr
    assert "above seq 50" in r.stdout, r.stdout

    with root_node(str(live), port=port, reopen=True) as root:
        assert root.store.last_seq() == 51  # the snapshot's 50, then the `restore` record
        wait_for(
            lambda: status(ahead.http)["replication_state"] == "diverged",
            DETECT_WITHIN_S,
            "the replica ahead of the restored root stopped as diverged",
        )
        err = status(ahead.http)["replication_error"]
        assert "diverged history at seq 51" in err, err
        assert status(ahead.http)["seq"] == 100  # it keeps serving what it holds

        behind = restart(procs, behind, name="behind")
        wait_seq(behind.http, 51)
        # Its seq can reach 51 a moment before its state says streaming: wait for both.
        wait_for(
            lambda: status(behind.http)["replication_state"] == "streaming",
            DETECT_WITHIN_S,
            "the replica behind the restored root streams",
        )
        st = status(behind.http)
        assert st["hash_head"] == root.store.head()[1].hex()
