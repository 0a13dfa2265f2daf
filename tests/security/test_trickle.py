"""The red team's trickled-body attack, reproduced against real processes: connections
that send a request head and then a body byte every half second, reconnecting whenever
they are closed, as many as the connection cap and more — with one producer's token on
the root's writes, and with no credentials on a replica's get_bulk and its memcached
listener. Meanwhile a well-behaved client keeps working: its requests succeed, the
trickled bodies are cut for their rate (`slow_body`) and the good client's connections
take the trickles' slots. The caps are set low by flag so each test takes seconds; the
full-size attack with its latency and memory figures is `bench/hostile.py`.

Every loop bounded in count and time.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit import metrics
from testkit.procs import Procs, free_port, wait_http
from testkit.replication import RootNode, wait_seq
from testkit.trickle import Trickler, post_head, put_head
from testkit.wait import wait_until
from tests.gateway.conftest import Root, make_root

CAP = 40  # --http-max-connections / --listener-max-connections
GRACE = "1"  # --http-body-grace / --listener-body-grace-s
GOOD = 100  # the well-behaved client's requests under attack


def _closed(c: httpx.Client, *reasons: str) -> float:
    """Connections the HTTP listener's budget closed for any of `reasons`."""
    text = c.get("/metrics").text
    return sum(
        metrics.value(text, "mercury_budget_closed_total", budget="http", reason=r) for r in reasons
    )


def _good_share(results: list[bool]) -> float:
    return sum(results) / len(results)


@pytest.fixture
def root(tmp_path: Path, procs: Procs) -> Iterator[Root]:
    r = make_root(
        procs,
        tmp_path / "data",
        "--http-max-connections",
        str(CAP),
        "--http-body-grace",
        GRACE,
    )
    yield r
    r.close_clients()


def test_a_producer_trickling_bodies_on_every_slot_cannot_stop_another_producers_writes(
    root: Root,
) -> None:
    hostile_name, hostile = root.producer()
    name, tok = root.producer()
    metrics_client = root.client()
    _host, port = root.url.removeprefix("http://").split(":")
    t = Trickler(int(port), put_head(f"/v1/kv/{hostile_name}/x", hostile), conns=CAP + 10)
    t.start()
    try:
        # The attack holds the cap (every slot it can get, reconnecting as it is cut).
        wait_until(lambda: t.opened >= CAP, 20, "the trickler holds the cap")
        good = root.client(tok)
        results = []
        for i in range(GOOD):
            try:
                r = good.put(f"/v1/kv/{name}/k{i}", content=b"v%d" % i)
                results.append(r.status_code == 200)
            except httpx.HTTPError:
                results.append(False)
        assert _good_share(results) >= 0.99, results
        # The trickled bodies made room: displaced for the good producer (the hostile
        # token holds over its share) or for the trickler's own reconnections.
        wait_until(lambda: t.closed >= CAP, 30, "trickled bodies cut")
        assert _closed(metrics_client, "share") >= 1
        assert _closed(metrics_client, "share", "evicted", "slow_body") >= CAP
    finally:
        t.stop()
    # Once the attack stops, the writes it held are nowhere: the good ones all are.
    assert good.get(f"/v1/kv/{name}/k{GOOD - 1}").content == b"v%d" % (GOOD - 1)


def test_a_trickled_body_is_answered_408_problem_json_and_closed(root: Root) -> None:
    name, tok = root.producer()
    host, port = root.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(put_head(f"/v1/kv/{name}/k", tok, length=1000) + b"x")
        s.settimeout(10)
        got = b""
        while True:  # one byte only: cut after the grace for its rate
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), got[:300]
    assert b"application/problem+json" in head
    doc = json.loads(body)
    assert doc["status"] == 408 and "bytes/s" in doc["detail"]
    assert "--http-min-body-rate" in doc["hint"]


@pytest.fixture
def source(tmp_path: Path) -> Iterator[RootNode]:
    root = RootNode(str(tmp_path / "root"))
    try:
        root.write(50)
        yield root
    finally:
        root.close()


def _replica(tmp_path: Path, procs: Procs, source: RootNode) -> tuple[int, int]:
    port, mc = free_port(), free_port()
    args = ["replica", str(tmp_path / "replica"), "--listen", f"127.0.0.1:{port}"]
    args += ["--source", f"127.0.0.1:{source.port}", "--no-sync"]
    args += ["--memcached-listen", f"127.0.0.1:{mc}"]
    args += ["--http-max-connections", str(CAP), "--http-body-grace", GRACE]
    args += ["--listener-max-connections", str(CAP), "--listener-body-grace-s", GRACE]
    p = procs.start_mercury(*args, name="replica")
    wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=p)
    wait_seq(port, source.store.last_seq())
    return port, mc


def test_trickled_get_bulks_without_credentials_cannot_stop_a_readers_get_bulks(
    tmp_path: Path, procs: Procs, source: RootNode
) -> None:
    port, _mc = _replica(tmp_path, procs, source)
    t = Trickler(port, post_head("/v1/get_bulk", None), conns=CAP + 10)
    t.start()
    try:
        wait_until(lambda: t.opened >= CAP, 20, "the trickler holds the cap")
        results = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            for _ in range(GOOD):
                try:
                    r = c.post("/v1/get_bulk", json={"keys": ["k00000007", "k00000008"]})
                    results.append(r.status_code == 200 and "k00000007" in r.text)
                except httpx.HTTPError:
                    results.append(False)
            assert _good_share(results) >= 0.99, results
            wait_until(lambda: t.closed >= CAP, 30, "trickled bodies cut")
            assert _closed(c, "evicted", "slow_body") >= CAP
    finally:
        t.stop()


def test_a_trickled_memcached_set_is_cut_for_its_rate_while_another_client_is_served(
    tmp_path: Path, procs: Procs, source: RootNode
) -> None:
    port, mc = _replica(tmp_path, procs, source)
    # A storage command announcing 100,000 bytes of data, sent a byte every half second,
    # on half the cap (at the full cap its reconnections would evict its own first).
    t = Trickler(mc, b"set k 0 0 100000\r\n", conns=CAP // 2)
    t.start()
    try:
        wait_until(lambda: t.opened >= CAP // 2, 20, "the trickler's connections open")
        ok = 0
        for _ in range(GOOD):
            try:
                with socket.create_connection(("127.0.0.1", mc), timeout=10) as s:
                    s.sendall(b"version\r\n")
                    ok += s.recv(100).startswith(b"VERSION")
            except OSError:
                pass
        assert ok >= 0.99 * GOOD
        wait_until(lambda: t.closed >= CAP // 2, 30, "trickled requests cut")
    finally:
        t.stop()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
        text = c.get("/metrics").text
    got = metrics.value(
        text, "mercury_listener_refused_total", listener="memcached", reason="slow_body"
    )
    assert got >= 1
