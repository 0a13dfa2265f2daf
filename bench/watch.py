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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--watchers", type=int, default=1000)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--window-ms", type=int, default=10)
    p.add_argument("--max-seconds", type=float, default=300)
    p.add_argument("--crowd-port", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.crowd_port is not None:
        asyncio.run(crowd(args.crowd_port, args.watchers))
        return 0
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
                name="root",
            )
            wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
            with httpx.Client(
                base_url=f"http://127.0.0.1:{gw}", headers={"Authorization": f"Bearer {token}"}
            ) as admin:
                admin.put(
                    "/v1/admin/producers/bench", json={"keyspaces": ["bench/"]}
                ).raise_for_status()
                ptoken = admin.post("/v1/admin/producers/bench/tokens").json()["token"]
            replica = procs.start_mercury(
                "replica",
                str(tmp / "replica"),
                "--source",
                f"127.0.0.1:{repl}",
                "--listen",
                f"127.0.0.1:{http}",
                name="replica",
            )
            wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60, proc=replica)
            out = asyncio.run(bench(args, gw, http, ptoken))
        except BaseException:
            print(procs.logs()[-6000:], file=sys.stderr)
            raise
        finally:
            procs.stop_all()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
