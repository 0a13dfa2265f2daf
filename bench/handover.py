"""Hand-over upgrade (`kill -USR2`) against a plain stop/start, under load (prints JSON).

Real processes on 127.0.0.1, one run, like for like:

- ``replica``: a root and a replica; a steady reader sends `--read-rate` GETs a second
  (default 2,000) over `--conns` kept-alive connections (default 8, paced evenly) plus
  `--new-conns` new connections a second (default 50, one GET each, then closed), no
  retries. After `--steady-s` seconds the replica is (a) handed over with SIGUSR2, and
  in a second phase (b) stopped with SIGTERM and started again at once (the baseline).
  Per phase: reads sent and failed (refused, reset, short or non-200 answers), P50/P99
  of the steady part and of the switch window (from the signal until the old process is
  gone and the new one serves, plus 0.5 s), and their ratio.
- ``root``: a root under `--writers` writers (default 4, each one kept-alive connection,
  PUT after PUT of a fresh key, no retries) with the product's 500 ms batch window
  (`--window-ms`); SIGUSR2 after `--steady-s`. Writes failed; acknowledged writes then
  missing from the new root (read back, each); the longest gap between two
  acknowledgements across all writers during the switch, against the steady one and
  against the batch window + 100 ms.
- ``startup``: a root and a replica on a store of `--store-mb` MB (default 1,024; values of
  512 KiB): SIGUSR2 on each; the time from the signal to the new process reporting
  READY (the old process's ``handover`` event) and from the new process's start to
  READY, read from the processes' own log timestamps.

Latencies are send-to-last-byte per request of a paced (open-schedule, but each
connection waits for its answer) client; a request sent late because its connection was
busy is timed from when it was sent. The machine is shared: compare within one run.

Usage: .venv/bin/python bench/handover.py [--quick] [--only replica,root,startup]
       [--read-rate R] [--conns N] [--new-conns N] [--writers N] [--window-ms MS]
       [--steady-s S] [--store-mb MB]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from store.lock import holder_pid
from testkit.procs import REPO, free_port, mercury_cmd, run_mercury, wait_http
from testkit.procstat import running
from testkit.wait import wait_until

#: Bounds of every load loop (count and time), whatever the flags say.
MAX_SECONDS = 120.0


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p / 100 * len(s)))] * 1000, 2)


class Proc:
    """A mercury process with its log file, stopped by PID."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv, self.log = argv, log
        with open(log, "ab") as f:
            self.p = subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.p.pid


def stop_pid(pid: int, timeout: float = 20.0) -> None:
    if not running(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if running(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def events(log: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if f'"event":"{name}"' in line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def ts(ev: dict[str, Any]) -> float:
    return datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp()


# -- HTTP over asyncio streams: cheap enough for 2,000 requests a second ---------------------


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes
) -> tuple[int, bool, bytes]:
    """(status, server closes, body) of one request."""
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection" and value.strip().lower() == "close":
            close = True
    body = await reader.readexactly(length)
    return status, close, body


class ReadLoad:
    def __init__(self, port: int, path: str, want: bytes, rate: float, conns: int, fresh: float):
        self.port, self.want = port, want
        self.req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        self.rate, self.conns, self.fresh = rate, conns, fresh
        #: (sent at, seconds, ok)
        self.samples: list[tuple[float, float, bool]] = []
        self.errors: dict[str, int] = {}
        self.stop = asyncio.Event()

    def _fail(self, t0: float, why: str) -> None:
        self.samples.append((t0, time.monotonic() - t0, False))
        self.errors[why] = self.errors.get(why, 0) + 1

    async def _keepalive(self, i: int, start: float) -> None:
        interval = self.conns / self.rate
        nxt = start + i * interval / self.conns
        rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while not self.stop.is_set():
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            nxt += interval
            t0 = time.monotonic()
            try:
                if rw is None:
                    rw = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 10)
                status, close, body = await asyncio.wait_for(exchange(*rw, self.req), 10)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as e:
                self._fail(t0, type(e).__name__)
                if rw is not None:
                    rw[1].close()
                rw = None
                continue
            ok = status == 200 and body == self.want
            self.samples.append((t0, time.monotonic() - t0, ok))
            if not ok:
                self.errors[f"status {status}"] = self.errors.get(f"status {status}", 0) + 1
            if close:  # answered with connection: close (a draining server): a new one
                rw[1].close()
                rw = None
        if rw is not None:
            rw[1].close()

    async def _one_fresh(self) -> None:
        t0 = time.monotonic()
        w = None
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 10)
            status, _, body = await asyncio.wait_for(exchange(r, w, self.req), 10)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as e:
            self._fail(t0, "new-conn " + type(e).__name__)
        else:
            ok = status == 200 and body == self.want
            self.samples.append((t0, time.monotonic() - t0, ok))
            if not ok:
                self.errors[f"status {status}"] = self.errors.get(f"status {status}", 0) + 1
        finally:
            if w is not None:
                w.close()

    async def _fresh(self, start: float) -> None:
        tasks: set[asyncio.Task[None]] = set()
        nxt = start
        while not self.stop.is_set():
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            nxt += 1 / self.fresh
            t = asyncio.get_running_loop().create_task(self._one_fresh())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=15)

    async def run(self) -> None:
        start = time.monotonic()
        parts = [self._keepalive(i, start) for i in range(self.conns)]
        if self.fresh > 0:
            parts.append(self._fresh(start))
        await asyncio.gather(*parts)

    def summary(self, steady: tuple[float, float], switch: tuple[float, float]) -> dict[str, Any]:
        def lat(lo: float, hi: float) -> list[float]:
            return [d for t, d, ok in self.samples if lo <= t < hi and ok]

        s, w = lat(*steady), lat(*switch)
        p99s, p99w = pct(s, 99), pct(w, 99)
        return {
            "reads": len(self.samples),
            "failed": sum(1 for *_, ok in self.samples if not ok),
            "errors": self.errors,
            "steady_p50_ms": pct(s, 50),
            "steady_p99_ms": p99s,
            "switch_window_s": round(switch[1] - switch[0], 2),
            "switch_reads": len(w),
            "switch_p50_ms": pct(w, 50),
            "switch_p99_ms": p99w,
            "switch_p99_over_steady": round(p99w / p99s, 2) if p99s and p99w else None,
        }


# -- scenarios -------------------------------------------------------------------------------


def start_root(tmp: Path, name: str, *extra: str, init: bool = True) -> tuple[Proc, int, int, str]:
    data = tmp / name
    if init:
        r = run_mercury("init", str(data))
        assert r.returncode == 0, r.stderr
    token = (data / "admin.token").read_text().strip()
    port, rport = free_port(), free_port()
    p = Proc(
        mercury_cmd(
            "root",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--repl-listen",
            f"127.0.0.1:{rport}",
            *extra,
        ),
        tmp / f"{name}.log",
    )
    wait_http(f"http://127.0.0.1:{port}/healthz", proc=p.p)
    return p, port, rport, token


def producer(port: int, admin: str) -> str:
    h = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h, timeout=30) as c:
        c.put("/v1/admin/producers/bench", json={"keyspaces": ["p/"]}).raise_for_status()
        r = c.post("/v1/admin/producers/bench/tokens")
        r.raise_for_status()
        return str(r.json()["token"])


def start_replica(tmp: Path, name: str, rport: int) -> tuple[Proc, int]:
    port = free_port()
    p = Proc(
        mercury_cmd(
            "replica",
            str(tmp / name),
            "--listen",
            f"127.0.0.1:{port}",
            "--source",
            f"127.0.0.1:{rport}",
        ),
        tmp / f"{name}.log",
    )
    wait_http(f"http://127.0.0.1:{port}/healthz", timeout=600, proc=p.p)
    return p, port


def replica_phase(tmp: Path, args: argparse.Namespace, rport: int, how: str) -> dict[str, Any]:
    name = f"rep-{how}"
    rep, port = start_replica(tmp, name, rport)
    data = tmp / name
    wait_until(
        lambda: httpx.get(f"http://127.0.0.1:{port}/v1/kv/p/k", timeout=5).status_code == 200,
        60,
        "replica has the key",
    )
    load = ReadLoad(port, "/v1/kv/p/k", b"v1", args.read_rate, args.conns, args.new_conns)
    marks: dict[str, float] = {}
    pids: list[int] = [rep.pid]

    def switch() -> None:
        time.sleep(args.steady_s)
        marks["signal"] = time.monotonic()
        if how == "handover":
            os.kill(rep.pid, signal.SIGUSR2)
            code = rep.p.wait(60)
            new = wait_until(
                lambda: (holder_pid(str(data)) or rep.pid) != rep.pid and holder_pid(str(data)),
                30,
                "new lock holder",
            )
            pids.append(new)
        else:
            os.kill(rep.pid, signal.SIGTERM)
            code = rep.p.wait(60)
            again = Proc(rep.argv, tmp / f"{name}.log")
            pids.append(again.pid)
            wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=again.p)
        marks["switched"] = time.monotonic()
        marks["old_exit"] = code
        time.sleep(args.steady_s / 2)

    async def drive() -> None:
        runner = asyncio.get_running_loop().create_task(load.run())
        await asyncio.to_thread(switch)
        load.stop.set()
        await asyncio.wait_for(runner, 30)

    t0 = time.monotonic()
    try:
        asyncio.run(asyncio.wait_for(drive(), MAX_SECONDS))
    finally:
        for pid in pids:
            stop_pid(pid)
    out = load.summary((t0 + 1.0, marks["signal"]), (marks["signal"], marks["switched"] + 0.5))
    out["old_exit_code"] = marks["old_exit"]
    out["switch_s"] = round(marks["switched"] - marks["signal"], 3)
    return out


def replica_scenario(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    root, port, rport, admin = start_root(tmp, "root-r", "--batch-window-ms", "20")
    try:
        tok = producer(port, admin)
        httpx.put(
            f"http://127.0.0.1:{port}/v1/kv/p/k",
            content=b"v1",
            headers={"Authorization": f"Bearer {tok}"},
            timeout=30,
        ).raise_for_status()
        hand = replica_phase(tmp, args, rport, "handover")
        plain = replica_phase(tmp, args, rport, "restart")
    finally:
        stop_pid(root.pid)
    return {"handover": hand, "stop_start": plain}


class Writers:
    def __init__(self, port: int, token: str, n: int) -> None:
        self.port, self.token, self.n = port, token, n
        self.acks: list[float] = []
        self.acked: list[str] = []
        self.failed: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self, i: int) -> None:
        h = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{self.port}", headers=h, timeout=30) as c:
            for n in range(1_000_000):
                if self.stop.is_set():
                    return
                key = f"p/w{i}-{n}"
                try:
                    r = c.put(f"/v1/kv/{key}", content=key.encode())
                    ok, why = r.status_code in (200, 201), f"status {r.status_code}"
                except httpx.HTTPError as e:
                    ok, why = False, type(e).__name__
                if ok:
                    self.acks.append(time.monotonic())
                    self.acked.append(key)
                else:
                    self.failed[why] = self.failed.get(why, 0) + 1


def max_gap(times: list[float], lo: float, hi: float) -> float | None:
    xs = sorted(t for t in times if lo <= t <= hi)
    if len(xs) < 2:
        return None
    return round(max(b - a for a, b in itertools.pairwise(xs)) * 1000, 1)


def root_scenario(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    root, port, _, admin = start_root(tmp, "root-w", "--batch-window-ms", str(args.window_ms))
    data = tmp / "root-w"
    pids = [root.pid]
    try:
        tok = producer(port, admin)
        wr = Writers(port, tok, args.writers)
        threads = [
            threading.Thread(target=wr.run, args=(i,), daemon=True) for i in range(args.writers)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(args.steady_s)
        t_sig = time.monotonic()
        os.kill(root.pid, signal.SIGUSR2)
        code = root.p.wait(60)
        new = wait_until(
            lambda: (holder_pid(str(data)) or root.pid) != root.pid and holder_pid(str(data)),
            30,
            "new lock holder",
        )
        pids.append(new)
        n_at_new = len(wr.acks)
        wait_until(lambda: len(wr.acks) > n_at_new + 10, 60, "writes on the new root")
        t_new = time.monotonic()
        time.sleep(args.steady_s / 2)
        wr.stop.set()
        for t in threads:
            t.join(60)
        h = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h, timeout=30) as c:
            missing = sum(1 for k in wr.acked if c.get(f"/v1/kv/{k}").content != k.encode())
    finally:
        for pid in pids:
            stop_pid(pid)
    gap = max_gap(wr.acks, t_sig - 0.001, t_new)
    return {
        "writers": args.writers,
        "window_ms": args.window_ms,
        "acked": len(wr.acked),
        "failed": sum(wr.failed.values()),
        "failures": wr.failed,
        "lost": missing,
        "old_exit_code": code,
        "steady_max_gap_ms": max_gap(wr.acks, t0 + 1.0, t_sig),
        "switch_max_gap_ms": gap,
        "gap_bound_ms": args.window_ms + 100,
        "gap_within_bound": gap is not None and gap <= args.window_ms + 100,
    }


def fill(port: int, token: str, mb: int) -> None:
    value = os.urandom(512 * 1024)
    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h, timeout=120) as c:
        for i in range(mb * 2):
            c.put(f"/v1/kv/p/big{i:06d}", content=value).raise_for_status()


def new_holder(data: Path, old: int) -> int:
    """The PID holding `data`'s writer lock once it is not `old`."""

    def holder() -> int | None:
        pid = holder_pid(str(data))
        return pid if pid is not None and pid != old else None

    return wait_until(holder, 60, "new lock holder")


def startup_of(log: Path, t_signal: float) -> dict[str, Any]:
    start = events(log, "handover-start")[-1]
    done = events(log, "handover")[-1]
    out = {
        "signal_to_ready_s": round(ts(done) - t_signal, 3),
        "new_start_to_ready_s": round(ts(done) - ts(start), 3),
        "stage": done.get("stage"),
    }
    # The new process logs to the same file (it inherits the old one's output): a root's
    # part after PREPARED (the old one's drain, the lock, the store's open, its app).
    locked = [e for e in events(log, "writer-lock") if ts(e) >= ts(done)]
    began = [e for e in events(log, "start") if ts(e) >= ts(done)]
    if locked and began and done.get("stage") == "PREPARED":
        out["prepared_to_lock_s"] = round(ts(locked[0]) - ts(done), 3)
        out["lock_to_start_event_s"] = round(ts(began[0]) - ts(locked[0]), 3)
    return out


def startup_scenario(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    root, port, rport, admin = start_root(tmp, "root-big", "--batch-window-ms", "20", "--no-sync")
    pids = [root.pid]
    try:
        tok = producer(port, admin)
        t = time.monotonic()
        fill(port, tok, args.store_mb)
        fill_s = time.monotonic() - t
        rep, rep_port = start_replica(tmp, "rep-big", rport)
        pids.append(rep.pid)
        seq = httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=30).json()["seq"]
        wait_until(
            lambda: (
                httpx.get(f"http://127.0.0.1:{rep_port}/v1/status", timeout=30).json()["seq"] >= seq
            ),
            600,
            "replica caught up",
        )
        size = (tmp / "root-big" / "data.mdb").stat().st_size
        out: dict[str, Any] = {"store_mb": round(size / 2**20), "fill_s": round(fill_s, 1)}
        for name, p, data in (("root", root, tmp / "root-big"), ("replica", rep, tmp / "rep-big")):
            t_sig = time.time()
            os.kill(p.pid, signal.SIGUSR2)
            code = p.p.wait(120)
            pids.append(new_holder(data, p.pid))
            out[name] = {**startup_of(p.log, t_sig), "old_exit_code": code}
    finally:
        for pid in pids:
            stop_pid(pid)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="replica,root,startup")
    ap.add_argument("--read-rate", type=float, default=2000)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--new-conns", type=float, default=50)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--window-ms", type=int, default=500)
    ap.add_argument("--steady-s", type=float, default=5.0)
    ap.add_argument("--store-mb", type=int, default=1024)
    args = ap.parse_args()
    if args.quick:
        args.steady_s, args.store_mb = 2.0, 64
    args.steady_s = min(args.steady_s, MAX_SECONDS / 4)
    from core import eventloop

    eventloop.install()
    only = set(args.only.split(","))
    out: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items()}}
    out["settings"]["loadavg_start"] = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mercury-handover-") as d:
        tmp = Path(d)
        if "replica" in only:
            out["replica"] = replica_scenario(tmp, args)
        if "root" in only:
            out["root"] = root_scenario(tmp, args)
        if "startup" in only:
            out["startup"] = startup_scenario(tmp, args)
    out["settings"]["loadavg_end"] = os.getloadavg()
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
