"""Gateway write throughput and latency, each beside a no-op baseline in the same run (JSON).

Servers run as separate processes (uvicorn, uvloop + httptools, no access log), one at a
time; the load comes from this process (an asyncio HTTP/1.1 keep-alive client on uvloop).

- ``put``: single-key PUTs/s with a 5 ms batch window (fsync on) at ``--put-conns``
  connections (default 256: the window then bounds the gateway at conns / window = 51,200/s,
  far above what it reaches), beside the same server stack doing nothing — a raw-ASGI no-op
  under the same uvicorn settings that reads the body and checks the Authorization header
  (the headline ratio: the gateway's raw-ASGI fast path against it) — and beside a no-op
  FastAPI PUT reading the body and a no-op FastAPI POST with a pydantic body.
- ``batch``: pairs/s through ``POST /v1/batch`` with 1,000 pairs per request, new keys in
  ascending order (a bulk load), beside a raw-ASGI no-op that checks the Authorization
  header and decodes the same bodies with orjson (the decoder family the gateway uses) and
  a FastAPI no-op decoding them with pydantic. Then random overwrites of a fresh N-key
  store through the gateway, beside raw py-lmdb loaded the same way (same keys, values and
  transaction sizes) applying the very same requests in the same order, grouped into
  transactions of the gateway's measured mean batch size, each sorted by key as the
  batcher sorts a batch.
- ``ack``: ack latency P50/P99 with the 500 ms window at a steady rate (default 2,000
  single-key PUTs/s of random keys into the N-key store), with where it goes: this
  client's lag writing a request after its scheduled time (``client_send_lag``) and
  resuming after reading its answer (``client_resume_lag``), write to answer read
  (``sent_to_answer_read``), the server's own P99 bucket, batches, mean ops and mean
  commit time between the run's two /metrics reads, and the 1-minute load average.
- ``dup``: bytes the root process wrote to disk per second (/proc/PID/io) under a
  duplicate-only workload, beside the same workload with fresh values.
- ``fair``: producer B's ack P99 alone and while producer A floods at 10× its quota.

Usage: .venv/bin/python bench/gateway_write.py [--keys N] [--seconds S] [--quick]
       [--only put,batch,ack,dup,fair] [--put-conns N] [--switch-interval-ms MS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import lmdb
import orjson
import uvloop
from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.responses import Response

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testkit.procs import (  # noqa: E402
    free_port,
    mercury_cmd,
    wait_http,
)
from testkit.procstat import cpu_seconds, write_bytes  # noqa: E402

#: Extra `mercury root` flags of every root this run starts (``--switch-interval-ms``).
ROOT_ARGS: list[str] = []

VALUE = b"v" * 100


# --- no-op baseline server ------------------------------------------------------------------


class OpModel(BaseModel):
    """One op of a no-op batch body."""

    op: str
    key: str
    value: str | None = None


class BatchModel(BaseModel):
    """A no-op batch body."""

    ops: list[OpModel]


class PairModel(BaseModel):
    """A no-op single pair body."""

    key: str
    value: str


def noop_app() -> Any:
    """FastAPI endpoints that parse what the gateway parses and do nothing else."""
    app = FastAPI()

    @app.put("/v1/kv/{key:path}")
    async def put(key: str, request: Request) -> Response:
        await request.body()
        return Response(b'{"seq":0,"status":"written"}', media_type="application/json")

    @app.post("/noop/pydantic")
    async def pyd(body: PairModel) -> dict[str, Any]:
        return {"seq": 0, "status": "written"}

    @app.post("/v1/batch")
    async def batch(body: BatchModel) -> dict[str, Any]:
        return {"seq": 0, "written": len(body.ops), "deleted": 0, "duplicates": 0}

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


#: The no-op's only token ("x"), stored as the gateway stores tokens: a SHA-256 → producer map.
_NOOP_TOKENS = {hashlib.sha256(b"x").digest(): "bench"}


def raw_noop_app() -> Any:
    """Raw ASGI, like the gateway's fast path: ``PUT /v1/kv/*`` reads the body and checks
    the bearer token; ``POST /v1/batch`` also decodes the body with orjson and counts its
    ops. No framework, no store."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
            return
        auth = b""
        for k, v in scope["headers"]:
            if k == b"authorization":
                auth = v
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        path = scope["path"]
        if path == "/healthz":
            status, out = 200, b'{"ok":true}'
        elif not auth.startswith(b"Bearer ") or (
            hashlib.sha256(auth[7:]).digest() not in _NOOP_TOKENS
        ):
            status, out = 401, b'{"title":"unauthorized"}'
        elif path == "/v1/batch":
            ops = orjson.loads(body)["ops"]
            status, out = 200, b'{"seq":0,"written":%d}' % len(ops)
        else:
            status, out = 200, b'{"seq":0,"status":"written"}'
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(out)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": out})

    return app


def serve_noop(port: int, kind: str) -> None:
    import uvicorn

    uvicorn.run(
        raw_noop_app() if kind == "raw" else noop_app(),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


# --- servers ----------------------------------------------------------------------------------


@contextlib.contextmanager
def server(argv: list[str], url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        p = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
    try:
        wait_http(url + "/healthz", timeout=60, proc=p)
        yield p
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)


def noop_server(tmp: Path, kind: str = "fastapi") -> Any:
    """A no-op server process: ``raw`` (raw ASGI, orjson) or ``fastapi`` (pydantic)."""
    port = free_port()
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve-noop", str(port), kind]
    url = f"http://127.0.0.1:{port}"
    return server(argv, url, tmp / f"noop-{kind}.log"), url


def init_root(data: Path) -> str:
    r = subprocess.run(
        mercury_cmd("init", str(data)),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return (data / "admin.token").read_text().strip()


def root_server(tmp: Path, data: Path, window_ms: float, *extra: str) -> Any:
    port = free_port()
    argv = mercury_cmd(
        "root",
        str(data),
        "--listen",
        f"127.0.0.1:{port}",
        "--repl-listen",
        f"127.0.0.1:{free_port()}",
        "--batch-window-ms",
        str(window_ms),
        "--log-level",
        "warning",
        *ROOT_ARGS,
        *extra,
    )
    url = f"http://127.0.0.1:{port}"
    return server(argv, url, tmp / "root.log"), url


def add_producer(url: str, admin: str, name: str, keyspace: str, **config: Any) -> str:
    h = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, headers=h, timeout=60) as c:
        r = c.put(f"/v1/admin/producers/{name}", json={"keyspaces": [keyspace], **config})
        r.raise_for_status()
        r = c.post(f"/v1/admin/producers/{name}/tokens")
        r.raise_for_status()
        return str(r.json()["token"])


# --- HTTP/1.1 keep-alive client -----------------------------------------------------------------


class Conn(asyncio.Protocol):
    """One keep-alive connection: one request at a time, responses framed by Content-Length."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.transport: Any = None
        #: when the last request was written and when its whole answer was read (perf_counter)
        self.sent = 0.0
        self.arrived = 0.0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None:
            return
        i = self.buf.find(b"\r\n\r\n")
        if i < 0:
            return
        head = bytes(self.buf[:i]).lower()
        j = head.find(b"content-length:")
        n = 0  # a response without Content-Length (some of KT's) has no body here
        if j >= 0:
            end = head.find(b"\r\n", j)
            n = int(head[j + 15 : end if end != -1 else len(head)])
        if len(self.buf) < i + 4 + n:
            return
        status = int(head[9:12])
        del self.buf[: i + 4 + n]
        self.arrived = time.perf_counter()
        w, self.waiter = self.waiter, None
        w.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    async def request(self, raw: bytes) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        self.sent = time.perf_counter()
        return await self.waiter


async def connect(port: int) -> Conn:
    _, proto = await asyncio.get_running_loop().create_connection(Conn, "127.0.0.1", port)
    return proto


def req(method: str, path: str, body: bytes, token: str | None, ctype: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    if ctype:
        head += f"Content-Type: {ctype}\r\n"
    return head.encode() + b"\r\n" + body


async def closed_loop(
    url: str, conns: int, seconds: float, make: Callable[[int], bytes]
) -> dict[str, Any]:
    """`conns` connections each sending back-to-back for `seconds`; requests/s and statuses."""
    port = int(url.rsplit(":", 1)[1])
    cs = [await connect(port) for _ in range(conns)]
    counter = iter(range(1 << 62))
    statuses: dict[int, int] = {}
    lat: list[float] = []
    deadline = time.perf_counter() + seconds

    async def run(c: Conn) -> None:
        while time.perf_counter() < deadline:
            raw = make(next(counter))
            t = time.perf_counter()
            s = await c.request(raw)
            lat.append(time.perf_counter() - t)
            statuses[s] = statuses.get(s, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(run(c) for c in cs))
    dt = time.perf_counter() - t0
    for c in cs:
        c.transport.close()
    n = sum(statuses.values())
    return {"requests": n, "per_s": round(n / dt, 1), "statuses": statuses, **pct(lat)}


async def open_loop(
    url: str,
    rate: float,
    seconds: float,
    make: Callable[[int], bytes],
    conns: int,
    keep: list[float] | None = None,
) -> dict[str, Any]:
    """Requests sent on a fixed schedule (`rate`/s) over a pool of connections; latency is
    measured from the scheduled send time (no coordinated omission). `keep` gets every
    latency (seconds), for percentiles pooled over several calls."""
    port = int(url.rsplit(":", 1)[1])
    pool: asyncio.Queue[Conn] = asyncio.Queue()
    for _ in range(conns):
        pool.put_nowait(await connect(port))
    lat: list[float] = []
    # Where this client's own lag goes (it shares the machine's cores with the server): a
    # request written after its scheduled time, and an answer read before its task resumed
    # (a window's answers arrive together and resume one after another).
    send_lag: list[float] = []
    resume_lag: list[float] = []
    in_flight: list[float] = []
    statuses: dict[int, int] = {}
    total = int(rate * seconds)
    t0 = time.perf_counter()

    async def one(i: int, at: float) -> None:
        c = await pool.get()
        s = await c.request(make(i))
        done = time.perf_counter()
        lat.append(done - at)
        send_lag.append(c.sent - at)
        resume_lag.append(done - c.arrived)
        in_flight.append(c.arrived - c.sent)
        statuses[s] = statuses.get(s, 0) + 1
        pool.put_nowait(c)

    tasks = []
    for i in range(total):
        at = t0 + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i, at)))
    await asyncio.gather(*tasks)
    while not pool.empty():
        pool.get_nowait().transport.close()
    if keep is not None:
        keep.extend(lat)
    return {
        "requests": total,
        "rate": rate,
        "statuses": statuses,
        **pct(lat),
        "client_send_lag": pct(send_lag),
        "client_resume_lag": pct(resume_lag),
        "sent_to_answer_read": pct(in_flight),
    }


WRK_LUA = r"""
local tok = "%(token)s"
local mode = "%(mode)s"
local value = string.rep("v", 100)
local counter = 0
local thread_base = 0
local delay_ms = %(delay_ms)s
delay = function() return delay_ms end
setup = function(thread) end
init = function(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) %% 100000)
  thread_base = math.random(0, 1000000) * 1000000
end
local hdrs = {["Authorization"] = "Bearer " .. tok, ["Content-Type"] = "application/json"}
local pair = '{"key":"b/000000000000","value":"' .. value .. '"}'
request = function()
  counter = counter + 1
  if mode == "put" then
    local k = string.format("%%012x", math.random(0, 2^40))
    return wrk.format("PUT", "/v1/kv/b/" .. k, hdrs, value)
  elseif mode == "flood" then
    local k = string.format("%%012x", math.random(0, 2^40))
    return wrk.format("PUT", "/v1/kv/a/" .. k, hdrs, value)
  elseif mode == "pydantic" then
    return wrk.format("POST", "/noop/pydantic", hdrs, pair)
  else
    local base = (thread_base + counter) * 1000
    local parts = {}
    for j = 0, 999 do
      local op = '{"op":"set","key":"b/%%015d","value":"%%s"}'
      parts[#parts + 1] = string.format(op, base + j, value)
    end
    return wrk.format("POST", "/v1/batch", hdrs, '{"ops":[' .. table.concat(parts, ",") .. ']}')
  end
end
"""


def wrk_cmd(
    url: str, conns: int, seconds: float, mode: str, token: str, tmp: Path, delay_ms: int = 0
) -> list[str]:
    """argv of a one-thread wrk run of `mode` (see WRK_LUA)."""
    script = tmp / f"wrk-{mode}.lua"
    script.write_text(WRK_LUA % {"token": token, "mode": mode, "delay_ms": delay_ms})
    return [
        "wrk",
        "-t1",
        f"-c{conns}",
        f"-d{max(1, int(seconds))}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]


def wrk_run(
    url: str, conns: int, seconds: float, mode: str, token: str, tmp: Path
) -> dict[str, Any]:
    """Closed-loop load by wrk (one thread: the server keeps the other core)."""
    r = subprocess.run(
        wrk_cmd(url, conns, seconds, mode, token, tmp),
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    return parse_wrk(r)


def parse_wrk(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """Requests/s, non-2xx count and P50/P99 from wrk's output."""
    out: dict[str, Any] = {"client": "wrk -t1", "non_2xx": 0}
    for line in r.stdout.splitlines():
        parts = line.split()
        if line.startswith("Requests/sec:"):
            out["per_s"] = float(parts[1])
        elif "Non-2xx or 3xx responses:" in line:
            out["non_2xx"] = int(parts[-1])
        elif "requests in" in line:
            out["requests"] = int(parts[0])
        elif len(parts) == 2 and parts[0] in ("50%", "99%"):
            out["p50_ms" if parts[0] == "50%" else "p99_ms"] = _ms(parts[1])
    if "per_s" not in out:
        raise RuntimeError(f"wrk failed: {r.stdout} {r.stderr}")
    return out


def _ms(v: str) -> float:
    for unit, f in (("us", 0.001), ("ms", 1.0), ("s", 1000.0), ("m", 60000.0)):
        if v.endswith(unit):
            return round(float(v[: -len(unit)]) * f, 3)
    return float(v)


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def pct(lat: list[float]) -> dict[str, float]:
    if not lat:
        return {}
    s = sorted(lat)
    return {
        "p50_ms": round(s[len(s) // 2] * 1000, 2),
        "p99_ms": round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1000, 2),
        "max_ms": round(s[-1] * 1000, 2),
    }


def ack_histogram(url: str, producer: str) -> dict[float, float]:
    """Cumulative bucket counts of `mercury_write_ack_seconds{producer=...}` (server side)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    out: dict[float, float] = {}
    prefix = "mercury_write_ack_seconds_bucket{"
    for line in text.splitlines():
        if line.startswith(prefix) and f'producer="{producer}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def server_p99_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """Upper bound of the bucket holding the P99 of the acks observed between two reads."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0.0
    if not total:
        return None
    for le, n in delta:
        if n >= 0.99 * total:
            return round(le * 1000, 1)
    return None


# --- scenarios -----------------------------------------------------------------------------------


def bench_put(tmp: Path, seconds: float, conns: int) -> dict[str, Any]:
    data = tmp / "put"
    admin = init_root(data)
    rnd = random.Random(1)
    out: dict[str, Any] = {
        "concurrency": conns,
        "window_ms": 5,
        # each connection gets at most one ack per window: the window's ceiling on PUT/s
        "window_bound_per_s": round(conns / 0.005),
        "value_bytes": len(VALUE),
    }
    pair = orjson.dumps({"key": "b/000000000000", "value": VALUE.decode()})

    def put(tok: str) -> Callable[[int], bytes]:
        return lambda i: req("PUT", f"/v1/kv/b/{rnd.getrandbits(48):012x}", VALUE, tok)

    def load(url: str, mode: str, tok: str) -> dict[str, Any]:
        if have_wrk():
            return wrk_run(url, conns, seconds, mode, tok, tmp)
        make = (
            put(tok)
            if mode == "put"
            else (lambda i: req("POST", "/noop/pydantic", pair, tok, "application/json"))
        )
        return asyncio.run(closed_loop(url, conns, seconds, make))

    srv, url = root_server(tmp, data, 5)
    rsrv, rurl = noop_server(tmp, "raw")
    nsrv, nurl = noop_server(tmp, "fastapi")
    runs: dict[str, list[dict[str, Any]]] = {
        "gateway": [],
        "noop_raw_asgi_put": [],
        "noop_fastapi_put": [],
        "noop_fastapi_pydantic_post": [],
    }
    # Only one server is loaded at a time; the idle ones cost nothing.
    with srv, rsrv, nsrv:
        tok = add_producer(url, admin, "bench", "b/")
        # Interleaved rounds, medians: the machine is shared and noisy.
        for _ in range(ROUNDS):
            runs["gateway"].append(load(url, "put", tok))
            runs["noop_raw_asgi_put"].append(load(rurl, "put", "x"))
            runs["noop_fastapi_put"].append(load(nurl, "put", "x"))
            runs["noop_fastapi_pydantic_post"].append(load(nurl, "pydantic", "x"))
    for name, rs in runs.items():
        out[name] = median_run(rs)
    gw = out["gateway"]["per_s"]
    out["ratio_vs_noop_raw_asgi_put"] = round(gw / out["noop_raw_asgi_put"]["per_s"], 3)
    out["ratio_vs_noop_fastapi_put"] = round(gw / out["noop_fastapi_put"]["per_s"], 3)
    out["ratio_vs_noop_fastapi_pydantic_post"] = round(
        gw / out["noop_fastapi_pydantic_post"]["per_s"], 3
    )
    return out


ROUNDS = 3
#: Concurrent 1,000-pair requests: with the 500 ms window a batch commits early at its
#: 10,000-op bound, so a bulk loader needs more than 10 requests in flight.
BATCH_CONNS = 32


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput, with every round's throughput beside it."""
    for r in runs:
        check_2xx(r)
    ordered = sorted(runs, key=lambda r: float(r["per_s"]))
    return {**ordered[len(ordered) // 2], "rounds_per_s": [r["per_s"] for r in runs]}


def check_2xx(run: dict[str, Any]) -> None:
    """Refuse a run with any answer other than 2xx: a baseline answering 401 (or a gateway
    answering 429) measures nothing comparable."""
    bad = {s: n for s, n in run.get("statuses", {}).items() if not 200 <= int(s) < 300}
    if bad or run.get("non_2xx"):
        raise RuntimeError(f"non-2xx answers in a measured run: {run}")


def batch_body(keys: list[str]) -> bytes:
    return orjson.dumps({"ops": [{"op": "set", "key": k, "value": VALUE.decode()} for k in keys]})


def batch_metrics(url: str) -> tuple[float, float]:
    """(sum, count) of `mercury_batch_ops`: ops committed and batches so far."""
    total = count = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("mercury_batch_ops_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("mercury_batch_ops_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count


def commit_metrics(url: str) -> tuple[float, float]:
    """(sum, count) of `mercury_batch_commit_seconds`: seconds spent committing, batches."""
    total = count = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("mercury_batch_commit_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("mercury_batch_commit_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count


def mean_batch(before: tuple[float, float], after: tuple[float, float]) -> int:
    """Mean ops per committed batch between two `batch_metrics` readings."""
    n = after[1] - before[1]
    return max(1, round((after[0] - before[0]) / n)) if n else 1


def overwrite_keys(i: int, n_keys: int) -> list[str]:
    """The keys of overwrite request `i`: 1,000 random existing keys, sorted (a fixed
    sequence, so the gateway and raw LMDB apply the very same requests)."""
    r = random.Random(i)
    return sorted(f"b/{r.randrange(n_keys):012d}" for _ in range(1000))


def overwrite_value(i: int) -> bytes:
    return b"%0100d" % i


def bench_batch(tmp: Path, seconds: float, n_keys: int) -> dict[str, Any]:
    data = tmp / "batch"
    admin = init_root(data)
    out: dict[str, Any] = {"pairs_per_request": 1000, "value_bytes": 100}
    srv, url = root_server(tmp, data, 500)
    seq = iter(range(1 << 40))

    def ascending(tok: str) -> Callable[[int], bytes]:
        def make(i: int) -> bytes:
            base = next(seq) * 1000
            keys = [f"b/a{base + j:012d}" for j in range(1000)]
            return req("POST", "/v1/batch", batch_body(keys), tok, "application/json")

        return make

    def bulk(url: str, tok: str) -> dict[str, Any]:
        if have_wrk():
            r = wrk_run(url, BATCH_CONNS, seconds, "batch", tok, tmp)
        else:
            r = asyncio.run(closed_loop(url, BATCH_CONNS, seconds, ascending(tok)))
        return {**r, "connections": BATCH_CONNS, "pairs_per_s": round(r["per_s"] * 1000)}

    rsrv, rurl = noop_server(tmp, "raw")
    nsrv, nurl = noop_server(tmp, "fastapi")
    with srv, rsrv, nsrv:
        tok = add_producer(url, admin, "bench", "b/")
        gw_runs, raw_runs, pyd_runs = [], [], []
        for _ in range(ROUNDS):  # interleaved rounds, medians
            gw_runs.append(bulk(url, tok))
            raw_runs.append(bulk(rurl, "x"))
            pyd_runs.append(bulk(nurl, "x"))
        out["bulk_load_ascending"] = median_run(gw_runs)
        out["noop_raw_asgi_orjson_batch"] = median_run(raw_runs)
        out["noop_fastapi_pydantic_batch"] = median_run(pyd_runs)
    gw = out["bulk_load_ascending"]["pairs_per_s"]
    out["ratio_bulk_vs_noop_raw_asgi_orjson"] = round(
        gw / out["noop_raw_asgi_orjson_batch"]["pairs_per_s"], 3
    )
    out["ratio_bulk_vs_noop_fastapi_pydantic"] = round(
        gw / out["noop_fastapi_pydantic_batch"]["pairs_per_s"], 3
    )
    out.update(bench_overwrites(tmp, seconds, n_keys))
    return out


def bench_overwrites(tmp: Path, seconds: float, n_keys: int) -> dict[str, Any]:
    """Random overwrites of a fresh `n_keys` store: the gateway, then raw py-lmdb from the
    same state applying the same requests in the same order (see `overwrite_keys`)."""
    data = tmp / "overwrite"
    admin = init_root(data)
    srv, url = root_server(tmp, data, 500)
    with srv:
        tok = add_producer(url, admin, "bench", "b/")
        m0 = batch_metrics(url)
        t0 = time.perf_counter()
        preload(url, tok, n_keys)
        preload_s = time.perf_counter() - t0
        m1 = batch_metrics(url)
        sent = iter(range(1 << 40))

        def overwrite(_: int) -> bytes:
            i = next(sent)
            body = orjson.dumps(
                {
                    "ops": [
                        {"op": "set", "key": k, "value": overwrite_value(i).decode()}
                        for k in overwrite_keys(i, n_keys)
                    ]
                }
            )
            return req("POST", "/v1/batch", body, tok, "application/json")

        ow = asyncio.run(closed_loop(url, BATCH_CONNS, seconds, overwrite))
        check_2xx(ow)
        m2 = batch_metrics(url)
    load_txn, ow_txn = mean_batch(m0, m1), mean_batch(m1, m2)
    out: dict[str, Any] = {
        "preload_pairs_per_s": round(n_keys / preload_s),
        "random_overwrites": {
            **ow,
            "connections": BATCH_CONNS,
            "store_keys": n_keys,
            "mean_batch_ops": ow_txn,
            "pairs_per_s": round(ow["per_s"] * 1000),
        },
        "raw_lmdb_overwrites": raw_lmdb_overwrites(tmp, n_keys, load_txn, ow_txn, seconds),
    }
    out["ratio_overwrites_vs_raw_lmdb"] = round(
        out["random_overwrites"]["pairs_per_s"] / out["raw_lmdb_overwrites"]["pairs_per_s"], 3
    )
    return out


def raw_lmdb_overwrites(
    tmp: Path, n_keys: int, load_txn: int, txn_ops: int, seconds: float
) -> dict[str, Any]:
    """py-lmdb, fsync on: load the keys as the gateway's preload did (ascending, its mean
    batch size per transaction), then apply overwrite requests 0, 1, 2, ... in groups of
    the gateway's mean batch size, each group sorted by key (stable) as the batcher sorts."""
    path = tmp / "raw"
    env = lmdb.open(str(path), map_size=8 << 30, sync=True, metasync=True, readahead=False)
    keys = [f"b/{i:012d}".encode() for i in range(n_keys)]
    for a in range(0, n_keys, load_txn):
        with env.begin(write=True) as txn:
            for k in keys[a : a + load_txn]:
                txn.put(k, VALUE, append=True)
    per_txn = max(1, round(txn_ops / 1000))  # requests per transaction
    i = n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pairs: list[tuple[bytes, bytes]] = []
        for r in range(i, i + per_txn):
            v = overwrite_value(r)
            pairs.extend((k.encode(), v) for k in overwrite_keys(r, n_keys))
        pairs.sort(key=lambda kv: kv[0])
        with env.begin(write=True) as txn:
            for k, v in pairs:
                txn.put(k, v)
        i += per_txn
        n += len(pairs)
    dt = time.perf_counter() - t0
    env.close()
    shutil.rmtree(path)
    return {
        "pairs_per_s": round(n / dt),
        "load_txn_keys": load_txn,
        "txn_keys": per_txn * 1000,
        "store_keys": n_keys,
        "note": "same requests, order and values as the gateway's run; keys built in the loop",
    }


def bench_ack(tmp: Path, seconds: float, n_keys: int, rate: float) -> dict[str, Any]:
    data = tmp / "ack"
    admin = init_root(data)
    # One connection per request in flight: at 2,000/s and a 500 ms window, more than the
    # root's default --http-max-connections (1,000), which would close the excess.
    conns = int(rate * 0.8) + 64
    srv, url = root_server(tmp, data, 500, "--http-max-connections", str(conns + 64))
    rnd = random.Random(4)
    with srv:
        tok = add_producer(url, admin, "bench", "b/")
        preload(url, tok, n_keys)
        h0, b0, k0 = ack_histogram(url, "bench"), batch_metrics(url), commit_metrics(url)
        # The tail past the window is CPU time on a shared machine (the commit, the loop
        # answering ~1,000 writers at once, this client reading them): say how loaded it was.
        load0 = os.getloadavg()[0]
        res = asyncio.run(
            open_loop(
                url,
                rate,
                seconds,
                lambda i: req(
                    "PUT", f"/v1/kv/b/{rnd.randrange(n_keys):012d}", f"{i:0100d}".encode(), tok
                ),
                conns=conns,
            )
        )
        # The server's own view (request received -> ack sent), free of this client's lag
        # when 1,000 answers arrive at once.
        res["server_p99_bucket_ms"] = server_p99_ms(h0, ack_histogram(url, "bench"))
        b1, k1 = batch_metrics(url), commit_metrics(url)
        n = k1[1] - k0[1]
        res["batches"] = int(n)
        res["mean_batch_ops"] = mean_batch(b0, b1)
        res["mean_commit_ms"] = round((k1[0] - k0[0]) / n * 1000, 2) if n else None
        res["load_avg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return {
        "window_ms": 500,
        "store_keys": n_keys,
        **res,
        "p99_minus_window_ms": round(res["p99_ms"] - 500, 2),
    }


def preload(url: str, tok: str, n_keys: int) -> None:
    """Fill the store with `n_keys` keys in ascending order, 1,000 per batch request."""
    it = iter(range(0, n_keys, 1000))

    def next_request() -> bytes | None:
        base = next(it, None)
        if base is None:
            return None
        keys = [f"b/{base + j:012d}" for j in range(min(1000, n_keys - base))]
        return req("POST", "/v1/batch", batch_body(keys), tok, "application/json")

    async def run() -> None:
        port = int(url.rsplit(":", 1)[1])
        cs = [await connect(port) for _ in range(BATCH_CONNS)]

        async def loop(c: Conn) -> None:
            while (raw := next_request()) is not None:
                await c.request(raw)

        await asyncio.gather(*(loop(c) for c in cs))
        for c in cs:
            c.transport.close()

    asyncio.run(run())


def bench_dup(tmp: Path, seconds: float, rate: float) -> dict[str, Any]:
    data = tmp / "dup"
    admin = init_root(data)
    srv, url = root_server(tmp, data, 500)
    keys = [f"b/{i:06d}" for i in range(1000)]
    conns = int(rate * 0.8) + 64
    out: dict[str, Any] = {"window_ms": 500, "keys": len(keys), "rate": rate}

    def disk_rate(p: subprocess.Popen[bytes], run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        w0, t0 = write_bytes(p.pid), time.perf_counter()
        res = run()
        time.sleep(0.6)  # the last window commits
        dt = time.perf_counter() - t0
        return {**res, "disk_bytes_per_s": round((write_bytes(p.pid) - w0) / dt)}

    with srv as p:
        tok = add_producer(url, admin, "bench", "b/")
        body = [req("PUT", f"/v1/kv/{k}", VALUE, tok) for k in keys]
        # Every key gets its value first (one batch), so that what follows is duplicates
        # only: a timed warm-up with the 500 ms window stored only a quarter of the keys,
        # and the "duplicate" phase then began with 744 real writes.
        first = httpx.post(
            url + "/v1/batch",
            content=batch_body(keys),
            headers={"Authorization": f"Bearer {tok}", "Content-Type": "application/json"},
            timeout=60,
        ).json()
        if first["written"] != len(keys):
            raise RuntimeError(f"first writes incomplete: {first}")
        time.sleep(1.0)

        def idle() -> dict[str, Any]:
            time.sleep(seconds)
            return {}

        out["idle"] = disk_rate(p, idle)
        out["duplicates"] = disk_rate(
            p,
            lambda: asyncio.run(
                open_loop(url, rate, seconds, lambda i: body[i % len(body)], conns)
            ),
        )
        out["duplicates"]["payload_bytes_per_s"] = round(rate * (len(VALUE) + 8))
        out["fresh_values"] = disk_rate(
            p,
            lambda: asyncio.run(
                open_loop(
                    url,
                    rate,
                    seconds,
                    lambda i: req(
                        "PUT", f"/v1/kv/{keys[i % len(keys)]}", f"{i:0100d}".encode(), tok
                    ),
                    conns,
                )
            ),
        )
    return out


def bench_fair(tmp: Path, seconds: float) -> dict[str, Any]:
    data = tmp / "fair"
    admin = init_root(data)
    srv, url = root_server(tmp, data, 500)
    quota = {"ops_per_s": 100, "burst": 100, "max_delay_ms": 1000}
    out: dict[str, Any] = {
        "window_ms": 500,
        "a_quota_ops_per_s": 100,
        "a_flood_per_s": 1000,
        "b_rate_per_s": 200,
    }
    rnd = random.Random(5)
    with srv as proc:
        a_tok = add_producer(url, admin, "a", "a/", quota=quota)
        b_tok = add_producer(url, admin, "b", "b/")

        def b_req(i: int) -> bytes:
            return req("PUT", f"/v1/kv/b/{rnd.getrandbits(32):08x}", VALUE, b_tok)

        def a_req(i: int) -> bytes:
            return req("PUT", f"/v1/kv/a/{rnd.getrandbits(32):08x}", VALUE, a_tok)

        c0, t0, h0 = cpu_seconds(proc.pid), time.perf_counter(), ack_histogram(url, "b")
        out["b_alone"] = asyncio.run(open_loop(url, 200, seconds, b_req, conns=200))
        out["b_alone"]["server_p99_bucket_ms"] = server_p99_ms(h0, ack_histogram(url, "b"))
        out["b_alone"]["server_cpu"] = round(
            (cpu_seconds(proc.pid) - c0) / (time.perf_counter() - t0), 3
        )

        async def both() -> tuple[dict[str, Any], dict[str, Any]]:
            a = asyncio.ensure_future(open_loop(url, 1000, seconds, a_req, conns=1200))
            await asyncio.sleep(0.5)
            b = await open_loop(url, 200, seconds - 0.5, b_req, conns=200)
            return b, await a

        if have_wrk():
            # A floods from its own process (wrk: 1,000 connections, each sending again
            # 600 ms after its answer; held answers take up to 1 s, refused ones a few ms:
            # at least 10x A's quota): this client measures only B.
            cmd = wrk_cmd(url, 1000, seconds + 1, "flood", a_tok, tmp, delay_ms=600)
            flood = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(1.0)
            c0, t0, h0 = cpu_seconds(proc.pid), time.perf_counter(), ack_histogram(url, "b")
            out["b_while_a_floods"] = asyncio.run(
                open_loop(url, 200, seconds - 0.5, b_req, conns=200)
            )
            out["b_while_a_floods"]["server_p99_bucket_ms"] = server_p99_ms(
                h0, ack_histogram(url, "b")
            )
            out["b_while_a_floods"]["server_cpu"] = round(
                (cpu_seconds(proc.pid) - c0) / (time.perf_counter() - t0), 3
            )
            so, se = flood.communicate(timeout=seconds + 120)
            out["a_flood"] = parse_wrk(subprocess.CompletedProcess(cmd, 0, so, se))
            out["a_flood"]["per_s_vs_quota"] = round(out["a_flood"]["per_s"] / 100, 1)
        else:
            out["b_while_a_floods"], out["a_flood"] = asyncio.run(both())
    out["b_p99_ratio"] = round(out["b_while_a_floods"]["p99_ms"] / out["b_alone"]["p99_ms"], 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve-noop", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--keys", type=int, default=1_000_000, help="store size for overwrites")
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of each measurement")
    ap.add_argument("--rate", type=float, default=2000.0, help="PUTs/s of the ack scenario")
    ap.add_argument("--quick", action="store_true", help="small store, short runs")
    ap.add_argument("--only", default="put,batch,ack,dup,fair")
    ap.add_argument(
        "--put-conns", type=int, default=256, help="connections of the single-PUT scenario"
    )
    ap.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="pass --switch-interval-ms to every root (default: the root's own default)",
    )
    ap.add_argument("noop_kind", nargs="?", default="fastapi", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_noop:
        serve_noop(args.serve_noop, args.noop_kind)
        return 0
    if args.switch_interval_ms is not None:
        ROOT_ARGS.extend(["--switch-interval-ms", str(args.switch_interval_ms)])
    uvloop.install()
    if args.quick:
        args.keys, args.seconds = min(args.keys, 100_000), min(args.seconds, 3.0)
    only = set(args.only.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="mercury-bench-gw-"))
    result: dict[str, Any] = {
        "bench": "gateway_write",
        "cpus": os.cpu_count(),
        "seconds": args.seconds,
        "rounds": ROUNDS,
        "client": "wrk -t1" if have_wrk() else "asyncio (this process)",
        "root_args": ROOT_ARGS,
    }
    try:
        if "put" in only:
            result["put"] = bench_put(tmp, args.seconds, args.put_conns)
        if "batch" in only:
            result["batch"] = bench_batch(tmp, args.seconds, args.keys)
        if "ack" in only:
            result["ack"] = bench_ack(tmp, args.seconds, args.keys, args.rate)
        if "dup" in only:
            result["dup"] = bench_dup(tmp, args.seconds, args.rate)
        if "fair" in only:
            result["fair"] = bench_fair(tmp, args.seconds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
