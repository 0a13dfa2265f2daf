"""A replica applier's CPU per MB absorbed, and its entry rate against the root's (JSON).

A real root store (fsync) served by a real `ReplicationSource` (in this process, on a
thread) streams its whole log to a child process running a real `ReplicaClient` into an
empty store of the same database (fsync on, opened as the replica's worker opens it):
the replica's worker, with nothing else in it, on the worker's event loop (uvloop). The
child counts its own CPU (`resource.getrusage`, user + system, all its threads) from its
first connection until its store holds the root's last seq; startup and imports are not
counted. Workloads:

- ``40k-x2``: fresh 40 KiB random values, two per record (what a 10 ms batch window
  gathers from a handful of writers);
- ``40k-1mb``: fresh 40 KiB random values, 25 per record (~1 MB batches);
- ``100b``: fresh 100-byte values, 1,000 per record; the root's own `Store.apply` rate
  of the same batches into a fresh store (fsync; with each ``--chain-hash``, each column
  compared with its own) is timed every round, beside the replica's entries/s (goal: >=
  1x; medians compared).

``--live``: each child follows a fresh root while that root writes the same batches
(fsync, back to back, in this process), so records arrive one by one and groups are small
(a commit per record or two) as on a replica of a busy root; its entries/s is then the
root's pace, and its CPU window includes the second it waits for the first write.

MB is 10^6 bytes of values absorbed. ``--trees A,B`` runs the child from other source
trees too (each a checkout with its `store/_codec` built), interleaved round by round
against the same root stores: a before/after A/B in one run. ``--apply-window-ms
0,20`` runs each tree's child with each apply window (`ReplicaClient.apply_window`; without
it, the tree's replica default): the columns are then ``TREE@Nms``. A tree from before
apply windows has none and ignores the setting: its runs show ``apply_window_s`` null,
whatever its column's name. ``--chain-hash sha256,blake2b-256`` runs each column once per
chain hash (roots and replicas created with it; columns ``COLUMN#HASH``): the same records
but for their hash heads, so the difference is the chain's cost. ``--py-spy DIR`` records
each child under py-spy (``--native``, every thread; collapsed stacks, one file per run).
``--perf DIR`` records each child under ``perf record -g`` instead (every thread, kernel
included; read with ``perf report -i``). Profiled runs are slower: their CPU figures are
not the ones to quote. ``--hold-freed-memory`` holds a virtual machine's free page
reporting off for the run and first touches the free memory once (`bench/guestmem.py`;
root only, restored at the end): the appliers' new page-cache pages then come from
memory the guest still has, not memory its host took back, whose first touch costs the
writer's CPU.

Usage: .venv/bin/python bench/apply_cost.py [--mb 64] [--entries-100b 200000]
       [--rounds 3] [--only 40k-x2,40k-1mb,100b] [--trees .,/tmp/base] [--live]
       [--apply-window-ms 0,20] [--chain-hash sha256,blake2b-256] [--py-spy DIR | --perf DIR]
       [--hold-freed-memory]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MB = 1e6
#: Longest a child may take for one workload (a stuck replica fails the bench, not hangs it).
CHILD_TIMEOUT = 300.0
#: Time a live child gets to start and connect before its root writes.
LIVE_CONNECT_S = 1.5


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(a: argparse.Namespace) -> None:
    """The applier process: stream from 127.0.0.1:port into a fresh store at `a.dir`."""
    sys.path.insert(0, os.getcwd())  # the tree under test (cwd), not necessarily ours
    from replicator import client as client_mod
    from replicator.client import ReplicaClient
    from replicator.heartbeat import RelayedHeartbeat
    from replicator.selection import Selector
    from replicator.status import StatusBoard
    from store import codec
    from store.store import Store

    # The root's chain hash when the bench names one (a tree from before format 6 has one).
    chain = {"chain_hash": a.chain} if a.chain else {}
    Store.create(a.dir, db_id=a.db_id, sync=True, map_size=8 << 30, **chain).close()
    try:  # opened as the replica's worker opens it (a tree from before the option: sync all)
        store = Store.open(a.dir, sync=True, map_size=8 << 30, last_commit_durable=False)
    except TypeError:
        store = Store.open(a.dir, sync=True, map_size=8 << 30)
    try:  # and its heap kept as the worker keeps it (a tree from before: glibc's own)
        from replicator import heap

        heap.keep_freed_memory()
    except ImportError:
        pass

    class Board(StatusBoard):
        """Tells the moment the target seq is applied: the client reports every applied
        group here, so the child waits on it instead of polling the store (a poll every few
        ms would add its own CPU to a live run's figure, which follows a slow root)."""

        def __init__(self, data_dir: str) -> None:
            super().__init__(data_dir)
            self.reached = asyncio.Event()

        def update(self, **changes: Any) -> None:
            super().update(**changes)
            if changes.get("applied_seq", 0) >= a.target:
                self.reached.set()

    # The replica's own default window, unless the bench names one (a tree without
    # apply windows takes none).
    window: dict[str, Any] = {}
    if hasattr(client_mod, "APPLY_WINDOW"):
        ms = a.window_ms
        window["apply_window"] = client_mod.APPLY_WINDOW if ms is None else ms / 1000

    async def run() -> tuple[float, float]:
        board = Board(a.dir)
        client = ReplicaClient(
            store,
            Selector([("127.0.0.1", a.port)]),
            node_id=uuid.uuid4().bytes,
            board=board,
            relay=RelayedHeartbeat(),
            **window,
        )
        t0, c0 = time.perf_counter(), _cpu()
        task = asyncio.create_task(client.run())
        reached = asyncio.create_task(board.reached.wait())
        await asyncio.wait({task, reached}, timeout=CHILD_TIMEOUT, return_when="FIRST_COMPLETED")
        if not reached.done():
            reached.cancel()
            if task.done():
                task.result()  # raises what stopped it
                raise RuntimeError("replication ended before the target seq")
            raise TimeoutError(f"seq {store.last_seq()} of {a.target} after {CHILD_TIMEOUT}s")
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return wall, cpu

    try:  # the event loop the replication worker runs (replicator/worker.py)
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    wall, cpu = asyncio.run(run())
    store.close()
    print(
        json.dumps(
            {"wall_s": wall, "cpu_s": cpu, "codec": codec.IMPLEMENTATION, **window},
        )
    )


WORKLOADS = {
    # name: (value size, values per record)
    "40k-x2": (40 << 10, 2),
    "40k-1mb": (40 << 10, 25),
    "100b": (100, 1000),
}


def make_batches(name: str, n_values: int) -> list[list[Any]]:
    """`n_values` fresh values of workload `name`, in its records' batches."""
    sys.path.insert(0, str(ROOT))
    from store.ops import SET, Op

    size, per = WORKLOADS[name]
    # Random values (incompressible, like the read bench's); 100-byte ones as hex text.
    batches = [
        [
            Op(
                SET,
                f"{name}/{i:010d}".encode(),
                os.urandom(size // 2).hex().encode() if size <= 4096 else os.urandom(size),
                owner="bench",
            )
            for i in range(b, min(n_values, b + per))
        ]
        for b in range(0, n_values, per)
    ]
    return batches


def build_root(tmp: Path, name: str, batches: list[list[Any]], chain: str | None) -> Any:
    """A RootNode (chain hash `chain`, None: the default) holding `batches`."""
    from testkit.replication import RootNode

    tag = f"root-{name}-{chain or 'default'}"
    root = RootNode(
        str(tmp / tag), heartbeat_ms=1000, sync=True, map_size=8 << 30, chain_hash=chain
    )
    for ops in batches:
        root.store.apply(ops)
    return root


def root_apply_s(tmp: Path, batches: list[list[Any]], chain: str | None) -> float:
    """Seconds the root's own `Store.apply` takes for `batches` into a fresh store (fsync
    on, chain hash `chain`), timed per call as the root's write path runs them."""
    from store.store import Store

    d = tempfile.mkdtemp(prefix="rootrate-", dir=tmp)
    store = Store.create(os.path.join(d, "s"), sync=True, map_size=8 << 30, chain_hash=chain)
    spent = 0.0
    try:
        for ops in batches:
            t0 = time.perf_counter()
            store.apply(ops)
            spent += time.perf_counter() - t0
    finally:
        store.close()
        subprocess.run(["rm", "-rf", d], check=False)
    return spent


def start_child(
    tree: str,
    tmp: Path,
    port: int,
    db_id: str,
    target: int,
    profile: str | None,
    window_ms: float | None,
    chain: str | None,
) -> tuple[subprocess.Popen[str], str]:
    """Start the applier child (see `child`); its data directory."""
    d = tempfile.mkdtemp(prefix="replica-", dir=tmp)
    cmd_child = [
        sys.executable,
        str(ROOT / "bench" / "apply_cost.py"),
        "--child",
        "--dir",
        os.path.join(d, "s"),
        "--port",
        str(port),
        "--db-id",
        db_id,
        "--target",
        str(target),
        *(["--window-ms", str(window_ms)] if window_ms is not None else []),
        *(["--chain", chain] if chain else []),
    ]
    if profile and profile.endswith(".perf"):  # CPU samples of every thread, kernel too
        cmd = ["perf", "record", "-q", "-F", "999", "-g", "-o", profile, "--", *cmd_child]
    elif profile:  # py-spy starts the child and samples all its threads
        spy = str(Path(sys.executable).parent / "py-spy")
        cmd = [spy, "record", "--native", "--rate", "500", "--format", "raw", "-o", profile]
        cmd += ["--", *cmd_child]
    else:
        cmd = cmd_child
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, d


def finish_child(proc: subprocess.Popen[str], d: str, tree: str) -> dict[str, Any]:
    """Wait for the child; its JSON line."""
    try:
        stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"applier child failed ({tree}): {stderr[-2000:]}")
    subprocess.run(["rm", "-rf", d], check=False)
    last = [ln for ln in stdout.splitlines() if ln.startswith("{")][-1]
    out: dict[str, Any] = json.loads(last)
    return out


def run_child(
    tree: str,
    tmp: Path,
    port: int,
    db_id: str,
    target: int,
    profile: str | None,
    window_ms: float | None,
    chain: str | None,
) -> dict[str, Any]:
    """Catch-up: the child streams a root's whole log, already written."""
    proc, d = start_child(tree, tmp, port, db_id, target, profile, window_ms, chain)
    return finish_child(proc, d, tree)


def run_live(
    tree: str,
    tmp: Path,
    batches: list[list[Any]],
    profile: str | None,
    window_ms: float | None,
    chain: str | None,
) -> dict[str, Any]:
    """Live: a fresh root writes `batches` (fsync, as fast as it commits them) while the
    child follows it, so records arrive one by one as a replica of a busy root sees them."""
    from testkit.replication import RootNode

    root = RootNode(
        tempfile.mkdtemp(prefix="live-", dir=tmp) + "/root",
        heartbeat_ms=1000,
        sync=True,
        map_size=8 << 30,
        chain_hash=chain,
    )
    try:
        target = sum(len(ops) for ops in batches)
        proc, d = start_child(
            tree, tmp, root.port, root.store.db_id, target, profile, window_ms, chain
        )
        time.sleep(LIVE_CONNECT_S)  # the child connects before the first write
        for ops in batches:
            root.store.apply(ops)
        return finish_child(proc, d, tree)
    finally:
        root.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=64.0, help="MB of 40 KiB values per workload")
    ap.add_argument("--entries-100b", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--trees", default=".", help="source trees to run the applier from")
    ap.add_argument("--live", action="store_true", help="follow a root while it writes")
    ap.add_argument(
        "--apply-window-ms",
        default=None,
        help="apply windows to run each tree's child with (comma list; default: the tree's)",
    )
    ap.add_argument(
        "--chain-hash",
        default=None,
        help="chain hashes to run each column with (comma list; default: the store's default)",
    )
    ap.add_argument("--py-spy", dest="profile", default=None, help="directory for profiles")
    ap.add_argument("--perf", default=None, help="directory for `perf record` files")
    ap.add_argument(
        "--hold-freed-memory", action="store_true",
        help="hold the VM's free page reporting off for the run (bench/guestmem.py)",
    )  # fmt: skip
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--db-id", help=argparse.SUPPRESS)
    ap.add_argument("--target", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--window-ms", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--chain", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    if str(ROOT) not in sys.path:  # (the child imports only the tree under test)
        sys.path.insert(0, str(ROOT))
    from bench import guestmem

    paths = [str(ROOT) if t == "." else str(Path(t).resolve()) for t in a.trees.split(",")]
    windows: list[float | None] = (
        [float(w) for w in a.apply_window_ms.split(",")] if a.apply_window_ms else [None]
    )
    chains: list[str | None] = a.chain_hash.split(",") if a.chain_hash else [None]
    # Each (tree, window, chain hash) is a column, named by its tree (and window and chain
    # hash, when several).
    variants = {
        (p if len(windows) == 1 else f"{p}@{w:g}ms") + (f"#{c}" if len(chains) > 1 else ""): (
            p,
            w,
            c,
        )
        for p in paths
        for w in windows
        for c in chains
    }
    trees = list(variants)
    names = [n for n in a.only.split(",") if n]
    out: dict[str, Any] = {
        "settings": {
            "mb": a.mb,
            "entries_100b": a.entries_100b,
            "rounds": a.rounds,
            "trees": trees,
            "live": a.live,
            "load_avg_start": os.getloadavg()[0],
            "hold_freed_memory": a.hold_freed_memory,
            "chain_hash": chains,
        },
        "free_page_reporting": guestmem.state(),
        "workloads": {},
    }
    hold, why_not = guestmem.hold_if_asked(a.hold_freed_memory)
    if why_not:
        out["settings"]["hold_freed_memory"] = False
        out["notes"] = [why_not]
    with hold as warmed, tempfile.TemporaryDirectory(prefix="apply-cost-") as tmp_s:
        out["free_memory_warmed"] = warmed
        tmp = Path(tmp_s)
        for name in names:
            size, per = WORKLOADS[name]
            n = a.entries_100b if size <= 4096 else int(a.mb * MB / size)
            batches = make_batches(name, n)
            # Catch-up: one root per chain hash, holding the same batches.
            roots = {} if a.live else {c: build_root(tmp, name, batches, c) for c in chains}
            try:
                mb = n * size / MB
                runs: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
                # The root's own rate with each chain hash, beside the replicas.
                root_rates: dict[str | None, list[float]] = {c: [] for c in chains}
                for r in range(a.rounds):
                    if size <= 4096 and not a.live:
                        for c in chains:
                            root_rates[c].append(n / root_apply_s(tmp, batches, c))
                    # Alternate the order each round: neither tree always runs first.
                    order = trees if r % 2 == 0 else list(reversed(trees))
                    for t in order:
                        prof = None
                        path, window, chain = variants[t]
                        tag = (Path(path).name or "tree") + (
                            f"-{window:g}ms" if window is not None else ""
                        )
                        tag += f"-{chain}" if chain else ""
                        for where, ext in ((a.profile, "txt"), (a.perf, "perf")):
                            if where:
                                Path(where).mkdir(parents=True, exist_ok=True)
                                prof = str(Path(where).resolve() / f"{name}-{tag}-{r}.{ext}")
                        if a.live:
                            got = run_live(path, tmp, batches, prof, window, chain)
                        else:
                            root = roots[chain]
                            got = run_child(
                                path,
                                tmp,
                                root.port,
                                root.store.db_id,
                                root.store.last_seq(),
                                prof,
                                window,
                                chain,
                            )
                        runs[t].append(
                            {
                                "cpu_ms_per_mb": round(got["cpu_s"] * 1000 / mb, 2),
                                "entries_s": round(n / got["wall_s"]),
                                "mb_s": round(mb / got["wall_s"], 1),
                                "codec": got["codec"],
                                "apply_window_s": got.get("apply_window"),
                            }
                        )
                res: dict[str, Any] = {
                    "values": n,
                    "value_bytes": size,
                    "values_per_record": per,
                    "mb": round(mb, 1),
                    # (with several chain hashes: the first's; each column's ratio uses its own)
                    "root_apply_entries_s_median": round(statistics.median(root_rates[chains[0]]))
                    if root_rates[chains[0]]
                    else None,
                    "root_apply_entries_s_all": [round(x) for x in root_rates[chains[0]]],
                }
                if len(chains) > 1 and root_rates[chains[0]]:
                    res["root_apply_entries_s_median_by_chain_hash"] = {
                        str(c): round(statistics.median(root_rates[c])) for c in chains
                    }
                for t in trees:
                    cpu = [x["cpu_ms_per_mb"] for x in runs[t]]
                    rate = [x["entries_s"] for x in runs[t]]
                    own = root_rates[variants[t][2]]
                    res[t] = {
                        "cpu_ms_per_mb_median": statistics.median(cpu),
                        "cpu_ms_per_mb_all": cpu,
                        "entries_s_median": statistics.median(rate),
                        "vs_root_apply_rate": round(
                            statistics.median(rate) / statistics.median(own), 2
                        )
                        if own
                        else None,
                        "runs": runs[t],
                    }
                if len(trees) > 1:
                    base = statistics.median([x["cpu_ms_per_mb"] for x in runs[trees[-1]]])
                    res["cpu_ratio_first_vs_last_tree"] = round(
                        res[trees[0]]["cpu_ms_per_mb_median"] / base, 3
                    )
                out["workloads"][name] = res
            finally:
                for root in roots.values():
                    root.close()
    out["settings"]["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
