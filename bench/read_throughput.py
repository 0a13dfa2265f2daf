"""Hot-key point-read throughput and latency per core: Mercury against the servers it replaces.

Four servers, each pinned to one CPU (`--server-cpu`, default 1) while a C load generator
(`bench/loadgen.c`, compiled here with `cc -O2`) runs pinned to another (`--client-cpu`,
default 0):

- Mercury HTTP `GET /v1/kv/{key}` and Mercury memcached `get` (`python -m mercury.readserve`
  over a store holding the hot keys; one process serves both listeners);
- Kyoto Tycoon REST `GET /{key}` (`/usr/local/bin/ktserver` or `--ktserver`, a `.kch` file
  database; skipped with a note when absent);
- memcached 1.6 `get` (`memcached` on the PATH; skipped with a note when absent; `make
  bench-deps` installs it).

Each server gets the same `--keys` hot keys with `--value-bytes` values. Per round and
server: `--conns` (64) keep-alive connections with one request in flight each (closed loop,
no pipelining) for `--seconds`, then one connection for `--seconds`: throughput, P50, P99.
Servers are measured in turn inside each round and rounds are interleaved, so load from
elsewhere on the machine falls on all of them alike; the figure of a server is its median
round, with every round's beside it.

With `--workers N` (N > 1), Mercury also runs as `python -m mercury.readserve --read-workers N`
unpinned, beside the same server with one worker unpinned, and both are reported with the
server processes' CPU time, so scaling is throughput per CPU-second of the server as well
as raw throughput (the load generator shares the machine's cores).

Prints one JSON document: settings, raw rounds, medians and the ratios
`http_vs_kt_rest`, `memcached_vs_memcached`, P99 at `--conns` and P50 at one connection
against KT's. Bounded: every run ends after `--seconds`; every process is stopped by PID.

Usage: .venv/bin/python bench/read_throughput.py [--rounds R] [--seconds S] [--conns C]
       [--workers N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import cpucap  # noqa: E402
from store.ops import SET, Op  # noqa: E402
from store.store import Store  # noqa: E402
from testkit import procstat  # noqa: E402
from testkit.procs import (  # noqa: E402
    free_port,
    wait_port,
)

KTSERVER = "/usr/local/bin/ktserver"


def build_loadgen(tmp: Path) -> str:
    """Compile bench/loadgen.c into `tmp`; the binary's path."""
    out = tmp / "loadgen"
    subprocess.run(
        ["cc", "-O2", "-o", str(out), str(REPO / "bench" / "loadgen.c")],
        check=True,
        capture_output=True,
    )
    return str(out)


def hot_keys(n: int) -> list[bytes]:
    return [b"hot%02d" % i for i in range(n)]


def value_of(key: bytes, size: int) -> bytes:
    return (key * (size // len(key) + 1))[:size]


def start(cmd: list[str], cpu: int | None) -> subprocess.Popen[bytes]:
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    return subprocess.Popen(
        pin + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def run_load(
    loadgen: str,
    mode: str,
    port: int,
    conns: int,
    seconds: float,
    paths: list[str],
    cpu: int | None,
) -> dict[str, Any]:
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    out = subprocess.run(
        [*pin, loadgen, mode, str(port), str(conns), str(seconds), *paths],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
    )
    if out.returncode != 0:
        raise RuntimeError(f"loadgen {mode} :{port} failed: {out.stderr.strip()}")
    doc: dict[str, Any] = json.loads(out.stdout)
    if doc["errors"]:
        raise RuntimeError(f"{mode} :{port}: {doc['errors']} non-200/miss replies: {doc}")
    return doc


# --- servers ---------------------------------------------------------------------------


class Target:
    """One measured server: how to reach it and what to ask."""

    def __init__(self, name: str, mode: str, port: int, paths: list[str], pid: int) -> None:
        self.name = name
        self.mode = mode
        self.port = port
        self.paths = paths
        self.pid = pid  # the server process (its CPU time is read around each run)


def mercury(
    tmp: Path, keys: list[bytes], size: int, cpu: int | None, workers: int = 1
) -> tuple[subprocess.Popen[bytes], list[Target]]:
    data = tmp / f"mercury-{workers}"
    if not data.exists():
        with Store.create(str(data)) as s:
            s.apply([Op(SET, k, value_of(k, size), "bench") for k in keys])
    hp, mp = free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "mercury.readserve",
        str(data),
        "--listen",
        f"127.0.0.1:{hp}",
        "--memcached-listen",
        f"127.0.0.1:{mp}",
    ]
    if workers > 1:
        cmd += ["--read-workers", str(workers)]
        # Each reader writes its metrics file here once it serves; an earlier run's files
        # would count as readers serving.
        shutil.rmtree(data / "readers", ignore_errors=True)
    p = start(cmd, cpu)
    wait_port(hp, proc=p)
    wait_port(mp, proc=p)
    deadline = time.monotonic() + 60
    while workers > 1 and len(list((data / "readers").glob("reader-*.prom"))) < workers:
        if time.monotonic() > deadline or p.poll() is not None:
            stop(p)
            raise RuntimeError(f"{workers} readers did not all start serving")
        time.sleep(0.2)
    suffix = "" if workers == 1 else f"_{workers}w"
    return p, [
        Target("mercury_http" + suffix, "http", hp, ["/v1/kv/" + k.decode() for k in keys], p.pid),
        Target("mercury_memcached" + suffix, "memcached", mp, [k.decode() for k in keys], p.pid),
    ]


def ktserver(
    tmp: Path, keys: list[bytes], size: int, cpu: int | None, binary: str
) -> tuple[subprocess.Popen[bytes], list[Target]]:
    port = free_port()
    db = str(tmp / "kt.kch")
    p = start([binary, "-host", "127.0.0.1", "-port", str(port), "-log", "/dev/null", db], cpu)
    wait_port(port, proc=p)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for k in keys:
        conn.request("PUT", "/" + k.decode(), body=value_of(k, size))
        r = conn.getresponse()
        r.read()
        if r.status != 201:
            raise RuntimeError(f"ktserver PUT answered {r.status}")
    conn.close()
    return p, [Target("kt_rest", "http", port, ["/" + k.decode() for k in keys], p.pid)]


def memcached(
    keys: list[bytes], size: int, cpu: int | None, binary: str, threads: int
) -> tuple[subprocess.Popen[bytes], list[Target]]:
    port = free_port()
    user = ["-u", "nobody"] if os.getuid() == 0 else []  # memcached refuses to run as root
    args = ["-l", "127.0.0.1", "-p", str(port), "-U", "0", "-t", str(threads), "-m", "64"]
    p = start([binary, *args, *user], cpu)
    wait_port(port, proc=p)
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        for k in keys:
            v = value_of(k, size)
            s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (k, len(v), v))
            got = b""
            while not got.endswith(b"\r\n"):
                got += s.recv(100)
            if got != b"STORED\r\n":
                raise RuntimeError(f"memcached set answered {got!r}")
    return p, [Target("memcached", "memcached", port, [k.decode() for k in keys], p.pid)]


# --- report ----------------------------------------------------------------------------


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round (by throughput) and every round's throughput and P99."""
    ordered = sorted(rounds, key=lambda r: r["per_s"])
    med = ordered[len(ordered) // 2]
    return {
        "per_s": med["per_s"],
        "p50_us": med["p50_us"],
        "p99_us": med["p99_us"],
        "server_cpu_us": med.get("server_cpu_us"),
        "rounds_per_s": [r["per_s"] for r in rounds],
        "rounds_p50_us": [r["p50_us"] for r in rounds],
        "rounds_p99_us": [r["p99_us"] for r in rounds],
        "rounds_server_cpu_us": [r.get("server_cpu_us") for r in rounds],
    }


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="per run (each of 2 per server)")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--ktserver", default=KTSERVER)
    ap.add_argument("--memcached", default=shutil.which("memcached") or "memcached")
    ap.add_argument(
        "--memcached-threads", type=int, default=1, help="memcached -t (one core: 1 is its best)"
    )
    ap.add_argument("--workers", type=int, default=1, help="also measure --read-workers N")
    ap.add_argument(
        "--capped-scaling",
        type=float,
        default=None,
        metavar="CORES",
        help="with --workers N: also measure 1 against N readers, each pinned to its own CPU "
        "and capped to CORES of it (cgroup CPU bandwidth; root), memcached -t 1 against "
        "-t N alike as the baseline",
    )
    ap.add_argument("--quick", action="store_true", help="1 round of 1 s runs (a smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 1.0
    if not shutil.which("taskset"):
        raise SystemExit("taskset (util-linux) is needed to pin the servers")
    tmp = Path(tempfile.mkdtemp(prefix="mercury-rt-"))
    procs: list[subprocess.Popen[bytes]] = []
    notes: list[str] = []
    keys = hot_keys(args.keys)
    try:
        loadgen = build_loadgen(tmp)
        targets: list[Target] = []
        p, ts = mercury(tmp, keys, args.value_bytes, args.server_cpu)
        procs.append(p)
        targets += ts
        if os.access(args.ktserver, os.X_OK):
            p, ts = ktserver(tmp, keys, args.value_bytes, args.server_cpu, args.ktserver)
            procs.append(p)
            targets += ts
        else:
            notes.append(f"ktserver not found at {args.ktserver}: KT REST not measured")
        if shutil.which(args.memcached):
            p, ts = memcached(
                keys, args.value_bytes, args.server_cpu, args.memcached, args.memcached_threads
            )
            procs.append(p)
            targets += ts
        else:
            notes.append("memcached not installed (make bench-deps): memcached not measured")
        results: dict[str, dict[str, list[dict[str, Any]]]] = {
            t.name: {"many": [], "one": []} for t in targets
        }
        for _ in range(args.rounds):
            for t in targets:
                for kind, n in (("many", args.conns), ("one", 1)):
                    c0 = procstat.tree_cpu_seconds(t.pid)
                    r = run_load(loadgen, t.mode, t.port, n, args.seconds, t.paths, args.client_cpu)
                    # CPU per request: what a core costs per read, whatever else runs.
                    r["server_cpu_us"] = round(
                        (procstat.tree_cpu_seconds(t.pid) - c0) * 1e6 / r["requests"], 1
                    )
                    results[t.name][kind].append(r)
        for p in procs:
            stop(p)
        procs.clear()
        figures = {
            name: {
                f"{args.conns}_conns": summary(r["many"]),
                "1_conn": summary(r["one"]),
            }
            for name, r in results.items()
        }
        scaling: dict[str, Any] | None = None
        capped: dict[str, Any] | None = None
        if args.workers > 1:
            scaling = measure_scaling(tmp, keys, args, loadgen)
            if args.capped_scaling:
                capped = measure_capped_scaling(tmp, keys, args, loadgen, notes)
        doc = {
            "bench": "read_throughput",
            "settings": {
                k: getattr(args, k)
                for k in ("rounds", "seconds", "conns", "keys", "value_bytes", "server_cpu")
            }
            | {"client_cpu": args.client_cpu, "memcached_threads": args.memcached_threads},
            "notes": notes,
            "figures": figures,
            "ratios": ratios(figures, f"{args.conns}_conns"),
            "scaling": scaling,
            "capped_scaling": capped,
        }
        print(json.dumps(doc, indent=2))
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def ratios(figures: dict[str, Any], many: str) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def fig(name: str, kind: str, what: str) -> float | None:
        v = figures.get(name, {}).get(kind, {}).get(what)
        return None if v is None else float(v)

    pairs = [
        ("http_vs_kt_rest", "mercury_http", "kt_rest"),
        ("memcached_vs_memcached", "mercury_memcached", "memcached"),
    ]
    for label, ours, theirs in pairs:
        a, b = fig(ours, many, "per_s"), fig(theirs, many, "per_s")
        if a is not None and b is not None:
            out[f"{label}_per_s"] = ratio(a, b)
        # Requests per CPU-second of the server (the inverse of CPU per request): robust to
        # other load on the machine, which lowers both servers' throughput unevenly.
        a, b = fig(ours, many, "server_cpu_us"), fig(theirs, many, "server_cpu_us")
        if a and b:
            out[f"{label}_per_cpu_s"] = ratio(b, a)
        a, b = fig(ours, many, "p99_us"), fig(theirs, many, "p99_us")
        if a is not None and b is not None:
            out[f"{label}_p99_at_{many}"] = ratio(a, b)
    kt50 = fig("kt_rest", "1_conn", "p50_us")
    if kt50 is not None:
        for ours in ("mercury_http", "mercury_memcached"):
            a = fig(ours, "1_conn", "p50_us")
            if a is not None:
                out[f"{ours}_p50_1_conn_vs_kt_rest"] = ratio(a, kt50)
    kt99 = fig("kt_rest", many, "p99_us")
    if kt99 is not None:
        a = fig("mercury_memcached", many, "p99_us")
        if a is not None:
            out[f"mercury_memcached_p99_at_{many}_vs_kt_rest"] = ratio(a, kt99)
    return out


def measure_capped_scaling(
    tmp: Path, keys: list[bytes], args: argparse.Namespace, loadgen: str, notes: list[str]
) -> dict[str, Any] | None:
    """1 reader against N readers, each pinned to its own CPU and capped to
    `--capped-scaling` cores of it, the load generator unpinned on what is left; memcached
    -t 1 against -t N (one process: pinned to the same CPUs, capped to the same total) as
    the like-for-like baseline. Each run also reads every capped process's CPU time, so a
    process the load generator could not keep busy (a share well under its cap) shows."""
    cores = float(args.capped_scaling)
    ncpu = os.cpu_count() or 1
    cpus = [(args.server_cpu + i) % ncpu for i in range(args.workers)]
    try:
        probe = cpucap.CpuCap("probe", cores)
        probe.remove()
    except (cpucap.Unavailable, OSError) as err:
        notes.append(f"capped scaling not measured: {err}")
        return None
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}

    def run(name: str, n: int, target: Target, pids: list[int], caps: list[cpucap.CpuCap]) -> None:
        time.sleep(1.0)  # start-up CPU spent before the measured window
        c0 = [procstat.cpu_seconds(pid) for pid in pids]
        t0 = [c.throttled_s() for c in caps]
        r = run_load(
            loadgen, target.mode, target.port, args.conns, args.seconds, target.paths, None
        )
        # The share of its cap each capped process used: near 1 when the load kept it busy.
        r["cap_use"] = [
            round((procstat.cpu_seconds(pid) - c) / (cap.cores * r["seconds"]), 2)
            for pid, c, cap in zip(pids, c0, caps, strict=True)
        ]
        r["throttled_s"] = [round(c.throttled_s() - t, 2) for c, t in zip(caps, t0, strict=True)]
        rows.setdefault((name, n), []).append(r)

    for _ in range(args.rounds):
        for n in (1, args.workers):
            p, ts = mercury(tmp, keys, args.value_bytes, None, workers=n)
            caps: list[cpucap.CpuCap] = []
            try:
                pids = [p.pid, *sorted(procstat.children(p.pid))]  # reader 0 starts only readers
                for i, pid in enumerate(pids):
                    cpucap.pin(pid, {cpus[i] if n > 1 else args.server_cpu})
                    caps.append(cpucap.CpuCap(f"reader{i}", cores))
                    caps[-1].add(pid)
                for t in ts:
                    run(f"mercury_{t.mode}", n, t, pids, caps)
            finally:
                stop(p)
                for c in caps:
                    c.remove()
            if not shutil.which(args.memcached):
                continue
            p, ts = memcached(keys, args.value_bytes, None, args.memcached, n)
            caps = []
            try:
                cpucap.pin(p.pid, {args.server_cpu} if n == 1 else set(cpus))
                caps.append(cpucap.CpuCap("memcached", cores * n))
                caps[0].add(p.pid)
                run("memcached", n, ts[0], [p.pid], caps)
            finally:
                stop(p)
                for c in caps:
                    c.remove()
    out: dict[str, Any] = {"cores_per_reader": cores, "cpus": cpus}
    for name in ("mercury_http", "mercury_memcached", "memcached"):
        one, many = rows.get((name, 1)), rows.get((name, args.workers))
        if not one or not many:
            continue
        a = statistics.median(r["per_s"] for r in one)
        b = statistics.median(r["per_s"] for r in many)
        out[name] = {
            "per_s_1w": a,
            f"per_s_{args.workers}w": b,
            # 1.0 is linear: N capped readers serve N times what one serves.
            "scaling_vs_linear": ratio(b, args.workers * a),
            "cap_use_min": min(u for r in one + many for u in r["cap_use"]),
            "rounds": {f"{k}w": rows[(name, k)] for k in (1, args.workers)},
        }
    return out


def measure_scaling(
    tmp: Path, keys: list[bytes], args: argparse.Namespace, loadgen: str
) -> dict[str, Any]:
    """One worker against N workers, all unpinned (the load generator shares the cores):
    throughput, and throughput per CPU-second of the server processes, interleaved."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for n in (1, args.workers):
            p, ts = mercury(tmp, keys, args.value_bytes, None, workers=n)
            try:
                time.sleep(1.0)  # the readers' start-up CPU spent before the measured window
                for t in ts:
                    c0 = procstat.tree_cpu_seconds(p.pid)
                    r = run_load(loadgen, t.mode, t.port, args.conns, args.seconds, t.paths, None)
                    cpu = procstat.tree_cpu_seconds(p.pid) - c0
                    r["server_cpu_s"] = round(cpu, 2)
                    r["per_server_cpu_s"] = round(r["requests"] / cpu) if cpu else None
                    rows.setdefault(f"{t.mode}_{n}w", []).append(r)
            finally:
                stop(p)
    out: dict[str, Any] = {}
    for mode in ("http", "memcached"):
        one, many = rows[f"{mode}_1w"], rows[f"{mode}_{args.workers}w"]
        a = statistics.median(r["per_s"] for r in one)
        b = statistics.median(r["per_s"] for r in many)
        ca = statistics.median(r["per_server_cpu_s"] or 0 for r in one)
        cb = statistics.median(r["per_server_cpu_s"] or 0 for r in many)
        out[mode] = {
            "per_s_1w": a,
            f"per_s_{args.workers}w": b,
            "throughput_ratio": ratio(b, a),
            "per_server_cpu_s_1w": ca,
            f"per_server_cpu_s_{args.workers}w": cb,
            "efficiency_per_cpu_s": ratio(cb, ca),
            "rounds": {k: v for k, v in rows.items() if k.startswith(mode)},
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
