"""Root -> tier 1 -> tier 2 with real processes: convergence, status, restarts; the
refusals of a wrong source over the in-memory transport."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx

from replicator.heartbeat import RelayedHeartbeat
from replicator.memnet import MemoryNetwork
from replicator.status import read_status
from store.check import check
from store.ops import SET, Op
from store.store import Store
from testkit import metrics
from testkit.logged import records
from testkit.procs import Procs, alive
from testkit.replication import (
    contents,
    items,
    mem_client,
    mem_source,
    root_node,
    running,
    status,
    until,
    wait_for,
    wait_seq,
)
from tests.replicator.nodes import restart, start_replica


def assert_same(root_store: Store, *dirs: Path) -> None:
    """Every node: equal seq, hash head and contents; store invariants hold."""
    want = root_store.head()
    want_items = items(root_store)
    for d in dirs:
        s = Store.open(str(d), readonly=True)
        try:
            assert s.head() == want, f"{d}: head {s.head()} != root {want}"
            report = check(s)
            assert report.ok, report.problems
        finally:
            s.close()
        assert contents(str(d)) == want_items, f"{d}: contents differ from the root"


def applier_metrics(port: int) -> dict[str, float]:
    """The replica's `mercury_replication_*_total` applier counters, by short name."""
    got = metrics.unlabelled(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    short = ("applied_records", "applied_bytes", "apply_commits", "apply_seconds")
    names = {f"mercury_replication_{k}_total": k for k in (*short, "worker_cpu_seconds")}
    return {k: got[name] for name, k in names.items() if name in got}


def applied_tail(port: int) -> tuple[float, float] | None:
    """(records, bytes) the replica's applier counted, once it published both."""
    got = applier_metrics(port)
    if "applied_records" not in got or "applied_bytes" not in got:
        return None
    return got["applied_records"], got["applied_bytes"]


def test_root_tier1_tier2_converge_after_20000_writes(tmp_path: Path, procs: Procs) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(2000)
        t1 = start_replica(procs, tmp_path / "t1", [root.port], name="t1")
        t2 = start_replica(procs, tmp_path / "t2", [t1.repl], name="t2")
        root.write(18000, start=2000, batch=250)
        seq = root.store.last_seq()
        assert seq == 20000
        wait_seq(t2.http, seq, timeout=90)
        wait_seq(t1.http, seq)
        st = status(t2.http)
        assert st["role"] == "replica"
        assert st["hash_head"] == root.store.head()[1].hex()
        assert st["source"] == f"127.0.0.1:{t1.repl}"
        wait_for(lambda: status(t2.http)["lag_seconds"] == 0.0, 10, "zero lag at tier 2")
        metrics = httpx.get(f"http://127.0.0.1:{t2.http}/metrics").text
        assert f"mercury_replication_applied_seq {float(seq)}" in metrics
        assert "mercury_replication_lag_seconds 0.0" in metrics
        # The applier's counters: the records tier 2 streamed after its bootstrap, i.e. a
        # tail of the root's log, counted and sized byte for byte as replicated, in at most
        # as many transactions, with the time and CPU they took.
        log = list(records(root.store, 1))
        tails = {
            (float(len(log) - i), float(sum(len(r.header) + len(r.payload) for r in log[i:])))
            for i in range(len(log))
        }
        wait_for(lambda: applied_tail(t2.http) in tails, 10, "the applier's counters at tier 2")
        got = applier_metrics(t2.http)
        assert 1 <= got["apply_commits"] <= got["applied_records"]
        assert got["apply_seconds"] > 0 and got["worker_cpu_seconds"] > 0
        value = httpx.get(f"http://127.0.0.1:{t2.http}/v1/kv/k00019999")
        assert value.status_code == 200 and value.content.startswith(b"v19999")
        workers = [read_status(str(d)) for d in (t1.data_dir, t2.data_dir)]
        assert procs.terminate(t2.proc) == 0  # clean SIGTERM shutdown
        assert procs.terminate(t1.proc) == 0
        for w in workers:  # the worker children are gone too
            assert w is not None and not alive(w.pid)
        assert_same(root.store, t1.data_dir, t2.data_dir)


def test_replica_resumes_after_sigkill_mid_stream_without_replay_or_gap(
    tmp_path: Path, procs: Procs
) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(500)
        r = start_replica(procs, tmp_path / "r", [root.port], name="r")
        wait_seq(r.http, 500)
        # Kill the applying worker (the child) mid-stream: the parent restarts it.
        root.write(3000, start=500, batch=20)
        st = read_status(str(r.data_dir))
        assert st is not None
        os.kill(st.pid, signal.SIGKILL)
        root.write(3000, start=3500, batch=20)
        wait_seq(r.http, root.store.last_seq())
        # Kill the whole replica mid-stream, then start it again.
        root.write(3000, start=6500, batch=20)
        worker = read_status(str(r.data_dir))
        assert worker is not None and alive(worker.pid)
        procs.kill(r.proc)
        # The worker dies with its parent (the kernel kills it): nothing is applied after
        # the kill, so the store's seq below is where the restart must resume. (Its zombie
        # counts as dead: an orphan waits for PID 1 to reap it, up to ~2 s on some machines.
        # 5 s leaves room for an fsync in progress, which SIGKILL waits for.)
        wait_for(lambda: not alive(worker.pid), 5, "the worker killed with its parent")
        root.write(2000, start=9500, batch=20)
        applied_before = Store.open(str(r.data_dir), readonly=True)
        before = applied_before.last_seq()
        applied_before.close()
        r = restart(procs, r, name="r2")
        st2 = wait_seq(r.http, root.store.last_seq())
        assert st2["replication_errors"] == {}, st2  # no gap, no repeat was ever seen
        assert before > 0
        procs.terminate(r.proc)
        assert_same(root.store, r.data_dir)
        log = procs.logs()
        assert f"streaming from 127.0.0.1:{root.port} at seq {before + 1}" in log


def test_db_id_mismatch_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    root.apply([Op(SET, b"k", b"v", owner="t")])
    other = Store.create(str(tmp_path / "other"), sync=False)  # another database

    async def go() -> str | None:
        net = MemoryNetwork()
        source = await mem_source(net, "root", root)
        client = mem_client(net, "other", other, ["root"])
        try:
            async with running(client):
                await until(lambda: "refused" in client.board.status.errors, 10, "a refusal")
                return client.board.status.error
        finally:
            await source.stop()

    try:
        error = asyncio.run(go())
        assert error is not None and "db id mismatch" in error, error
        assert other.last_seq() == 0
    finally:
        other.close()
        root.close()


def test_replicating_from_itself_is_refused(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    root.apply([Op(SET, b"k", b"v", owner="t")])
    a = Store.create(str(tmp_path / "a"), db_id=root.db_id, sync=False)

    async def go() -> str | None:
        net = MemoryNetwork()
        # Node "a" serves its store and is told to follow its own address.
        own = await mem_source(net, "a", a, heartbeat=RelayedHeartbeat())
        client = mem_client(net, "a", a, ["a"], node_id=own.node_id)
        try:
            async with running(client):
                await until(lambda: "refused" in client.board.status.errors, 10, "a refusal")
                return client.board.status.error
        finally:
            await own.stop()

    try:
        error = asyncio.run(go())
        assert error is not None and "replicating from itself" in error, error
    finally:
        a.close()
        root.close()
