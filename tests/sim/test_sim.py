"""The replication simulator (`mercury sim`, `sim/`): a run is a pure function of its seed
and parameters, a small sweep with every fault kind holds every invariant, a skipped
seq-gap check is caught within a few seeds, and the production bugs it found stay fixed."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

import replicator.client
from replicator.heartbeat import RelayedHeartbeat
from replicator.memnet import MemoryNetwork, run_virtual
from replicator.runtime import simulated
from sim import invariants, topology
from sim.cpu import CpuCosts
from sim.faults import KINDS, parse_kinds, schedule
from sim.run import Params, simulate
from sim.sweep import sweep
from store.store import Store
from testkit.procs import run_mercury
from testkit.replication import mem_client, mem_source, running

#: A small tree under every fault kind, often (a fault every two virtual seconds).
SMALL = Params(
    nodes=10,
    tiers=3,
    virtual_seconds=20.0,
    faults=KINDS,
    fault_rate=0.5,
    retain_records=20,
    settle=5.0,
    converge_bound=60.0,
)


def test_the_same_seed_prints_the_same_report() -> None:
    argv = ["sim", "--nodes", "8", "--tiers", "3", "--virtual-seconds", "15", "--faults", "all"]
    argv += ["--fault-rate", "0.5", "--retain-records", "20"]
    first = run_mercury(*argv, "--seed", "4")
    assert first.returncode == 0, first.stderr
    again = run_mercury(*argv, "--seed", "4")
    assert again.stdout == first.stdout  # byte for byte: delays, losses, faults, figures
    other = run_mercury(*argv, "--seed", "5")
    assert other.stdout != first.stdout
    doc = json.loads(first.stdout)
    assert doc["invariants_ok"] is True
    assert sum(doc["faults"].values()) > 0
    assert [t["tier"] for t in doc["per_tier"]] == [1, 2]
    assert all(t["p99_ms"] >= t["p50_ms"] > 0 for t in doc["per_tier"])


def test_a_small_sweep_under_every_fault_holds_every_invariant() -> None:
    doc = sweep(SMALL, range(1, 9))
    assert doc["faults_injected"] > 40
    assert doc["failed"] == []


def test_a_skipped_seq_gap_check_is_caught_within_five_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The historical bug: a record that does not continue the stream is taken anyway
    (a lost frame then reaches the store as a gap, and the replica stops for good)."""
    monkeypatch.setattr(replicator.client, "discontinuity", lambda _received, _first: None)
    drops = replace(SMALL, faults=("drop",))
    caught = None
    for seed in range(1, 6):
        doc = simulate(replace(drops, seed=seed))
        if not doc["invariants_ok"]:
            caught = doc
            break
    assert caught is not None, "the simulator missed a replica taking gapped records"
    assert "did not converge" in caught["violations"][0]
    assert f"--seed {caught['seed']}" in caught["replay"]
    assert any("seq gap" in e for events in caught["trace"].values() for e in events)


def test_a_relaying_source_waits_for_its_first_heartbeat(tmp_path: Path) -> None:
    """Found by `mercury sim --nodes 5 --tiers 3 --seed 1` (it never got past 4 virtual
    seconds): a replica's source with a downstream stream and no upstream heartbeat yet
    treated a heartbeat as due at every turn and read its log in a busy loop, for as long
    as its own source was away."""
    t1 = Store.create(str(tmp_path / "t1"), sync=False)
    t2 = Store.create(str(tmp_path / "t2"), db_id=t1.db_id, sync=False)
    reads = 0
    read_log = t1.read_log

    def counted(*a: object, **kw: object) -> object:
        nonlocal reads
        reads += 1
        if reads > 5000:  # the bug: the stream spins at one instant; end it
            raise RuntimeError("busy loop")
        return read_log(*a, **kw)  # type: ignore[arg-type]

    t1.read_log = counted  # type: ignore[method-assign,assignment]

    async def go() -> None:
        rt = simulated(asyncio.get_running_loop(), 0)
        net = MemoryNetwork(1)
        src = await mem_source(net, "t1", t1, heartbeat=RelayedHeartbeat(), runtime=rt)
        client = mem_client(net, "t2", t2, ["t1"], runtime=rt)
        try:
            async with running(client):
                await asyncio.sleep(10)  # ten virtual seconds, no heartbeat ever
        finally:
            await src.stop()

    try:
        run_virtual(go())
    finally:
        t2.close()
        t1.close()
    assert reads < 50


def test_a_deadline_that_rounds_to_now_still_passes() -> None:
    """Found by `mercury sim --nodes 5 --tiers 3 --seed 1` (after the fix above): on the
    virtual clock a wait of `interval - elapsed` = 4e-16 s rounds to the current instant,
    fires, is not yet due, and was set again at that instant for ever."""

    async def go() -> int:
        loop = asyncio.get_running_loop()
        loop.now = 3.1076191424369455  # type: ignore[attr-defined]
        last = loop.time()
        loop.now = 4.1076191424369455  # type: ignore[attr-defined]
        turns = 0
        while loop.time() - last < 1.0:
            turns += 1
            assert turns < 1000, "the clock never moved past the deadline"
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(max(0.0, 1.0 - (loop.time() - last))):
                    await asyncio.Event().wait()
        return turns

    assert run_virtual(go()) < 10


def test_the_tree_has_its_tiers_and_no_cycle() -> None:
    assert topology.tier_sizes(1000, 6) == [1, 4, 14, 52, 196, 733]
    topo = topology.build(50, 4)
    assert sum(len(t) for t in topo.tiers) == 50
    for name, sources in topo.sources.items():
        assert all(topo.tier_of[s] < topo.tier_of[name] for s in sources)
    assert invariants.source_cycle({n: s[0] for n, s in topo.sources.items()}) is None
    assert invariants.source_cycle({"a": "b", "b": "c", "c": "a", "d": "a"}) == ["a", "b", "c", "a"]


def test_faults_are_named_and_drawn_from_the_seed() -> None:
    import random

    assert parse_kinds("all") == KINDS
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_kinds("kill,meteor")
    a = schedule(random.Random(1), KINDS, ["n1", "n2"], rate=1.0, until=30.0)
    assert a == schedule(random.Random(1), KINDS, ["n1", "n2"], rate=1.0, until=30.0)
    assert a and all(f.end <= 30.0 for f in a)


def test_the_invariants_name_what_is_wrong() -> None:
    heads = {0: b"", 5: b"h5", 9: b"h9"}
    assert invariants.applied("n1", 0, 5, b"h5", heads) is None
    assert "replayed" in (invariants.applied("n1", 5, 5, b"h5", heads) or "")
    assert "gap or a corrupt" in (invariants.applied("n1", 5, 9, b"xx", heads) or "")
    assert invariants.lag("n1", 0.0, 0.4, 1.3) is None
    assert "reports lag" in (invariants.lag("n1", 0.0, 5.0, 1.3) or "")


def test_a_lag_that_ignores_the_heartbeats_age_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose stale heartbeat still counts as fresh reports 0 behind a partition
    while the root writes on: the lag invariant names it on the first seed."""
    import sim.run

    def mutant(
        now_us: int, applied: int, known: int, hb_us: int, hb_seq: int, _ms: int
    ) -> float | None:
        if hb_us == 0 and known == 0:
            return None
        if hb_us and applied >= hb_seq:  # no freshness check: the mutation
            return 0.0
        return max(0.0, (now_us - known) / 1e6)

    monkeypatch.setattr(sim.run, "lag_seconds", mutant)
    doc = simulate(replace(SMALL, faults=("partition",)))
    assert not doc["invariants_ok"]
    assert any("reports lag 0.000s" in v for v in doc["violations"])


def test_a_cpu_model_charges_each_hop_its_costs_and_keeps_runs_identical() -> None:
    """Each node one core (`sim/cpu.py`): a record's hop is its sender's send, the link,
    the receiver's parse, commit and two apply-thread hand-offs; with constant costs the
    median propagation is exactly that sum per tier, and the run stays a function of its
    seed."""
    costs = CpuCosts(
        parse=(0.001,), commit=(0.002,), commit_bytes=0, commit_per_byte=0.0,
        handoff=(0.001,), send=(0.001,),
    )  # fmt: skip
    p = Params(
        nodes=4, tiers=3, virtual_seconds=20.0, write_rate=1.0, batch=1, settle=0.0,
        link_delay=(0.01, 0.01), cpu=costs,
    )  # fmt: skip
    doc = simulate(p)
    assert doc["invariants_ok"] is True
    hop = 0.001 + 0.01 + 0.001 + 0.002 + 2 * 0.001
    assert [t["p50_ms"] for t in doc["per_tier"]] == [
        pytest.approx(hop * 1000, abs=0.01),
        pytest.approx(2 * hop * 1000, abs=0.01),
    ]
    assert 0 < doc["cpu_busy"]["mean"] <= doc["cpu_busy"]["max"] < 1
    assert simulate(p) == doc
