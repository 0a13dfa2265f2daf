"""A whole range streams as NDJSON with flat server memory (anonymous RSS sampled while the
client reads), for 100,000 keys here and 1,000,000 keys under `make bench`."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from store.ops import SET, Op
from store.store import Store
from testkit import procstat
from testkit.procs import Procs
from tests.reads.conftest import StartReads


def _rss_anon_kb(pid: int) -> int:
    return procstat.anon_rss_bytes(pid) // 1024


def _fill(store: Store, n: int, value: bytes) -> None:
    for b in range(0, n, 50_000):
        store.apply([Op(SET, b"r/%08d" % i, value, "t") for i in range(b, min(n, b + 50_000))])


def _run(
    store: Store, start_reads: StartReads, procs_started: list[subprocess.Popen[bytes]], n: int
) -> None:
    value = b"x" * 200
    _fill(store, n, value)
    srv = start_reads(role="consumer")
    pid = procs_started[-1].pid
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        c.get("/v1/range", params={"prefix": "r/", "limit": "1000"})  # warm up the code paths
        before = _rss_anon_kb(pid)
        peak = before
        count = 0
        size = 0
        with c.stream(
            "GET", "/v1/range", params={"prefix": "r/"}, headers={"Accept": "application/x-ndjson"}
        ) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                count += 1
                size += len(line) + 1
                if count % 5000 == 0:
                    peak = max(peak, _rss_anon_kb(pid))
                    assert json.loads(line)["key"] == f"r/{count - 1:08d}"
    assert count == n
    growth_kb = peak - before
    # Buffering the answer would cost at least its size; the stream holds one chunk.
    assert growth_kb * 1024 < size / 4, (growth_kb, size)
    assert growth_kb < 16 * 1024, growth_kb
    print(f"streamed {count} items, {size} bytes; server anon RSS growth {growth_kb} kB")


@pytest.fixture
def started(procs: Procs) -> list[subprocess.Popen[bytes]]:
    """The processes the test started (the read server is the last one)."""
    return procs.started


def test_ndjson_stream_of_100k_keys_keeps_server_memory_flat(
    store: Store, start_reads: StartReads, started: list[subprocess.Popen[bytes]]
) -> None:
    _run(store, start_reads, started, 100_000)


@pytest.mark.bench
def test_ndjson_stream_of_1m_keys_keeps_server_memory_flat(
    store: Store, start_reads: StartReads, started: list[subprocess.Popen[bytes]]
) -> None:
    _run(store, start_reads, started, 1_000_000)
