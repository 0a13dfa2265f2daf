"""Reads under writes, Kyoto Tycoon and Mercury side by side in one run (prints JSON).

Two cores stand for two machines: the root (or KT master) and its writers run on CPU 0;
the serving node — a real `mercury replica` (reads and the applier worker), or a `ktserver`
slave following the master's update log (`-mhost -mport -ulog -sid`) — and this script's
reader run on CPU 1. The reader keeps one keep-alive HTTP connection and GETs 20 hot keys
round-robin at a steady pace (`--read-rate`, default 1,000/s), timing each from send to
the last byte. Phases, interleaved over `--rounds` (each system in turn, each phase in
turn, so load drifting on a shared machine falls on all alike; the systems' order
reverses every other round):

- ``idle``: no writes.
- ``full_40k``: one writer process with `--conns` keep-alive connections PUTting fresh
  (random) 40 KiB values as fast as the root acknowledges them.
- ``matched_40k``: the same writers paced to `--matched-mbps` (default 16 MB/s).
- ``full_100b``: 100-byte values at full speed (the per-entry cost of the applier).

Per phase: read P50/P99/P99.9/max; MB/s the root acknowledged and MB/s the serving node
absorbed; replica lag (the writer stamps a clock key with the time and the count of
writes acknowledged before it every 100 ms; reading it back from the serving node gives
both the lag and how many writes it has applied); CPU ms per MB absorbed of the applier
process (`/proc/PID/stat`: the Mercury replica's worker; the KT slave's whole process,
which also serves the reads) and of the whole serving node; the applier's minor page
faults per MB (`applier_faults_per_mb`: memory it handed back and faulted in again) and
read calls per MB (`applier_reads_per_mb`: how many pieces its stream arrived in) and
context switches per MB of its threads (`applier_switches_per_mb`); and
the seconds the node needed to catch up after the writers stopped. Every phase starts
with the page cache's dirty pages written back (`--drop-caches`: and its clean pages
dropped, root only; the best case, see docs/reads.md). On a virtual machine whose
balloon reports free pages to its host (`bench/guestmem.py`), `--hold-freed-memory`
holds that reporting off for the run and first touches the free memory once (root only;
restored at the end): writing into memory the host took back costs the writer's CPU, so
without it a phase's figures depend on what ran before it. `--perf DIR` records the
applier process under `perf record -g` for each write phase's measured seconds (one file
per system, phase and round; `bench/perf_shares.py DIR` sums them up by library); the
profiler costs CPU, so a profiled run's CPU figures are not the ones to quote. Mercury's
root runs with a `--batch-window-ms` of `--window-ms` (default 10) and fsync; KT writes
without fsync (its default), which favours KT.

Usage: .venv/bin/python bench/read_under_write.py [--quick] [--rounds N] [--seconds S]
       [--systems kt,mercury] [--read-rate R] [--conns N] [--matched-mbps M]
       [--applier-nice N] [--phases P,...] [--drop-caches | --cache-fill-gb G]
       [--hold-freed-memory] [--perf DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import guestmem  # noqa: E402
from bench.gateway_write import Conn  # noqa: E402  (one keep-alive HTTP/1.1 client for every bench)
from testkit.procs import (  # noqa: E402
    free_port,
    mercury_cmd,
    wait_http,
    wait_port,
)
from testkit.procstat import (  # noqa: E402
    children,
    context_switches,
    cpu_seconds,
    minor_faults,
    read_calls,
    unwritten_page_cache,
)

HOT = [f"hot/{i:02d}" for i in range(20)]
CLOCK_KEY = "w/clock"
KTSERVER = shutil.which("ktserver") or "/usr/local/bin/ktserver"
PHASES = ("idle", "full_40k", "matched_40k", "full_100b")
#: Longest wait for a serving node to catch up after a phase (then the phase says so).
CATCH_UP_LIMIT = 60.0
MB = 1e6


# --- writer process (CPU 0) ----------------------------------------------------------------


def kt_path(key: str) -> str:
    """KT's REST path of `key` (a bare "/" would name a database: it is percent-encoded)."""
    return "/" + key.replace("/", "%2F")


def put_request(system: str, key: str, value: bytes, token: str) -> bytes:
    """A PUT of `key`: Mercury's gateway (`/v1/kv/KEY`, bearer token) or KT's REST (`/KEY`)."""
    path = f"/v1/kv/{key}" if system == "mercury" else kt_path(key)
    head = f"PUT {path} HTTP/1.1\r\nHost: b\r\nContent-Length: {len(value)}\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    return head.encode() + b"\r\n" + value


async def writer_main(a: argparse.Namespace) -> None:
    """PUT fresh values over `a.conns` connections until `a.seconds` pass (or SIGTERM), at
    full speed or paced to `a.rate` MB/s; stamp the clock key every 100 ms; print JSON."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    pool = random.Random(a.seed).randbytes(1 << 20)
    size = a.value_size
    acked = 0
    errors = 0
    per_conn_interval = a.conns * size / (a.rate * MB) if a.rate else 0.0
    t0 = time.monotonic()
    deadline = t0 + a.seconds

    async def conn(c: int) -> None:
        nonlocal acked, errors
        _, p = await loop.create_connection(Conn, "127.0.0.1", a.port)
        rng = random.Random(a.seed * 1000 + c)
        i = 0
        nxt = time.monotonic()
        while not stop.is_set() and time.monotonic() < deadline:
            off = rng.randrange(len(pool) - size)
            # fresh bytes every time: a counter prefix on a random window of the pool
            value = (b"%016d" % (i * 1000 + c) + pool[off : off + size])[:size]
            st = await p.request(put_request(a.system, f"w/{c}/{i % 64}", value, a.token))
            if 200 <= st < 300:
                acked += 1
            else:
                errors += 1
            i += 1
            if per_conn_interval:
                nxt += per_conn_interval
                delay = nxt - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        p.transport.close()

    async def stamp(cp: Conn) -> str:
        v = f"{time.time_ns()} {acked} {a.seed}"
        await cp.request(put_request(a.system, CLOCK_KEY, v.encode(), a.token))
        return v

    async def clock(cp: Conn) -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            await stamp(cp)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    _, clock_conn = await loop.create_connection(Conn, "127.0.0.1", a.port)
    writers = [asyncio.ensure_future(conn(c)) for c in range(a.conns)]
    clock_task = asyncio.ensure_future(clock(clock_conn))
    await asyncio.gather(*writers, return_exceptions=True)
    stop.set()
    await clock_task
    dt = time.monotonic() - t0
    # After every acknowledged write: the serving node has them all once it has this stamp.
    final = await stamp(clock_conn)
    print(json.dumps({"acked": acked, "errors": errors, "seconds": dt, "final": final}), flush=True)


# --- reader (CPU 1) -----------------------------------------------------------------------


class SyncConn:
    """A blocking keep-alive HTTP/1.1 GET client (the same code path for both systems)."""

    def __init__(self, port: int) -> None:
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def get(self, path: bytes) -> tuple[int, bytes]:
        self.s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: b\r\n\r\n")
        while b"\r\n\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            rest += chunk
        self.buf = rest[length:]
        return int(head[9:12]), rest[:length]

    def close(self) -> None:
        self.s.close()


def pct(samples_ns: list[int]) -> dict[str, float]:
    """P50/P99/P99.9/max in microseconds."""
    s = sorted(samples_ns)
    n = len(s)
    if not n:
        return {"n": 0}

    def at(q: float) -> float:
        return round(s[min(n - 1, int(q * n))] / 1e3, 1)

    return {"n": n, "p50_us": at(0.5), "p99_us": at(0.99), "p999_us": at(0.999), "max_us": at(1.0)}


def or_zero(read: Callable[[int], float], pid: int) -> float:
    """`read(pid)` (a `testkit/procstat.py` counter), or 0 when the process is gone."""
    try:
        return read(pid)
    except OSError:
        return 0.0


#: The applier's running counters a phase reads before and after (`testkit/procstat.py`).
APPLIER_COUNTERS: dict[str, Callable[[int], float]] = {
    "cpu": cpu_seconds,
    "faults": minor_faults,
    "reads": read_calls,
    "switches": context_switches,
}


#: Dirty and writeback page cache below which a phase may start (bytes), and the longest
#: wait for it.
SETTLED_BYTES = 16 << 20
SETTLE_LIMIT = 60.0
DROP_CACHES = "/proc/sys/vm/drop_caches"
SETTINGS = ("rounds", "seconds", "read_rate", "conns", "matched_mbps", "window_ms")


def can_drop_caches() -> bool:
    """True when this process may drop the page cache (it does so once to find out: a
    read-only /proc/sys refuses root too)."""
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("1")
    except OSError:
        return False
    return True


def settle_page_cache(drop: bool) -> float:
    """Write the page cache's dirty pages back, wait until little is left and, with `drop`,
    drop the clean file pages no process maps; the seconds it took.

    Why the write-back: Kyoto Tycoon writes without fsync, so its full-speed phase leaves
    hundreds of MB dirty for the kernel's flusher threads to write back during the next
    phase, another system's; two machines would not share that. Each phase still pays for
    the writeback its own writes cause.

    Why the drop is only an option: it helped on the development machine because the
    memory it frees is still the guest's for a while (a VM whose host takes back free
    memory; `bench/guestmem.py`, docs/reads.md), not because an emptied cache is what a
    node has; `--hold-freed-memory` is the better-founded way to the same state. Mapped
    pages (an LMDB environment's) stay.
    """
    t0 = time.monotonic()
    os.sync()
    while time.monotonic() - t0 < SETTLE_LIMIT:
        if unwritten_page_cache() < SETTLED_BYTES:
            break
        time.sleep(0.1)
    if drop:
        with open(DROP_CACHES, "w") as f:
            f.write("1")  # 1: the page cache only (not dentries and inodes)
    return round(time.monotonic() - t0, 2)


def fill_page_cache(where: Path, gb: float) -> None:
    """Write `gb` GB of filler files under `where` and sync them: their pages stay in the
    page cache (clean) for the run, as a serving node's cache is never empty."""
    block = memoryview(os.urandom(64 << 20))  # (a slice of it copies nothing)
    left = int(gb * (1 << 30))
    i = 0
    while left > 0:
        with open(where / f"cache-fill-{i}", "wb") as f:
            for _ in range(16):  # 1 GB a file
                if left <= 0:
                    break
                f.write(block[: min(len(block), left)])
                left -= len(block)
        i += 1
    os.sync()


# --- the two systems -------------------------------------------------------------------------


@dataclass
class System:
    """One system under test: where writes go, where reads come from, what to watch."""

    name: str
    kind: str  # "mercury" or "kt": the protocol
    write_port: int
    read_port: int
    token: str = ""
    applier_pid: int = 0
    node_pids: list[int] = field(default_factory=list)

    def path(self, key: str) -> bytes:
        return (f"/v1/kv/{key}" if self.kind == "mercury" else kt_path(key)).encode()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="mercury-ruw-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.me = [sys.executable, str(Path(__file__).resolve())]
        self.notes: list[str] = []

    def start(self, argv: list[str], name: str, cpu: int) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "ab") as log:
            p = subprocess.Popen(
                ["taskset", "-c", str(cpu), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen[bytes]) -> None:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)

    def close(self) -> None:
        for p in reversed(self.procs):
            self.stop(p)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- Mercury: a root on CPU 0, a replica on CPU 1 --

    def mercury(self, name: str = "mercury") -> System:
        hints = not (self.args.no_sched_hints or name.endswith("nohints"))
        root_dir, rep_dir = self.tmp / f"{name}-root", self.tmp / f"{name}-replica"
        # A/B: a tree whose log chains with BLAKE2b-256 (this CPU's pick otherwise).
        chain = ["--chain-hash", "blake2b-256"] if name.endswith("blake2b") else []
        r = subprocess.run(
            mercury_cmd("init", *chain, str(root_dir)), capture_output=True, text=True, cwd=REPO
        )
        if r.returncode:
            raise RuntimeError(r.stderr)
        admin = (root_dir / "admin.token").read_text().strip()
        gw, repl, http = free_port(), free_port(), free_port()
        # A/B: a root batching twice as long, so each record holds twice the bytes.
        window_ms = self.args.window_ms * (2 if name.endswith("batch2x") else 1)
        root = self.start(
            mercury_cmd(
                "root", str(root_dir), "--listen", f"127.0.0.1:{gw}",
                "--repl-listen", f"127.0.0.1:{repl}",
                "--batch-window-ms", str(window_ms), "--log-level", "warning",
            ),
            f"{name}-root", 0,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{gw}/healthz", timeout=60, proc=root)
        import httpx

        with httpx.Client(
            base_url=f"http://127.0.0.1:{gw}",
            headers={"Authorization": f"Bearer {admin}"},
            timeout=60,
        ) as c:
            c.put(
                "/v1/admin/producers/bench", json={"keyspaces": ["hot/", "w/"]}
            ).raise_for_status()
            token = str(c.post("/v1/admin/producers/bench/tokens").json()["token"])
            for k in HOT:
                c.put(
                    f"/v1/kv/{k}", content=b"v" + k.encode(),
                    headers={"Authorization": f"Bearer {token}"},
                ).raise_for_status()  # fmt: skip
        extra = []
        if self.args.applier_nice is not None:
            extra = ["--applier-nice", str(self.args.applier_nice)]
        if name.endswith("window"):  # A/B: a heavy stream's records grouped per commit
            extra += ["--apply-window-ms", "20"]
        if name.endswith("nosync"):  # A/B: what the commits' fdatasync costs the applier
            extra += ["--no-sync"]
        if name.endswith("heap0"):  # A/B: freed memory handed back as glibc decides
            extra += ["--applier-heap-keep-mb", "0"]
        rep = self.start(
            mercury_cmd(
                "replica", str(rep_dir), "--source", f"127.0.0.1:{repl}",
                "--listen", f"127.0.0.1:{http}", "--log-level", "warning", *extra,
            ),
            f"{name}-replica", 1,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{http}/healthz", timeout=120, proc=rep)
        sysm = System(name, "mercury", gw, http, token)
        self._wait_hot(sysm)
        deadline = time.monotonic() + 30
        while not children(rep.pid):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica started no worker")
            time.sleep(0.1)
        sysm.applier_pid = children(rep.pid)[0]
        sysm.node_pids = [rep.pid, sysm.applier_pid]
        from replicator import sched

        if not hints:  # A/B: undo the replica's scheduling hints
            for pid in (rep.pid, *children(rep.pid)):
                for t in sched.threads(pid):
                    sched.reset(t)
        self.notes.append(
            f"{name} scheduling (policy, nice, slice ns) of the read server and the applier: "
            f"{sched.get_attr(rep.pid)}, {sched.get_attr(sysm.applier_pid)}"
        )
        return sysm

    # -- Kyoto Tycoon: a master on CPU 0, a slave on CPU 1 --

    def kt(self) -> System:
        m, s = free_port(), free_port()
        for d in ("ulog-m", "ulog-s"):
            (self.tmp / d).mkdir()
        master = self.start(
            [KTSERVER, "-host", "127.0.0.1", "-port", str(m), "-ulog", str(self.tmp / "ulog-m"),
             "-sid", "1", "-log", str(self.tmp / "kt-m.log"), "-ls", str(self.tmp / "m.kch")],
            "ktmaster", 0,
        )  # fmt: skip
        wait_port(m, proc=master)
        slave = self.start(
            [KTSERVER, "-host", "127.0.0.1", "-port", str(s), "-ulog", str(self.tmp / "ulog-s"),
             "-sid", "2", "-mhost", "127.0.0.1", "-mport", str(m),
             "-rts", str(self.tmp / "s.rts"), "-log", str(self.tmp / "kt-s.log"), "-ls",
             str(self.tmp / "s.kch")],
            "ktslave", 1,
        )  # fmt: skip
        wait_port(s, proc=slave)
        c = SyncConn(m)
        for k in HOT:
            req = put_request("kt", k, b"v" + k.encode(), "")
            c.s.sendall(req)
            c.buf = b""
            while b"\r\n\r\n" not in c.buf:
                c.buf += c.s.recv(4096)
        c.close()
        sysk = System("kt", "kt", m, s, "", slave.pid, [slave.pid])
        self._wait_hot(sysk)
        return sysk

    def _wait_hot(self, s: System) -> None:
        deadline = time.monotonic() + 60
        c = SyncConn(s.read_port)
        try:
            while c.get(s.path(HOT[-1]))[0] != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{s.name}: hot keys never reached the serving node")
                time.sleep(0.1)
        finally:
            c.close()

    # -- one phase --

    def _profile(self, s: System, phase: str) -> subprocess.Popen[bytes] | None:
        """With `--perf DIR`: `perf record -g` of the applier process for the measured
        seconds of a write phase (on CPU 0, beside the root), one file per system, phase
        and round (`bench/perf_shares.py` reads them)."""
        if not self.args.perf or phase == "idle":
            return None
        out = Path(self.args.perf).resolve()
        out.mkdir(parents=True, exist_ok=True)
        n = len(list(out.glob(f"{s.name}-{phase}-*.perf")))
        argv = ["perf", "record", "-q", "-F", "999", "-g", "-p", str(s.applier_pid)]
        argv += [
            "-o",
            str(out / f"{s.name}-{phase}-{n}.perf"),
            "--",
            "sleep",
            str(self.args.seconds),
        ]
        return self.start(argv, f"perf-{s.name}-{phase}-{n}", 0)

    def phase(self, s: System, phase: str) -> dict[str, Any]:
        a = self.args
        settled = settle_page_cache(drop=a.drop_caches)
        writer = None
        writer_seed = random.randrange(1 << 30)
        if phase != "idle":
            size = 100 if phase.endswith("100b") else 40 << 10
            rate = a.matched_mbps if phase.startswith("matched") else 0
            writer = self.start(
                [*self.me, "--role", "writer", "--system", s.kind, "--port", str(s.write_port),
                 "--token", s.token, "--conns", str(a.conns), "--value-size", str(size),
                 "--rate", str(rate), "--seconds", str(a.seconds + 60),
                 "--seed", str(writer_seed)],
                f"writer-{s.name}-{phase}", 0,
            )  # fmt: skip
        reads = SyncConn(s.read_port)
        for i in range(200):  # the hot keys' pages in the cache (both systems alike)
            reads.get(s.path(HOT[i % 20]))
        probe = SyncConn(s.read_port)
        clock_path = s.path(CLOCK_KEY)

        def clock() -> tuple[int, int] | None:
            """(time, writes acknowledged before it) of this writer's last stamp that the
            serving node has applied; None before its first one."""
            st, body = probe.get(clock_path)
            if st != 200:
                return None
            t, n, seed = body.split()
            return (int(t), int(n)) if int(seed) == writer_seed else None

        if writer is not None:
            deadline = time.monotonic() + 60
            while clock() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # let the write stream reach a steady state
        c0 = clock() if writer else None
        prof = self._profile(s, phase)
        before = {k: or_zero(f, s.applier_pid) for k, f in APPLIER_COUNTERS.items()}
        node0 = sum(or_zero(cpu_seconds, p) for p in s.node_pids)
        t0 = time.monotonic()
        lat: list[int] = []
        lags: list[float] = []
        interval = 1.0 / a.read_rate
        nxt = time.perf_counter()
        next_probe = t0 + 0.5
        paths = [s.path(k) for k in HOT]
        clk = time.perf_counter_ns
        i = 0
        end = t0 + a.seconds
        while time.monotonic() < end and i < a.read_rate * a.seconds * 2:
            t = clk()
            st, _ = reads.get(paths[i % 20])
            lat.append(clk() - t)
            if st != 200:
                raise RuntimeError(f"{s.name}: GET answered {st}")
            i += 1
            if writer and time.monotonic() >= next_probe:
                got = clock()
                if got is not None:
                    lags.append((time.time_ns() - got[0]) / 1e9)
                next_probe += 0.5
            nxt += interval
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                nxt = time.perf_counter()  # fell behind: do not burst to catch up
        dt = time.monotonic() - t0
        if prof is not None:
            prof.wait(a.seconds + 30)
        c1 = clock() if writer else None
        d = {k: or_zero(f, s.applier_pid) - before[k] for k, f in APPLIER_COUNTERS.items()}
        node1 = sum(or_zero(cpu_seconds, p) for p in s.node_pids)
        out: dict[str, Any] = {
            "read": pct(lat),
            "settle_s": settled,
            # In every phase: idle, it is what the applier costs with nothing to apply
            # (heartbeats, status, timers), a floor each write phase's per-MB figure carries.
            "applier_cpu_share": round(d["cpu"] / dt, 3),
        }
        if writer is not None:
            size = 100 if phase.endswith("100b") else 40 << 10
            os.kill(writer.pid, signal.SIGTERM)  # it stamps the clock once more and exits
            try:
                writer.wait(timeout=a.seconds + 60)
            except subprocess.TimeoutExpired:
                self.stop(writer)
            wlog = (self.tmp / f"writer-{s.name}-{phase}.log").read_text().strip().splitlines()
            w = json.loads(wlog[-1]) if wlog and wlog[-1].startswith("{") else {}
            applied = (c1[1] - c0[1]) if c0 and c1 else 0
            mb = applied * size / MB
            out.update(
                {
                    "accepted_mb_s": round(w.get("acked", 0) * size / MB / w["seconds"], 2)
                    if w.get("seconds")
                    else None,
                    "write_errors": w.get("errors"),
                    "absorbed_mb_s": round(mb / dt, 2),
                    "absorbed_writes_s": round(applied / dt, 1),
                    "lag_max_s": round(max(lags), 2) if lags else None,
                    "lag_end_s": round(lags[-1], 2) if lags else None,
                    "applier_cpu_ms_per_mb": round(d["cpu"] * 1000 / mb, 2) if mb else None,
                    "node_cpu_ms_per_mb": round((node1 - node0) * 1000 / mb, 2) if mb else None,
                    "applier_faults_per_mb": round(d["faults"] / mb) if mb else None,
                    "applier_reads_per_mb": round(d["reads"] / mb, 1) if mb else None,
                    "applier_switches_per_mb": round(d["switches"] / mb, 1) if mb else None,
                }
            )
            # Catch up: the node has everything once it serves the writer's final stamp.
            final = w.get("final")
            t_end = time.monotonic()
            caught = None
            while final and time.monotonic() - t_end < CATCH_UP_LIMIT:
                st, body = probe.get(clock_path)
                if st == 200 and body.decode() == final:
                    caught = round(time.monotonic() - t_end, 2)
                    break
                time.sleep(0.05)
            out["catch_up_s"] = caught
        reads.close()
        probe.close()
        return out


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per system and phase: the median round's figures and the spread of read P99."""

    def med(xs: list[Any]) -> float | None:
        xs = sorted(x for x in xs if x is not None)
        return xs[len(xs) // 2] if xs else None

    out: dict[str, Any] = {}
    for sysname, phases in results.items():
        o: dict[str, Any] = {}
        for ph, rounds in phases.items():
            keys = [k for k in rounds[0] if k != "read"]
            o[ph] = {
                "read_p50_us": med([r["read"]["p50_us"] for r in rounds]),
                "read_p99_us": med([r["read"]["p99_us"] for r in rounds]),
                "read_p99_us_rounds": [r["read"]["p99_us"] for r in rounds],
                "read_p999_us": med([r["read"]["p999_us"] for r in rounds]),
                **{k: med([r.get(k) for r in rounds]) for k in keys},
            }
        idle = o["idle"]["read_p99_us"]
        for ph in PHASES[1:]:
            if ph in o and idle:
                o[ph]["p99_over_idle"] = round(o[ph]["read_p99_us"] / idle, 2)
        out[sysname] = o
    if "kt" in out and "mercury" in out and "idle" in out["kt"]:
        out["mercury_over_kt_p99"] = {
            ph: round(out["mercury"][ph]["read_p99_us"] / out["kt"][ph]["read_p99_us"], 2)
            for ph in PHASES
            if ph in out["kt"] and ph in out["mercury"]
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one round of 4 s phases")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per phase")
    ap.add_argument(
        "--systems",
        default="kt,mercury",
        help="kt, mercury, mercury-nohints (a second replica without scheduling hints), "
        "mercury-window (one with a 20 ms apply window: a heavy stream's records grouped), "
        "mercury-heap0 (one whose applier hands freed memory back as glibc decides), "
        "mercury-nosync (one that does not fsync its commits: the sync's share of its CPU), "
        "mercury-blake2b (a tree whose log chains with BLAKE2b-256), "
        "mercury-batch2x (a tree whose root batches for twice --window-ms)",
    )
    ap.add_argument("--read-rate", type=float, default=1000.0, help="reads per second")
    ap.add_argument("--conns", type=int, default=32, help="writer connections")
    ap.add_argument("--matched-mbps", type=float, default=16.0)
    ap.add_argument("--window-ms", type=float, default=10.0, help="Mercury root batch window")
    ap.add_argument("--applier-nice", type=int, default=None, help="Mercury replica flag")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument(
        "--cache-fill-gb", type=float, default=0.0,
        help="first write this many GB of filler files and keep them cached (docs/reads.md)",
    )  # fmt: skip
    ap.add_argument(
        "--drop-caches", action="store_true",
        help="drop the clean page cache before each phase: a best case (docs/reads.md)",
    )  # fmt: skip
    ap.add_argument(
        "--hold-freed-memory", action="store_true",
        help="hold the VM's free page reporting off for the run (bench/guestmem.py)",
    )  # fmt: skip
    ap.add_argument(
        "--perf", default=None, metavar="DIR",
        help="record the applier under `perf record -g` in each write phase "
        "(bench/perf_shares.py summarises; its CPU figures are then not the ones to quote)",
    )  # fmt: skip
    ap.add_argument(
        "--no-sched-hints",
        action="store_true",
        help="undo the replica's scheduling hints (short read slices, SCHED_BATCH applier)",
    )
    ap.add_argument("--role", choices=("writer",), help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--token", default="", help=argparse.SUPPRESS)
    ap.add_argument("--value-size", type=int, default=40 << 10, help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "writer":
        import uvloop

        uvloop.run(writer_main(args))
        return 0
    if args.quick:
        args.rounds, args.seconds = 1, 4.0
    systems = [x for x in args.systems.split(",") if x]
    notes = []
    if "kt" in systems and not os.access(KTSERVER, os.X_OK):
        systems.remove("kt")
        notes.append(f"Kyoto Tycoon half skipped: no ktserver at {KTSERVER}")
    os.sched_setaffinity(0, {1})  # the reader runs beside the serving node
    if args.drop_caches and args.cache_fill_gb:
        ap.error("--cache-fill-gb and --drop-caches: the drop would empty the filled cache")
    if args.drop_caches and not can_drop_caches():
        args.drop_caches = False
        notes.append("no permission to drop the page cache: phases start with it as it is")
    hold, why_not = guestmem.hold_if_asked(args.hold_freed_memory)
    if why_not:
        args.hold_freed_memory = False
        notes.append(why_not)
    bench = Bench(args)
    stack = contextlib.ExitStack()
    phases = [p for p in args.phases.split(",") if p in PHASES]
    if "idle" not in phases:
        phases.insert(0, "idle")
    out: dict[str, Any] = {
        "settings": {
            k: getattr(args, k)
            for k in (*SETTINGS, "drop_caches", "cache_fill_gb", "hold_freed_memory")
        }
        | {"applier_nice": args.applier_nice, "kernel": os.uname().release},
        "free_page_reporting": guestmem.state(),
        "load_avg_at_start": os.getloadavg(),
        "notes": notes,
    }
    try:
        out["free_memory_warmed"] = stack.enter_context(hold)
        if args.cache_fill_gb > 0:
            fill_page_cache(bench.tmp, args.cache_fill_gb)
        nodes = {name: bench.kt() if name == "kt" else bench.mercury(name) for name in systems}
        for s in nodes.values():  # warm up the read path
            c = SyncConn(s.read_port)
            for i in range(500):
                c.get(s.path(HOT[i % 20]))
            c.close()
        results: dict[str, dict[str, list[dict[str, Any]]]] = {
            n: {p: [] for p in phases} for n in nodes
        }
        for r in range(args.rounds):
            # The systems' order alternates each round: in three A/B runs of the apply
            # window the replica measured second had the lower tail whichever had the
            # window, so neither side of an A/B may always go first.
            order = list(nodes.items())
            if r % 2:
                order.reverse()
            for ph in phases:
                for n, s in order:
                    results[n][ph].append(bench.phase(s, ph))
                    time.sleep(0.5)
        notes += bench.notes
        out["summary"] = summarize(results)
        out["rounds"] = results
    finally:
        bench.close()
        stack.close()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
