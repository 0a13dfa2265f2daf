"""Replication under network faults: a proxy that cuts, delays, duplicates, drops and
truncates frames; stale sources; collected history; cut and concurrent bootstraps."""

from __future__ import annotations

import os
import random
from pathlib import Path

from store.check import check
from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs
from testkit.replication import RootNode, items, root_node, status, wait_for, wait_seq
from tests.faults.proxy import FaultProxy, Faults
from tests.replicator.nodes import restart, start_replica


def assert_same(root: RootNode, *dirs: Path) -> None:
    """Equal seq, hash head and contents on every node; invariants hold."""
    want, want_items = root.store.head(), items(root.store)
    for d in dirs:
        s = Store.open(str(d), readonly=True)
        try:
            assert s.head() == want
            assert check(s).ok
            assert items(s) == want_items
        finally:
            s.close()


def follower_store(root: RootNode, path: Path) -> None:
    """An empty store of the root's database (streams from seq 1, no bootstrap)."""
    Store.create(str(path), db_id=root.store.db_id).close()


def test_faulty_network_causes_no_divergence_and_every_gap_is_detected(
    tmp_path: Path, procs: Procs
) -> None:
    with root_node(str(tmp_path / "root")) as root:
        proxy = FaultProxy(root.port)
        try:
            follower_store(root, tmp_path / "r")
            r = start_replica(procs, tmp_path / "r", [proxy.port], repl=False, name="r")
            phases = {
                "drop": (Faults(drop_every=3), "StreamGapError"),
                "duplicate": (Faults(duplicate_every=3), "StreamGapError"),
                "truncate": (Faults(truncate_every=4), "ProtocolError"),
                "cut": (Faults(cut_after=3000), "ProtocolError"),
                "delay": (Faults(delay=0.01), None),
            }
            start = 0
            for name, (faults, error_kind) in phases.items():
                proxy.faults = faults
                before = dict(status(r.http).get("replication_errors") or {})
                root.write(400, start=start, batch=20)
                start += 400
                wait_seq(r.http, root.store.last_seq(), timeout=60)
                if name != "delay":
                    assert proxy.injected.get(name if name != "cut" else "cut", 0) > 0, name
                after = status(r.http).get("replication_errors") or {}
                if error_kind is not None:
                    assert after.get(error_kind, 0) > before.get(error_kind, 0), (name, after)
            proxy.faults = Faults()
            procs.terminate(r.proc)
            assert_same(root, tmp_path / "r")
        finally:
            proxy.close()


def test_replica_fails_over_to_next_source_after_staleness(tmp_path: Path, procs: Procs) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(100)
        stalled = FaultProxy(root.port, Faults(blackhole_after=1))  # WELCOME, then silence
        try:
            follower_store(root, tmp_path / "r")
            r = start_replica(
                procs,
                tmp_path / "r",
                [stalled.port, root.port],
                "--staleness-s",
                "1.5",
                repl=False,
                name="r",
            )
            wait_seq(r.http, 100, timeout=30)
            st = status(r.http)
            assert st["source"] == f"127.0.0.1:{root.port}"
            assert st["replication_errors"].get("stale", 0) >= 1
            root.write(100, start=100)
            wait_seq(r.http, 200)
        finally:
            stalled.close()


def test_collected_history_makes_the_replica_bootstrap(tmp_path: Path, procs: Procs) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(1000)
        r = start_replica(procs, tmp_path / "r", [root.port], repl=False, name="r")
        wait_seq(r.http, 1000)
        procs.terminate(r.proc)
        root.write(2000, start=1000)
        assert root.store.gc_log(keep_entries=100) > 0
        assert root.store.log_bounds()[0] > 1001
        r = restart(procs, r, name="r2", wait=False)
        wait_for(lambda: status(r.http)["seq"] == root.store.last_seq(), 60, "re-bootstrap")
        root.write(50, start=5000)
        wait_seq(r.http, root.store.last_seq())
        procs.terminate(r.proc)
        assert_same(root, tmp_path / "r")
        assert "history no longer retained" in procs.logs()


def _big_root(root: RootNode, n: int, size: int) -> None:
    rnd = random.Random(7)
    for b in range(0, n, 100):
        root.store.apply(
            [
                Op(SET, f"big{i:06d}".encode(), rnd.randbytes(size), owner="t")
                for i in range(b, b + 100)
            ]
        )


def test_bootstrap_cut_at_half_resumes_instead_of_restarting(tmp_path: Path, procs: Procs) -> None:
    with root_node(str(tmp_path / "root")) as root:
        _big_root(root, 3000, 4000)
        path, info = root.call(root.source._snapshot_for(""))
        assert os.path.getsize(path) == info.size > 8 << 20
        proxy = FaultProxy(root.port, Faults(cut_after=info.size // 2, only_first=1))
        try:
            r = start_replica(procs, tmp_path / "r", [proxy.port], repl=False, name="r")
            wait_seq(r.http, root.store.last_seq())
            transfers = root.source.stats.transfers
            assert transfers[0] == (info.sha256, 0)
            assert len(transfers) == 2, transfers
            sha, offset = transfers[1]
            assert sha == info.sha256 and offset > 0.45 * info.size, transfers
            assert root.source.stats.bytes_sent < 1.6 * info.size
            procs.terminate(r.proc)
            assert_same(root, tmp_path / "r")
        finally:
            proxy.close()


def test_four_bootstraps_at_once_never_exceed_the_bound(tmp_path: Path, procs: Procs) -> None:
    with root_node(str(tmp_path / "root"), max_bootstraps=1) as root:
        _big_root(root, 1000, 4000)
        replicas = [
            start_replica(
                procs, tmp_path / f"r{i}", [root.port], repl=False, name=f"r{i}", wait=False
            )
            for i in range(4)
        ]
        for r in replicas:
            wait_seq(r.http, root.store.last_seq(), timeout=90)
        stats = root.source.stats
        assert stats.served == 4 and stats.peak == 1, stats
        for r in replicas:
            procs.terminate(r.proc)
        assert_same(root, *(r.data_dir for r in replicas))


def test_replica_returns_to_its_preferred_source_once_healthy(tmp_path: Path, procs: Procs) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(100)
        preferred = FaultProxy(root.port)
        port = preferred.port
        preferred.close()  # the preferred source is down at start
        follower_store(root, tmp_path / "r")
        r = start_replica(
            procs,
            tmp_path / "r",
            [port, root.port],
            "--failback-s",
            "0.5",
            repl=False,
            name="r",
        )
        wait_seq(r.http, 100)
        assert status(r.http)["source"] == f"127.0.0.1:{root.port}"
        preferred = FaultProxy(root.port, port=port)  # back up
        try:
            wait_for(lambda: status(r.http)["source"] == f"127.0.0.1:{port}", 20, "failback")
            root.write(100, start=100)
            st = wait_seq(r.http, 200)
            assert st["source"] == f"127.0.0.1:{port}"
            assert not any(
                k in st["replication_errors"] for k in ("StreamGapError", "ProtocolError")
            )
        finally:
            preferred.close()
