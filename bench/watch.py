"""Watch fan-out benchmark (prints JSON).

A real `mercury root` (batch window `--window-ms`) and one `mercury replica`. A probe
watcher follows ``bench/`` on the replica (`GET /v1/watch`); one producer PUTs a fresh key
under ``bench/`` on the root, and the time from sending the PUT to the probe receiving the
change's line is one propagation sample. The same run measures it twice:

1. with the probe alone;
2. with `--watchers` more streams (default 1,000) on the same prefix, so every probe
   write is fanned out to all of them: beside the probe's delay, the delay until the
   *last* of them has the line (fan-out complete).

Goal: P99 with the watchers <= 2x P99 without. Bounded in count (`--samples` per phase)
and time (`--max-seconds` for the whole run); every process started is stopped by PID.
The crowd of watchers runs in a child process of its own (one asyncio loop), so the probe's
delay is not the crowd's client-side work; all of them share the machine's cores with the
root, the replica's read process and its applier. The fan-out delay compares the crowd's
receive times with the PUT's send time on CLOCK_MONOTONIC (`time.perf_counter`), which
every process on the machine shares.

Usage: .venv/bin/python bench/watch.py [--watchers N] [--samples N] [--window-ms MS]

``--attack catchup``: the hostile catch-up instead (`catchup_attack`). About `--fill-mb`
MB (default 40) written under ``big/`` in `--batch-mb` batches, then `--watchers` streams
(default 200) open ``GET /v1/watch?prefix=big/&from_seq=1`` on the target (`--target
replica|root`; the root's watch takes the producer's token) with a small receive buffer and
never read; meanwhile a well-behaved client reads a small key from the target (one request
at a time, 2 s timeout each). Printed: that client's success % and P50/P99 before and
during the attack, the target's serving process's anonymous RSS before, at its peak during
the attack and after the streams closed, and the watch metrics. Goal: RSS growth <= 256
MB, the well-behaved client >= 99 % successful with P99 <= 100 ms.

``--attack streams``: the same, with `--watchers` (default 1,200: past the HTTP listener's
1,000 connections) live streams on a quiet prefix (``GET /v1/watch?prefix=quiet/``) that
never read, and the well-behaved client alternating a point read and ``GET /metrics``
(with ``--target root``, a write too): streams hold no connection slot, so it is served.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import guestmem
from testkit import procstat
from testkit.procs import Procs, free_port, run_mercury, wait_http


def pct(xs: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank) of xs, in ms."""
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p / 100 * len(s)))] * 1000, 2)


class Watch:
    """One raw watch stream: records when a wanted marker shows up in its bytes."""

    def __init__(self) -> None:
        self.marker = b""
        self.seen_at: float | None = None
        self.seen = asyncio.Event()
        self.tail = b""
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self, port: int, prefix: str) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.writer.write(f"GET /v1/watch?prefix={prefix} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        await self.writer.drain()

    def expect(self, marker: bytes) -> None:
        self.marker, self.seen_at = marker, None
        self.seen.clear()

    async def run(self) -> None:
        assert self.reader is not None
        tail = b""
        while data := await self.reader.read(1 << 16):
            buf = tail + data
            # lines are never split across HTTP chunks (one chunk per hub hand-out), but
            # a TCP read may end anywhere: keep a tail longer than a marker
            if self.marker and self.seen_at is None and self.marker in buf:
                self.seen_at = time.perf_counter()
                self.seen.set()
            tail = self.tail = buf[-256:]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def crowd(port: int, n: int) -> None:
    """Child process: `n` watch streams on ``bench/``; until stdin closes, note for each
    ``bench/c<I>`` change how many streams got it and when the last one did; then print
    ``{I: [count, last perf_counter]}`` as JSON."""
    got: dict[int, list[float]] = {}
    tag = b'"key":"bench/c'

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/watch?prefix=bench/ HTTP/1.1\r\nHost: bench\r\n\r\n")
        partial = b""
        try:
            while data := await reader.read(1 << 16):
                now = time.perf_counter()
                lines = (partial + data).split(b"\n")
                partial = lines.pop()
                for line in lines:
                    at = line.find(tag)
                    if line.startswith(b"{") and at >= 0:
                        start = at + len(tag)
                        i = int(line[start : line.index(b'"', start)])
                        rec = got.setdefault(i, [0, 0.0])
                        rec[0] += 1
                        rec[1] = max(rec[1], now)
        finally:
            writer.close()

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # the parent closes stdin: done
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(got), flush=True)


async def measure(
    producer: httpx.AsyncClient, probe: Watch, samples: int, tag: str, deadline: float
) -> tuple[dict[str, Any], dict[int, float]]:
    """Probe delays of `samples` writes (and each write's send time, by index)."""
    lat: list[float] = []
    sent: dict[int, float] = {}
    for i in range(samples):
        if time.monotonic() > deadline:
            break
        key = f"bench/{tag}{i}"
        probe.expect(f'"key":"{key}"'.encode())
        t0 = sent[i] = time.perf_counter()
        r = await producer.put(f"/v1/kv/{key}", content=b"x" * 100)
        r.raise_for_status()
        try:
            await asyncio.wait_for(probe.seen.wait(), 30)
        except TimeoutError:
            raise TimeoutError(
                f"{key} never reached the probe; it last got {probe.tail!r}"
            ) from None
        assert probe.seen_at is not None
        lat.append(probe.seen_at - t0)
        await asyncio.sleep(0.02)  # writes spaced like a steady producer, not a flood
    doc: dict[str, Any] = {
        "samples": len(lat),
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "max_ms": round(max(lat) * 1000, 2) if lat else None,
    }
    return doc, sent


async def bench(args: argparse.Namespace, gw: int, http: int, ptoken: str) -> dict[str, Any]:
    deadline = time.monotonic() + args.max_seconds
    headers = {"Authorization": f"Bearer {ptoken}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw}", headers=headers) as prod:
        probe = Watch()
        await probe.open(http, "bench/")
        task = asyncio.create_task(probe.run())
        child = None
        try:
            await asyncio.sleep(0.5)
            alone, _ = await measure(prod, probe, args.samples, "a", deadline)
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--crowd-port",
                str(http),
                "--watchers",
                str(args.watchers),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            assert child.stdout is not None and child.stdin is not None
            await asyncio.wait_for(child.stdout.readline(), 60)  # "ready"
            await asyncio.sleep(3.0)  # every stream has connected and joined the hub
            crowd, sent = await measure(prod, probe, args.samples, "c", deadline)
            await asyncio.sleep(2.0)  # the last fan-out lands
            child.stdin.close()
            got = json.loads(await asyncio.wait_for(child.stdout.read(), 60))
            await child.wait()
            child = None
            fan = [
                got[str(i)][1] - t0
                for i, t0 in sent.items()
                if str(i) in got and got[str(i)][0] == args.watchers
            ]
            crowd["fanout_complete"] = len(fan)
            crowd["fanout_all_p50_ms"] = pct(fan, 50)
            crowd["fanout_all_p99_ms"] = pct(fan, 99)
        finally:
            probe.close()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if child is not None and child.returncode is None:
                child.kill()  # by its PID, this run's own child
                await child.wait()
    ratio = (
        round(crowd["p99_ms"] / alone["p99_ms"], 2) if crowd["p99_ms"] and alone["p99_ms"] else None
    )
    return {
        "bench": "watch",
        "settings": {
            "watchers": args.watchers,
            "samples_per_phase": args.samples,
            "window_ms": args.window_ms,
            "prefix": "bench/ (every watcher gets every probe write)",
            "max_seconds": args.max_seconds,
        },
        "without_watchers": alone,
        "with_watchers": crowd,
        "p99_ratio": ratio,
        "goal_p99_ratio": 2.0,
    }


async def _reader(
    url: str,
    key: str,
    stop: asyncio.Event,
    out: list[float | None],
    token: str | None,
    mixed: bool = False,
) -> None:
    """A well-behaved client: GET `key` one request at a time until `stop`; each latency
    (None: failed or over 2 s) into `out`. `token`: the root's point GET takes one.
    `mixed`: every other request is ``GET /metrics``, and with a token every third a PUT
    of `key` (the root)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=url, timeout=2.0, headers=headers) as c:
        i = 0
        while not stop.is_set():
            i += 1
            t0 = time.perf_counter()
            try:
                if mixed and token and i % 3 == 0:
                    r = await c.put(f"/v1/kv/{key}", content=b"fine")
                elif mixed and i % 2 == 0:
                    r = await c.get("/metrics")
                else:
                    r = await c.get(f"/v1/kv/{key}")
                out.append(time.perf_counter() - t0 if r.status_code == 200 else None)
            except httpx.HTTPError:
                out.append(None)
            await asyncio.sleep(0.01)


def _summary(lat: list[float | None]) -> dict[str, Any]:
    ok = [x for x in lat if x is not None]
    return {
        "requests": len(lat),
        "success_pct": round(100 * len(ok) / len(lat), 2) if lat else None,
        "p50_ms": pct(ok, 50),
        "p99_ms": pct(ok, 99),
        "max_ms": round(max(ok) * 1000, 2) if ok else None,
    }


async def catchup_attack(
    args: argparse.Namespace, url: str, pid: int, token: str | None
) -> dict[str, Any]:
    """`--watchers` never-reading catch-up streams from seq 1 against `url` (served by
    process `pid`), beside a well-behaved reader (module docstring)."""
    host, port = url.removeprefix("http://").split(":")
    mixed = args.attack == "streams"
    stop = asyncio.Event()
    before_lat: list[float | None] = []
    during_lat: list[float | None] = []
    rss: list[int] = []

    async def sample(until: asyncio.Event) -> None:
        while not until.is_set():
            rss.append(procstat.anon_rss_bytes(pid))
            await asyncio.sleep(0.1)

    mb = 1 << 20
    t = asyncio.create_task(_reader(url, "ok/k", stop, before_lat, token, mixed))
    await asyncio.sleep(args.phase_seconds)
    stop.set()
    await t
    rss_before = procstat.anon_rss_bytes(pid)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(stop))
    reader = asyncio.create_task(_reader(url, "ok/k", stop, during_lat, token, mixed))
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    query = "prefix=big/&from_seq=1" if args.attack == "catchup" else "prefix=quiet/"
    req = (f"GET /v1/watch?{query} HTTP/1.1\r\nHost: bench\r\n{auth}\r\n").encode()
    socks: list[Any] = []
    statuses: dict[str, int] = {}
    t_open = time.monotonic()
    try:
        for _ in range(args.watchers):
            s = __import__("socket").socket()
            s.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 4096)
            s.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(s, (host, int(port)))
            await loop.sock_sendall(s, req)
            socks.append(s)
        await asyncio.sleep(args.hold_seconds)
        stop.set()
        await asyncio.gather(sampler, reader)
        # What the streams got (a peek: each holds at most its receive buffer).
        for s in socks:
            try:
                head = s.recv(64)
            except (BlockingIOError, OSError):
                head = b""
            code = head[9:12].decode("latin-1") if head.startswith(b"HTTP/1.1 ") else "none"
            statuses[code] = statuses.get(code, 0) + 1
    finally:
        for s in socks:
            s.close()
    held_s = time.monotonic() - t_open
    metrics_text = httpx.get(url + "/metrics", timeout=30).text
    # Memory after: the streams' ends reach the server; give it a few seconds to let go.
    after: list[int] = []
    for _ in range(int(args.settle_seconds * 10)):
        await asyncio.sleep(0.1)
        after.append(procstat.anon_rss_bytes(pid))
    peak = max(rss) if rss else rss_before
    watch_metrics = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in metrics_text.splitlines()
        if line.startswith("mercury_watch") and " " in line
    }
    return {
        "reader_before": _summary(before_lat),
        "reader_during": _summary(during_lat),
        "watch_answers": statuses,
        "attack_seconds": round(held_s, 1),
        "rss_mb": {
            "before": round(rss_before / mb, 1),
            "peak": round(peak / mb, 1),
            "after_close": round(after[-1] / mb, 1) if after else None,
            "growth_peak": round((peak - rss_before) / mb, 1),
            "growth_after_close": round((after[-1] - rss_before) / mb, 1) if after else None,
        },
        "watch_metrics": watch_metrics,
    }


def fill(gw: int, ptoken: str, fill_mb: int, batch_mb: int, value_kb: int) -> int:
    """Write about `fill_mb` MB under ``big/`` in batches of `batch_mb` MB, and ``ok/k``;
    the last seq."""
    headers = {"Authorization": f"Bearer {ptoken}"}
    value = "v" * (value_kb << 10)
    per_batch = max(1, (batch_mb << 10) // value_kb)
    total = (fill_mb << 10) // value_kb
    seq = 0
    with httpx.Client(base_url=f"http://127.0.0.1:{gw}", headers=headers, timeout=120) as c:
        for start in range(0, total, per_batch):
            ops = [
                {"op": "set", "key": f"big/{i:06d}", "value": value}
                for i in range(start, min(total, start + per_batch))
            ]
            r = c.post("/v1/batch", json={"ops": ops})
            r.raise_for_status()
            seq = int(r.json()["seq"])
        r = c.put("/v1/kv/ok/k", content=b"fine")
        r.raise_for_status()
    return max(seq, int(r.json()["seq"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--watchers", type=int, default=1000)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--window-ms", type=int, default=10)
    p.add_argument("--max-seconds", type=float, default=300)
    p.add_argument("--crowd-port", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--attack", choices=("catchup", "streams"), default=None)
    p.add_argument("--target", choices=("replica", "root"), default="replica")
    p.add_argument("--fill-mb", type=int, default=40)
    p.add_argument("--batch-mb", type=int, default=4)
    p.add_argument("--value-kb", type=int, default=64)
    p.add_argument("--hold-seconds", type=float, default=20.0)
    p.add_argument("--phase-seconds", type=float, default=5.0)
    p.add_argument("--settle-seconds", type=float, default=5.0)
    p.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="an extra flag for the target process (repeat; e.g. --server-flag=--x=1)",
    )
    p.add_argument(
        "--hold-freed-memory",
        action="store_true",
        help="hold the VM's free page reporting off for the run (bench/guestmem.py): the RSS "
        "figures then do not depend on what the host took back meanwhile",
    )
    args = p.parse_args()
    if args.attack is not None and args.watchers == 1000:
        args.watchers = 200 if args.attack == "catchup" else 1200
    if args.attack == "streams":
        args.fill_mb = min(args.fill_mb, 1)
    if args.crowd_port is not None:
        asyncio.run(crowd(args.crowd_port, args.watchers))
        return 0
    memory = guestmem.hold_for_run(args.hold_freed_memory)
    with tempfile.TemporaryDirectory(prefix="mercury-watch-bench-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "logs").mkdir()
        procs = Procs(tmp / "logs")
        try:
            r = run_mercury("init", str(tmp / "root"))
            assert r.returncode == 0, r.stderr
            token = (tmp / "root" / "admin.token").read_text().strip()
            gw, repl, http = free_port(), free_port(), free_port()
            root = procs.start_mercury(
                "root",
                str(tmp / "root"),
                "--listen",
                f"127.0.0.1:{gw}",
                "--repl-listen",
                f"127.0.0.1:{repl}",
                "--batch-window-ms",
                str(args.window_ms),
                *(args.server_flag if args.attack and args.target == "root" else []),
                name="root",
            )
            wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
            with httpx.Client(
                base_url=f"http://127.0.0.1:{gw}", headers={"Authorization": f"Bearer {token}"}
            ) as admin:
                admin.put(
                    "/v1/admin/producers/bench",
                    json={"keyspaces": ["bench/", "big/", "ok/", "quiet/"]},
                ).raise_for_status()
                ptoken = admin.post("/v1/admin/producers/bench/tokens").json()["token"]
            replica = procs.start_mercury(
                "replica",
                str(tmp / "replica"),
                "--source",
                f"127.0.0.1:{repl}",
                "--listen",
                f"127.0.0.1:{http}",
                *(args.server_flag if args.attack and args.target == "replica" else []),
                name="replica",
            )
            wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60, proc=replica)
            if args.attack is None:
                out = asyncio.run(bench(args, gw, http, ptoken))
            else:
                seq = fill(gw, ptoken, args.fill_mb, args.batch_mb, args.value_kb)
                t_end = time.monotonic() + 120
                while time.monotonic() < t_end:  # the replica has it all
                    st = httpx.get(f"http://127.0.0.1:{http}/v1/status", timeout=10).json()
                    if int(st["seq"]) >= seq:
                        break
                    time.sleep(0.2)
                on_root = args.target == "root"
                url = f"http://127.0.0.1:{gw if on_root else http}"
                pid = (root if on_root else replica).pid
                out = {
                    "bench": f"watch-{args.attack}-attack",
                    "settings": {
                        "target": args.target,
                        "watchers": args.watchers,
                        "fill_mb": args.fill_mb,
                        "batch_mb": args.batch_mb,
                        "value_kb": args.value_kb,
                        "hold_seconds": args.hold_seconds,
                        "server_flags": args.server_flag,
                    },
                    **asyncio.run(catchup_attack(args, url, pid, ptoken if on_root else None)),
                    "goal": {"rss_growth_mb": 256, "success_pct": 99, "p99_ms": 100},
                }
        except BaseException:
            print(procs.logs()[-6000:], file=sys.stderr)
            raise
        finally:
            procs.stop_all()
    out |= memory
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
