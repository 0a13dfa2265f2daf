"""One simulated run: N nodes of the production replication code in one process.

Every node is what a deployed one runs — a real `store.Store` (an LMDB environment in a
temporary directory, synced never: a simulated crash does not lose the page cache), a
`ReplicationSource` serving its log, and on replicas a `ReplicaClient` with its `Selector`
and relayed heartbeat, bootstrapping through `replicator.bootstrap` when its sources lost
the history it needs — linked by `replicator.memnet.MemoryNetwork` on one
`VirtualClockLoop`, with their store work inline on the loop (`replicator/runtime.py`).
Every random draw (the network's, the load's, the faults') comes from the run's seed, so a
run is a pure function of its parameters: the same command prints the same JSON.

While it runs, the invariants of `sim/invariants.py` are checked at every replica commit
and every virtual second; after the faults end and the writes stop, every node must hold
the root's seq and hash head within `converge_bound` virtual seconds. A violation is
reported with the seed and the events of the nodes involved.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from core.errors import (
    BootstrapNeededError,
    ProtocolError,
    RefusedError,
    SnapshotTransferError,
)
from replicator import bootstrap
from replicator.client import ReplicaClient, ReplicationFailed
from replicator.heartbeat import RelayedHeartbeat, RootHeartbeat
from replicator.lag import GRACE_US, lag_seconds
from replicator.memnet import Conditions, MemoryNetwork, run_virtual
from replicator.runtime import Runtime, simulated
from replicator.selection import Selector
from replicator.source import ReplicationSource
from replicator.status import StatusBoard
from sim import faults as faultlib
from sim import invariants, topology
from sim.cpu import Cores, CpuCosts
from store import layout
from store.ops import SET, Op
from store.store import Store

#: The port every simulated node's source listens on (each node is its own host).
PORT = 7070
#: Virtual wall clock of the run's start (µs): a fixed instant, so runs are identical.
EPOCH_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
#: LMDB map of a simulated store (the default 64 GiB each would exhaust the address
#: space of a thousand nodes).
MAP_SIZE = 256 << 20
#: Events kept for a violation's trace, per node.
TRACE_PER_NODE = 40


@dataclass(frozen=True)
class Params:
    """What a run is a function of (with the seed)."""

    nodes: int = 20
    tiers: int = 3
    seed: int = 1
    virtual_seconds: float = 60.0
    faults: tuple[str, ...] = ()
    #: Faults per virtual second over the whole tree (None: each replica about once in ten
    #: virtual minutes).
    fault_rate: float | None = None
    #: Root write batches per virtual second (Poisson), ops per batch, value bytes.
    write_rate: float = 2.0
    batch: int = 10
    value_bytes: int = 100
    keys: int = 10_000
    heartbeat_ms: int = 1000
    staleness: float = 5.0
    failback: float = 30.0
    #: Log records each node keeps (gc every 10 virtual s; 0: keep all). A node down
    #: longer than its sources keep must bootstrap.
    retain_records: int = 0
    #: Virtual seconds at the end without faults (writes go on), then without writes.
    settle: float | None = None
    converge_bound: float = 120.0
    #: Where the stores go (None: a temporary directory, removed after).
    workdir: str | None = None
    #: One-way delay range (seconds, uniform) of every link, instead of the per-tier ones of
    #: `topology.latency` (the calibration bench sets what loopback TCP shows).
    link_delay: tuple[float, float] | None = None
    #: When not empty, every link's delay is drawn from these instead (a measured
    #: distribution: `bench/sim_calibration.py` fits per-hop costs of real processes).
    link_delay_samples: tuple[float, ...] = ()
    #: When set, each node is one core and its sends, parses and commits take virtual
    #: time drawn from these measured costs (`sim/cpu.py`); None: code costs 0 s.
    cpu: CpuCosts | None = None

    @property
    def quiet(self) -> float:
        return self.settle if self.settle is not None else min(60.0, self.virtual_seconds / 4)

    @property
    def rate(self) -> float:
        return self.fault_rate if self.fault_rate is not None else self.nodes / 600


@dataclass
class TierStats:
    nodes: int = 0
    delays: list[float] = field(default_factory=list)
    bootstraps: int = 0
    bootstrap_bytes: int = 0


class Violation(Exception):
    """An invariant failed: `nodes` are the ones whose events make its trace."""

    def __init__(self, message: str, nodes: list[str]) -> None:
        super().__init__(message)
        self.nodes = nodes


class _Root:
    def __init__(self, sim: Simulation, name: str) -> None:
        self.sim = sim
        self.name = name
        self.path = os.path.join(sim.dir, name)
        self.store = Store.create(self.path, db_id=sim.db_id, sync=False, map_size=MAP_SIZE)
        self.source: ReplicationSource | None = None

    async def start(self) -> None:
        sim = self.sim
        self.store.add_commit_listener(sim.root_committed)
        self.source = ReplicationSource(
            self.store,
            self.name,
            PORT,
            node_id=sim.rng.randbytes(16),
            heartbeat=RootHeartbeat(self.store, sim.p.heartbeat_ms, sim.runtime.now_us),
            transport=sim.net.transport(self.name),
            runtime=sim.runtime,
        )
        await self.source.start()


class _Replica:
    """One replica: store, source, client; killed and restarted by faults."""

    def __init__(self, sim: Simulation, name: str, tier: int, sources: tuple[str, ...]) -> None:
        self.sim = sim
        self.name = name
        self.tier = tier
        self.sources = sources
        self.path = os.path.join(sim.dir, name)
        self.generation = 0
        self.node_id = sim.rng.randbytes(16)
        self.store: Store | None = None
        self.source: ReplicationSource | None = None
        self.client: ReplicaClient | None = None
        self.board: StatusBoard | None = None
        self.task: asyncio.Task[None] | None = None
        self.up = False
        self.stopped: str | None = None  # why replication stopped for good
        self.seq = 0
        self.head = b""
        self.errors: dict[str, int] = {}

    async def start(self) -> None:
        sim = self.sim
        if layout.exists(self.path):
            store = Store.open(self.path, sync=False, map_size=MAP_SIZE, last_commit_durable=False)
        else:
            store = Store.create(self.path, db_id=sim.db_id, sync=False, map_size=MAP_SIZE)
        self.store = store
        self.seq, self.head = store.head()
        store.add_commit_listener(self._committed)
        relay = RelayedHeartbeat()
        self.source = ReplicationSource(
            store,
            self.name,
            PORT,
            node_id=self.node_id,
            heartbeat=relay,
            transport=sim.net.transport(self.name),
            runtime=sim.runtime,
        )
        await self.source.start()
        relay.add_listener(self.source.wake)
        self.board = StatusBoard(self.path)  # read in memory, never flushed to a file
        self.client = ReplicaClient(
            store,
            Selector([(s, PORT) for s in self.sources]),
            node_id=self.node_id,
            board=self.board,
            relay=relay,
            staleness=sim.p.staleness,
            failback=sim.p.failback,
            transport=sim.net.transport(self.name),
            runtime=sim.runtime,
        )
        self.up = True
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop everything (a crash of the node: links reset, store closed)."""
        self.up = False
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None
        if self.board is not None:
            for kind, n in self.board.status.errors.items():
                self.errors[kind] = self.errors.get(kind, 0) + n
        if self.source is not None:
            await self.source.stop()
            self.source = None
        if self.store is not None:
            self.store.close()
            self.store = None

    async def _run(self) -> None:
        assert self.client is not None
        try:
            await self.client.run()
        except BootstrapNeededError as err:
            self.sim.event(self.name, f"bootstrap needed: {err}")
            asyncio.get_running_loop().create_task(self._rebootstrap())
        except ReplicationFailed as err:
            self.stopped = str(err)
            self.sim.event(self.name, f"replication stopped: {err}")
            if self.source is not None and err.abandoned is not None:
                self.source.stop_as_diverged(*err.abandoned, str(err))

    async def _rebootstrap(self) -> None:
        """What the worker and its parent do: fetch a snapshot from the sources (resuming
        after cuts), then install it in place of the store and start again."""
        sim = self.sim
        self.generation += 1
        fresh = f"{os.path.join(sim.dir, self.name)}.g{self.generation}"
        selector = Selector([(s, PORT) for s in self.sources])
        assert self.store is not None and self.board is not None
        db_id = uuid.UUID(self.store.db_id).bytes
        while self.up:
            host, port = selector.current
            try:
                offer = await bootstrap.fetch(
                    host,
                    port,
                    fresh,
                    node_id=self.node_id,
                    db_id=db_id,
                    board=self.board,
                    transport=sim.net.transport(self.name),
                    runtime=sim.runtime,
                )
                break
            except (SnapshotTransferError, ProtocolError):
                wait = selector.retry_same()
            except (RefusedError, OSError, TimeoutError):
                wait = selector.failed()
            await asyncio.sleep(wait)
        else:
            return  # killed meanwhile
        await self.stop()
        installed = bootstrap.install(fresh, offer)
        installed.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self.path = fresh
        stats = sim.tiers[self.tier]
        stats.bootstraps += 1
        stats.bootstrap_bytes += offer.size
        sim.event(self.name, f"bootstrapped at seq {offer.seq} ({offer.size} bytes)")
        await self.start()

    def _committed(self, _seq: int) -> None:
        assert self.store is not None
        seq, head = self.store.head()
        wrong = invariants.applied(self.name, self.seq, seq, head, self.sim.root_heads)
        if wrong is not None:
            self.sim.violate(wrong, [self.name, *self.sources])
        delay = self.sim.loop.time() - self.sim.root_commit_at.get(seq, self.sim.loop.time())
        self.sim.tiers[self.tier].delays.append(delay)
        self.seq, self.head = seq, head


class Simulation:
    def __init__(self, p: Params, workdir: str) -> None:
        self.p = p
        self.dir = workdir
        self.rng = random.Random(f"sim/{p.seed}")
        self.db_id = str(uuid.UUID(bytes=self.rng.randbytes(16)))
        self.topo = topology.build(p.nodes, p.tiers)
        self.net = MemoryNetwork(p.seed)
        self.cores = None if p.cpu is None else Cores(p.cpu, p.seed)
        self.net.cpu = self.cores
        self.loop = asyncio.get_running_loop()
        self.runtime: Runtime = simulated(self.loop, EPOCH_US)
        self.root_heads: dict[int, bytes] = {0: b""}
        self.root_commit_at: dict[int, float] = {}
        self.root_seqs: list[int] = []  # last seq of every root record, in order
        self.tiers = [TierStats(nodes=len(t)) for t in self.topo.tiers]
        self.trace: dict[str, list[tuple[float, str]]] = {}
        self.violations: list[tuple[str, list[str]]] = []
        self.root = _Root(self, self.topo.root)
        self.replicas = {
            n: _Replica(self, n, self.topo.tier_of[n], self.topo.sources[n])
            for n in self.topo.replicas
        }
        self.base: dict[tuple[str, str], Conditions] = {}
        self.fault_list: list[faultlib.Fault] = []
        self.reconverge: float | None = None
        self.faults_until = max(0.0, p.virtual_seconds - p.quiet)

    # --- observations -----------------------------------------------------------------

    def event(self, node: str, what: str) -> None:
        events = self.trace.setdefault(node, [])
        events.append((round(self.loop.time(), 6), what))
        if len(events) > TRACE_PER_NODE:
            del events[0]

    def violate(self, message: str, nodes: list[str]) -> None:
        if len(self.violations) < 20:
            self.violations.append((message, nodes))
        for n in nodes[:1]:
            self.event(n, f"VIOLATION: {message}")

    def root_committed(self, _seq: int) -> None:
        seq, head = self.root.store.head()
        self.root_heads[seq] = head
        self.root_commit_at[seq] = self.loop.time()
        self.root_seqs.append(seq)

    # --- the run ----------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        p = self.p
        for name, rep in self.replicas.items():
            lo, hi = p.link_delay or topology.latency(rep.tier)
            for src in rep.sources:
                cond = Conditions(delay=(lo, hi), delay_samples=p.link_delay_samples)
                self.base[(name, src)] = cond
                self.net.set_conditions(name, src, cond)
        self.root_heads[0] = self.root.store.head()[1]
        await self.root.start()
        for rep in self.replicas.values():
            await rep.start()
        self.fault_list = faultlib.schedule(
            random.Random(f"faults/{p.seed}"),
            p.faults,
            list(self.replicas),
            rate=p.rate,
            until=self.faults_until,
        )
        tasks = [
            self.loop.create_task(self._writes()),
            self.loop.create_task(self._faults()),
            self.loop.create_task(self._sample()),
        ]
        if p.retain_records:
            tasks.append(self.loop.create_task(self._gc()))
        try:
            await tasks[0]
            await self._converge()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for rep in self.replicas.values():
                await rep.stop()
            if self.root.source is not None:
                await self.root.source.stop()
        return self.report()

    async def _writes(self) -> None:
        p = self.p
        rng = random.Random(f"writes/{p.seed}")
        store = self.root.store
        end = p.virtual_seconds
        while True:
            await asyncio.sleep(rng.expovariate(p.write_rate))
            if self.loop.time() >= end:
                return
            ops = [
                Op(SET, b"k%d" % rng.randrange(p.keys), rng.randbytes(p.value_bytes), owner="sim")
                for _ in range(p.batch)
            ]
            store.apply(ops, time_us=self.runtime.now_us())

    async def _faults(self) -> None:
        # Starts and ends in one timeline: (instant, order, start?, fault).
        timeline = sorted(
            [(f.at, i, True, f) for i, f in enumerate(self.fault_list)]
            + [(f.end, i, False, f) for i, f in enumerate(self.fault_list)],
            key=lambda e: (e[0], e[1], e[2]),
        )
        down: dict[str, int] = {}  # node -> kills in force
        for at, _i, starting, f in timeline:
            await asyncio.sleep(max(0.0, at - self.loop.time()))
            rep = self.replicas[f.node]
            src = rep.sources[0]
            self.event(f.node, f"{'start' if starting else 'end'} {f.kind} ({f.duration:.1f}s)")
            if f.kind == "kill":
                down[f.node] = down.get(f.node, 0) + (1 if starting else -1)
                if starting and down[f.node] == 1 and rep.up:
                    await rep.stop()
                elif not starting and down[f.node] == 0 and not rep.up:
                    await rep.start()
            elif f.kind == "partition":
                if starting:
                    self.net.partition(f.node, src)
                else:
                    self.net.heal(f.node, src)
            else:
                base = self.base[(f.node, src)]
                if starting:
                    self.net.set_conditions(f.node, src, _degraded(base, f.kind))
                else:
                    self.net.set_conditions(f.node, src, base)

    async def _gc(self) -> None:
        while True:
            await asyncio.sleep(10.0)
            stores = [self.root.store] + [
                r.store for r in self.replicas.values() if r.store is not None
            ]
            for s in stores:
                s.gc_log(keep_entries=self.p.retain_records * self.p.batch)

    def _streaming_from(self) -> dict[str, str]:
        out = {}
        for name, rep in self.replicas.items():
            if rep.up and rep.board is not None and rep.board.status.state == "streaming":
                out[name] = (rep.board.status.source or "").rpartition(":")[0]
        return out

    def _real_lag(self, seq: int, now: float) -> tuple[float, float]:
        """(real lag, the gap between the root commit it waits for and the one before)
        of a node holding `seq`."""
        seqs = self.root_seqs
        i = bisect.bisect_left(seqs, seq + 1)
        if i >= len(seqs):
            last = self.root_commit_at[seqs[-1]] if seqs else 0.0
            return 0.0, now - last
        t = self.root_commit_at[seqs[i]]
        prev = self.root_commit_at[seqs[i - 1]] if i > 0 else 0.0
        return now - t, t - prev

    async def _sample(self) -> None:
        interval = self.p.heartbeat_ms / 1000
        while True:
            await asyncio.sleep(1.0)
            now = self.loop.time()
            cycle = invariants.source_cycle(self._streaming_from())
            if cycle is not None:
                self.violate(f"source selection formed a cycle: {' -> '.join(cycle)}", cycle)
            now_us = self.runtime.now_us()
            for name, rep in self.replicas.items():
                if not rep.up or rep.board is None:
                    continue
                st = rep.board.status
                reported = lag_seconds(
                    now_us, st.applied_seq, st.known_us, st.hb_time_us, st.hb_seq, st.hb_interval_ms
                )
                real, gap = self._real_lag(rep.seq, now)
                tolerance = interval + GRACE_US / 1e6 + gap + 0.01
                wrong = invariants.lag(name, reported, real, tolerance)
                if wrong is not None:
                    self.violate(wrong, [name, *rep.sources])
            if self.reconverge is None and now >= self.faults_until and self._all_converged():
                self.reconverge = now - self.faults_until

    def _all_converged(self) -> bool:
        root = self.root.store.head()
        return all((r.seq, r.head) == root for r in self.replicas.values() if r.up) and all(
            r.up for r in self.replicas.values()
        )

    async def _converge(self) -> None:
        deadline = self.loop.time() + self.p.converge_bound
        while self.loop.time() < deadline and not self._all_converged():
            await asyncio.sleep(0.1)
        root = self.root.store.head()
        heads = {n: (r.seq, r.head) for n, r in self.replicas.items()}
        behind = invariants.converged(heads, root)
        for n in behind[:5]:
            rep = self.replicas[n]
            why = f" (replication stopped: {rep.stopped})" if rep.stopped else ""
            self.violate(
                f"{n} did not converge within {self.p.converge_bound:g}s after the writes "
                f"stopped: seq {rep.seq}, the root's {root[0]}{why}",
                [n, *rep.sources],
            )
        if self.reconverge is None and not behind:
            self.reconverge = self.loop.time() - self.faults_until
        # Every acknowledged write: the last value of every key written is on every node.
        if not behind:
            with self.root.store.reader() as r:
                expected = [(k, v.value) for k, v in r.scan() if v is not None][:50]
            for n, rep in self.replicas.items():
                assert rep.store is not None
                for k, v in expected:
                    got = rep.store.get(k)
                    if got is None or got.value != v:
                        self.violate(f"{n} lacks the acknowledged write of key {k!r}", [n])
                        break

    def report(self) -> dict[str, Any]:
        p = self.p
        tiers = []
        for t, st in enumerate(self.tiers[1:], start=1):
            p50, p99, mx = _percentiles(st.delays, 50, 99, 100)
            applied = sum(
                r.board.status.applied_bytes
                for r in self.replicas.values()
                if r.tier == t and r.board is not None
            )
            tiers.append(
                {
                    "tier": t,
                    "nodes": st.nodes,
                    "records_applied": len(st.delays),
                    "p50_ms": round(p50 * 1000, 3),
                    "p99_ms": round(p99 * 1000, 3),
                    "max_ms": round(mx * 1000, 3),
                    "bootstraps": st.bootstraps,
                    "bootstrap_bytes": st.bootstrap_bytes,
                    "stream_bytes": applied,
                }
            )
        counts: dict[str, int] = {}
        for f in self.fault_list:
            counts[f.kind] = counts.get(f.kind, 0) + 1
        doc: dict[str, Any] = {
            "nodes": p.nodes,
            "tiers": p.tiers,
            "seed": p.seed,
            "virtual_seconds": p.virtual_seconds,
            "faults": dict(sorted(counts.items())),
            "root_seq": self.root.store.head()[0],
            "root_records": len(self.root_seqs),
            "frames_lost": self.net.lost,
            "frames_corrupted": self.net.corrupted,
            "frames_duplicated": self.net.duplicated,
            "invariants_ok": not self.violations,
            "reconverge_s": None if self.reconverge is None else round(self.reconverge, 3),
            "per_tier": tiers,
        }
        if self.cores is not None:
            busy = self.cores.busy.values()
            span = max(self.loop.time(), 1e-9)
            doc["cpu_busy"] = {  # share of the run each node's core was working
                "max": round(max(busy, default=0.0) / span, 4),
                "mean": round(sum(busy) / max(1, len(self.cores.busy)) / span, 4),
            }
        if self.violations:
            _message, nodes = self.violations[0]
            doc["violations"] = [m for m, _ in self.violations]
            doc["trace"] = {
                n: [f"{t:.3f} {e}" for t, e in self.trace.get(n, [])] for n in dict.fromkeys(nodes)
            }
            doc["replay"] = f"mercury sim {_argv(p)}"
        return doc


def _degraded(base: Conditions, kind: str) -> Conditions:
    change = dict(faultlib.DEGRADED[kind])
    extra = change.pop("extra_delay", 0.0)
    lo, hi = base.delay
    return Conditions(
        delay=(lo + extra, hi + extra),
        delay_samples=tuple(d + extra for d in base.delay_samples),
        loss=change.get("loss", base.loss),
        reorder=change.get("reorder", base.reorder),
        reorder_delay=change.get("reorder_delay", base.reorder_delay),
        corrupt=change.get("corrupt", base.corrupt),
        duplicate=change.get("duplicate", base.duplicate),
        window=base.window,
    )


def _percentiles(values: list[float], *qs: float) -> list[float]:
    """Nearest-rank percentiles (0.0 each when there is none)."""
    if not values:
        return [0.0 for _ in qs]
    s = sorted(values)
    return [s[min(len(s) - 1, max(0, -(-len(s) * int(q) // 100) - 1))] for q in qs]


def _argv(p: Params) -> str:
    parts = [
        f"--nodes {p.nodes}",
        f"--tiers {p.tiers}",
        f"--seed {p.seed}",
        f"--virtual-seconds {p.virtual_seconds:g}",
    ]
    if p.faults:
        parts.append(f"--faults {','.join(p.faults)}")
    if p.fault_rate is not None:
        parts.append(f"--fault-rate {p.fault_rate:g}")
    if p.retain_records:
        parts.append(f"--retain-records {p.retain_records}")
    return " ".join(parts)


def simulate(p: Params, *, timing: bool = False) -> dict[str, Any]:
    """Run `p` on a fresh virtual-clock loop and return its report (`timing`: add the
    wall seconds it took, which no longer makes the report a function of `p` alone)."""
    quiet_logs()
    started = time.perf_counter()
    workdir = p.workdir or tempfile.mkdtemp(prefix="mercury-sim-")

    async def go() -> dict[str, Any]:
        return await Simulation(p, workdir).run()

    try:
        doc = run_virtual(go())
    finally:
        if p.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if timing:
        doc["wall_seconds"] = round(time.perf_counter() - started, 3)
    return doc


def quiet_logs() -> None:
    """The replication code logs every broken stream; a run with faults breaks thousands:
    the report and its trace say what matters."""
    logging.getLogger("mercury").setLevel(logging.CRITICAL)
    with contextlib.suppress(Exception):
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
