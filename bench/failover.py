"""Root candidates on etcd: failover time, ack latency and bulk load with a sync standby.

Real etcd, real `mercury root --ha-etcd` candidates, real sockets; one JSON object out.

- ``failover``: three candidates (`--sync-standbys 1`), 8 writers writing through any
  candidate; each round SIGKILLs the leader's candidate and measures the time from the kill
  to the first write acknowledged afterwards, then restarts the killed node (it rejoins as
  a standby). P50/P99 over `--rounds` (goal: at most the lease TTL + 2 s). Every
  acknowledged write is checked on every node at the end.
- ``sdk``: the same failover as clients see it: `--sdk-writers` threads, each a
  `mercury_client.Client` given all three candidates' URLs with its default settings (retry
  budget included), writing unique keys; each of `--sdk-rounds` rounds SIGKILLs the leader.
  Reports failed writes (goal: 0), the failover P50/P99 (kill to the first write another
  node acknowledged) and the longest single write, and checks every acknowledged write on
  every node. Lease TTL `--ttl` (default 5, the server's default). Then a rolling restart of
  the three (SIGTERM, start again, rejoin, in turn) under the same writers: its failed writes.
- ``ack``: single-key PUTs on a fixed schedule of `--rate`/s (latency from the scheduled
  send time) against a leader with one synchronous standby and against a leader whose
  standby is not waited for (`--sync-standbys 0`), both clusters running at once and the
  phases interleaved (goal: P99 at most +10 ms), per phase and pooled over every measured
  phase of a cluster (`--seconds 4 --repeats 10`: many short alternations, so that a burst
  of the shared machine lands on both clusters alike). Each phase also gives, from the leader's
  /metrics, P50/P99 (histogram bucket bounds) of request-received-to-answer, of the commit
  and of commit-to-answer (the wait for the standby's confirmation): where the time goes.
- ``bulk``: pairs/s through ``POST /v1/batch`` (1,000 pairs per request, `--bulk-conns`
  connections, default 16) against the same two clusters, interleaved (goal: at least
  0.8x). On one machine the asynchronous standby shares the CPUs and defers its applies
  past the phase, so the bench also reports how far behind it was and the sustained rate:
  pairs over the phase plus the standby's catch-up time.

Usage: python bench/failover.py [--only failover,sdk,ack,bulk] [--rounds N] [--ttl S]
       [--keep-logs DIR] [--sdk-rounds N] [--sdk-writers N]
       [--rate N] [--seconds S] [--repeats N] [--ack-conns N] [--bulk-conns N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.gateway_write import closed_loop, open_loop, pct, req
from mercury_client import Client, MercuryClientError
from testkit.etcd import Etcd
from testkit.hacluster import Cluster, Writers, log_records, lost_writes
from testkit.procs import Procs
from testkit.wait import wait_until


def pctl(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(len(s) * p))], 3)


def failover(base: Path, procs: Procs, etcd: Etcd, rounds: int, ttl: int) -> dict[str, Any]:
    cluster = Cluster(procs, base / "fo", etcd.url, n=3, ttl_s=ttl)
    cluster.start()
    times = []
    failure = None
    with Writers(cluster, 8) as writers:
        for r in range(rounds):
            time.sleep(1.0)
            old = cluster.wait_leader()
            cluster.kill(old)
            t0 = time.monotonic()
            try:
                times.append(writers.first_ack_after(t0, timeout=120, not_by=old))
                cluster.wait_leader(not_=old)
                cluster.start_node(old)
                cluster.wait_standbys(2, timeout=120)
            except AssertionError as err:  # reported with the rounds done so far
                failure = f"round {r + 1}: {str(err)[:300]}"
                break
            print(f"round {r + 1}: {times[-1]:.2f} s", file=sys.stderr)
    if failure is not None:
        return {"rounds_done": len(times), "failover_s": times, "failure": failure}
    head = cluster.wait_converged()
    for node in cluster.nodes:
        cluster.stop(node)
    lost = sum(len(lost_writes(n.data_dir, writers.acked)) for n in cluster.nodes)
    # One history: every node's retained log, record for record (seq, entries, hash head),
    # over the seqs all of them still hold.
    logs = [{s: (n, h) for s, n, h in log_records(node.data_dir)} for node in cluster.nodes]
    common = set.intersection(*(set(x) for x in logs))
    differ = sum(1 for s in common if len({x[s] for x in logs}) > 1)
    return {
        "rounds": rounds,
        "lease_ttl_s": ttl,
        "failover_s": [round(t, 2) for t in times],
        "failover_p50_s": pctl(times, 0.5),
        "failover_p99_s": pctl(times, 0.99),
        "failover_max_s": round(max(times), 3),
        "goal_s": ttl + 2,
        "acknowledged_writes": len(writers.acked),
        "acknowledged_writes_lost": lost,
        "converged_seq_hash_head": [head[0], head[1]],
        "log_records_compared": len(common),
        "log_records_differing": differ,
    }


#: Writes one SDK writer makes at most (the phase ends long before, by its rounds).
SDK_MAX_WRITES = 1_000_000


class SdkWriters:
    """`n` threads, each a `mercury_client.Client` with every candidate's URL and default
    settings, writing unique keys until stopped; every acknowledged write is recorded as
    `Writers` records it (time, key, value, the node that answered) and every failed one
    (the exception the SDK raised after its retries) is counted."""

    def __init__(self, cluster: Cluster, n: int) -> None:
        self.cluster = cluster
        self.urls = [node.url for node in cluster.nodes]
        self.by_url = {node.url: node.name for node in cluster.nodes}
        self.acked: list[tuple[float, str, bytes, str]] = []
        self.failed: list[str] = []
        self.longest_s = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(n)]

    def __enter__(self) -> SdkWriters:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _run(self, w: int) -> None:
        with Client(self.urls, self.cluster.token) as c:
            for i in range(SDK_MAX_WRITES):
                if self._stop.is_set():
                    return
                key, value = f"k/s{w}/{i}", f"{w}:{i}".encode()
                t = time.monotonic()
                try:
                    c.put(key, value)
                except MercuryClientError as err:
                    with self._lock:
                        self.failed.append(f"{key}: {err}"[:300])
                    continue
                done = time.monotonic()
                # The URL the client keeps to is the one that answered this write.
                node = self.by_url.get(c._writes.base(), "?")
                with self._lock:
                    self.acked.append((done, key, value, node))
                    self.longest_s = max(self.longest_s, done - t)

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def first_ack_after(self, t0: float, not_by: str, timeout: float = 120.0) -> float:
        """Seconds from `t0` to the first write another node than `not_by` acknowledged."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                after = [a[0] for a in self.acked if a[0] > t0 and a[3] != not_by]
            if after:
                return min(after) - t0
            time.sleep(0.02)
        raise AssertionError(f"no write acknowledged {timeout}s after the kill")


def sdk_failover(
    base: Path, procs: Procs, etcd: Etcd, rounds: int, ttl: int, writers: int
) -> dict[str, Any]:
    cluster = Cluster(procs, base / "sdk", etcd.url, n=3, ttl_s=ttl)
    cluster.start()
    times: list[float] = []
    failure = None
    with SdkWriters(cluster, writers) as sdk:
        for r in range(rounds):
            # Writes flowing through the current leader before it dies (a count, not a pause).
            want = sdk.count() + 200
            wait_until(lambda: sdk.count() >= want, 120, "writes before the kill")  # noqa: B023
            old = cluster.wait_leader()
            cluster.kill(old)
            t0 = time.monotonic()
            try:
                times.append(sdk.first_ack_after(t0, old.name))
                cluster.wait_leader(not_=old)
                cluster.start_node(old)
                cluster.wait_standbys(2, timeout=120)
            except AssertionError as err:
                failure = f"round {r + 1}: {str(err)[:300]}"
                break
            print(f"sdk round {r + 1}: {times[-1]:.2f} s", file=sys.stderr)
        # Then a rolling restart (SIGTERM, start again, rejoin) of every candidate in turn,
        # the leader among them, under the same writers.
        failed_before, acked_before = len(sdk.failed), sdk.count()
        rolling_done = 0
        if failure is None:
            try:
                for node in list(cluster.nodes):
                    want = sdk.count() + 200
                    wait_until(lambda: sdk.count() >= want, 120, "writes before a restart")  # noqa: B023
                    cluster.stop(node)
                    cluster.start_node(node)
                    cluster.wait_standbys(2, timeout=120)
                    rolling_done += 1
                    print(f"sdk rolling restart: {node.name} back", file=sys.stderr)
            except AssertionError as err:
                failure = f"rolling restart: {str(err)[:300]}"
        rolling = {
            "candidates_restarted": rolling_done,
            "acknowledged_writes": sdk.count() - acked_before,
            "failed_writes": len(sdk.failed) - failed_before,
        }
    out: dict[str, Any] = {
        "rounds": rounds,
        "rounds_done": len(times),
        "lease_ttl_s": ttl,
        "writers": writers,
        "client": "mercury_client.Client(every candidate's URL), default settings",
        "acknowledged_writes": len(sdk.acked),
        "failed_writes": len(sdk.failed),
        "failed_examples": sdk.failed[:5],
        "failover_s": [round(t, 2) for t in times],
        "longest_write_s": round(sdk.longest_s, 3),
        "rolling_restart": rolling,
    }
    if times:
        out |= {"failover_p50_s": pctl(times, 0.5), "failover_p99_s": pctl(times, 0.99)}
    if failure is not None:
        return out | {"failure": failure}
    cluster.wait_converged()
    for node in cluster.nodes:
        cluster.stop(node)
    out["acknowledged_writes_lost"] = sum(
        len(lost_writes(n.data_dir, sdk.acked)) for n in cluster.nodes
    )
    return out


#: Histograms each leader exports that split a write's latency (seconds): request received
#: to answer, the commit (LMDB + fsync), and commit to answer (the standbys' confirmation)
SPLIT = {
    "server_ack": "mercury_write_ack_seconds",
    "commit": "mercury_batch_commit_seconds",
    "gate_wait": "mercury_batch_ack_wait_seconds",
}


def histograms(url: str) -> dict[str, dict[float, float]]:
    """Cumulative bucket counts (upper bound -> count) of each `SPLIT` histogram, summed
    over labels, from the leader's /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, dict[float, float]] = {k: {} for k in SPLIT}
    names = {v + "_bucket": k for k, v in SPLIT.items()}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            k = names.get(sample.name)
            if k is not None:
                le = float(sample.labels["le"])
                out[k][le] = out[k].get(le, 0.0) + sample.value
    return out


def bucket_pctl(before: dict[float, float], after: dict[float, float], p: float) -> float | None:
    """The bucket bound (ms) holding the `p` quantile of what was observed in between."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    for b, c in zip(bounds, counts, strict=True):
        if c >= p * counts[-1]:
            return round(b * 1000, 2)
    return None


def split(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]) -> Any:
    """P50/P99 (bucket bounds, ms) of each `SPLIT` histogram over one phase."""
    return {
        k: [bucket_pctl(before[k], after[k], 0.5), bucket_pctl(before[k], after[k], 0.99)]
        for k in SPLIT
    }


@contextlib.contextmanager
def no_client_gc() -> Iterator[None]:
    """No cyclic collection in this (the load generator's) process during a phase: with
    thousands of request tasks alive its older-generation passes paused the client 40-47 ms
    every ~6 s, and that pause, in whichever phase it fell, was the P99 of that phase
    (the servers tune their own collector, `mercury/gctune.py`). Collected between phases."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()


def standby_behind(c: Cluster) -> int:
    """Leader's seq minus the standby's, now."""
    seqs = {}
    for n in c.nodes:
        st = n.status() or {}
        seqs[st.get("role")] = int(st.get("seq") or 0)
    return seqs.get("leader", 0) - seqs.get("standby", 0)


def pair_cluster(base: Path, procs: Procs, etcd: Etcd, name: str, sync: int) -> Cluster:
    c = Cluster(procs, base / name, etcd.url, n=2, ttl_s=5, sync_standbys=sync, group=name)
    c.start()
    return c


def ack_and_bulk(
    base: Path,
    procs: Procs,
    etcd: Etcd,
    only: set[str],
    rate: float,
    seconds: float,
    repeats: int,
    bulk_conns: int,
    ack_conns: int,
) -> dict[str, Any]:
    clusters = {
        "sync1": pair_cluster(base, procs, etcd, "sync1", 1),
        "sync0": pair_cluster(base, procs, etcd, "sync0", 0),
    }
    leaders = {k: c.wait_leader().url for k, c in clusters.items()}
    tokens = {k: c.token for k, c in clusters.items()}
    value = b"v" * 100
    out: dict[str, Any] = {}
    if "ack" in only:
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in clusters}
        #: the machine's 1-minute load average after each measured phase (the figures move
        #: with it on a shared machine)
        loads: list[float] = []
        #: every measured latency of each cluster: percentiles over all its phases, which
        #: one burst of the shared machine moves less than one phase's
        pooled: dict[str, list[float]] = {k: [] for k in clusters}
        # An unmeasured phase on each first (the first phase of a fresh cluster paid its
        # warm-up: connections, caches, the standby's first session), then the phases
        # alternate which cluster goes first, so neither always runs after the other.
        for rep in range(-1, repeats):
            order = list(clusters) if rep % 2 == 0 else list(reversed(clusters))
            for k in order:
                tag = f"a{rep}{k}"

                def put(i: int, tag: str = tag, k: str = k) -> bytes:
                    return req("PUT", f"/v1/kv/k/{tag}/{i}", value, tokens[k])

                secs = seconds if rep >= 0 else min(seconds, 2.0)
                before = histograms(leaders[k])
                keep = pooled[k] if rep >= 0 else None
                with no_client_gc():
                    r = asyncio.run(open_loop(leaders[k], rate, secs, put, ack_conns, keep))
                r["server_p50_p99_ms"] = split(before, histograms(leaders[k]))
                if rep >= 0:
                    runs[k].append(r)
                    loads.append(round(os.getloadavg()[0], 2))
        p99_deltas = [
            a["p99_ms"] - b["p99_ms"] for a, b in zip(runs["sync1"], runs["sync0"], strict=True)
        ]
        out["ack"] = {
            "rate_per_s": rate,
            "connections": ack_conns,
            "runs": runs,
            "load_1m_after_phase": loads,
            "p50_ms": {k: [r.get("p50_ms") for r in v] for k, v in runs.items()},
            "p50_delta_ms": [
                round(a["p50_ms"] - b["p50_ms"], 2)
                for a, b in zip(runs["sync1"], runs["sync0"], strict=True)
            ],
            "p99_ms": {k: [r.get("p99_ms") for r in v] for k, v in runs.items()},
            "p99_delta_ms": [round(d, 2) for d in p99_deltas],
            "goal_delta_ms": 10,
            # The paired phases' median delta and how many pairs met the goal: one burst
            # of foreign load on the shared machine moves one pair, not these.
            "p99_delta_ms_median": round(statistics.median(p99_deltas), 2),
            "phases_within_goal": f"{sum(d <= 10 for d in p99_deltas)} of {len(p99_deltas)}",
            "pooled": {k: pct(v) for k, v in pooled.items()},
            "pooled_p99_delta_ms": round(
                pct(pooled["sync1"]).get("p99_ms", 0.0) - pct(pooled["sync0"]).get("p99_ms", 0.0), 2
            ),
            "server_p50_p99_ms": {k: [r["server_p50_p99_ms"] for r in v] for k, v in runs.items()},
        }
    if "bulk" in only:
        bruns: dict[str, list[float]] = {k: [] for k in clusters}
        #: seqs the standby had not applied yet when the phase ended: work the
        #: asynchronous standby deferred past the measurement (same machine, same CPUs)
        behind: dict[str, list[int]] = {k: [] for k in clusters}
        #: pairs over (phase + the time the standby took to catch up afterwards)
        sustained: dict[str, list[float]] = {k: [] for k in clusters}
        bloads: list[float] = []
        for rep in range(repeats):
            for k in clusters:
                tag = f"b{rep}{k}"

                def batch(i: int, tag: str = tag, k: str = k) -> bytes:
                    ops = ",".join(
                        f'{{"op":"set","key":"k/{tag}/{i:08d}/{j:04d}","value":"{"v" * 100}"}}'
                        for j in range(1000)
                    )
                    body = ('{"ops":[' + ops + "]}").encode()
                    return req("POST", "/v1/batch", body, tokens[k], "application/json")

                r = asyncio.run(closed_loop(leaders[k], bulk_conns, seconds, batch))
                bruns[k].append(round(r["per_s"] * 1000, 1))
                bloads.append(round(os.getloadavg()[0], 2))
                behind[k].append(standby_behind(clusters[k]))
                t0 = time.monotonic()
                while standby_behind(clusters[k]) > 0 and time.monotonic() - t0 < 300:
                    time.sleep(0.05)
                catch_up = time.monotonic() - t0
                pairs = r["requests"] * 1000
                sustained[k].append(round(pairs / (seconds + catch_up), 1))
        out["bulk"] = {
            "connections": bulk_conns,
            "load_1m_after_phase": bloads,
            "pairs_per_s": bruns,
            "ratio_sync1_over_sync0": [
                round(a / b, 3) for a, b in zip(bruns["sync1"], bruns["sync0"], strict=True)
            ],
            "standby_seqs_behind_at_phase_end": behind,
            "sustained_pairs_per_s": sustained,
            "sustained_ratio": [
                round(a / b, 3) for a, b in zip(sustained["sync1"], sustained["sync0"], strict=True)
            ],
            "goal_ratio": 0.8,
        }
    for c in clusters.values():
        for node in c.nodes:
            c.stop(node)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="failover,sdk,ack,bulk")
    ap.add_argument("--sdk-rounds", type=int, default=10)
    ap.add_argument("--sdk-writers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ttl", type=int, default=5)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bulk-conns", type=int, default=16)
    ap.add_argument("--keep-logs", default="", help="copy every process's log here at the end")
    # Enough that no request waits for a free connection: with C connections and an ack
    # latency L the client carries at most C/L requests/s, and past that the open loop
    # measures its own queue (at 2,000/s and 64 connections, any L above 32 ms).
    ap.add_argument("--ack-conns", type=int, default=512)
    args = ap.parse_args()
    # SIGTERM stops every process this bench started (the `finally` below runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="mercury-failover-") as tmp:
        base = Path(tmp)
        (base / "logs").mkdir()
        procs = Procs(base / "logs")
        result: dict[str, Any] = {}
        try:
            etcd = Etcd(procs, base / "etcd")
            if "failover" in only:
                result["failover"] = failover(base, procs, etcd, args.rounds, args.ttl)
            if "sdk" in only:
                result["sdk_failover"] = sdk_failover(
                    base, procs, etcd, args.sdk_rounds, args.ttl, args.sdk_writers
                )
            if only & {"ack", "bulk"}:
                result.update(
                    ack_and_bulk(
                        base,
                        procs,
                        etcd,
                        only,
                        args.rate,
                        args.seconds,
                        args.repeats,
                        args.bulk_conns,
                        args.ack_conns,
                    )
                )
        except BaseException:
            print(procs.logs()[-8000:], file=sys.stderr)
            raise
        finally:
            procs.stop_all()
            if args.keep_logs:
                shutil.copytree(base / "logs", args.keep_logs, dirs_exist_ok=True)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
