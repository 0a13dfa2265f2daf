"""The invalidation stream and miss answers over real TCP: a `ReplicationSource` on a real
store (testkit's RootNode, its own loop) and a `CacheNode` on the test's loop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from cache.http import CacheApp
from cache.node import CacheNode, TooLarge
from cache.store import CacheStore
from net import certs
from net.tlsconf import TlsContexts, TlsFiles
from replicator.invalidation import (
    Fetch,
    Fetched,
    Invalidation,
    Item,
    decode_fetch,
    decode_fetched,
    decode_invalidate,
    encode_fetch,
    encode_fetched,
    encode_invalidate,
)
from replicator.tcp import TcpTransport
from store.ops import DELETE, EXPIRE, SET, Op
from testkit.replication import RootNode
from testkit.wait import wait_until_async


def test_codecs_round_trip() -> None:
    inv = Invalidation(5, 7, [(5, b"a"), (7, b"b" * 500)])
    assert decode_invalidate(encode_invalidate(inv)[10:]) == inv
    f = Fetch(3, 9, [b"x", b"y"])
    assert decode_fetch(encode_fetch(f)[10:]) == f
    a = Fetched(3, 0, 9, [Item(b"v", 4), Item(None, 0), Item(b"", 2)])
    assert decode_fetched(encode_fetched(a)[10:]) == a


def test_a_commit_reaches_the_cache_without_waiting_for_a_heartbeat(tmp_path: Path) -> None:
    # Heartbeats a minute apart: only the commit's wake-up can bring the invalidation
    # within the deadline (a stream woken by its heartbeat timer alone fails here).
    root = RootNode(str(tmp_path / "root"), heartbeat_ms=60_000)
    try:
        root.store.apply([Op(SET, b"a", b"one", owner="t")])
        asyncio.run(_follow(root, tmp_path))
    finally:
        root.close()


async def _follow(root: RootNode, tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path / "cache"), 1 << 20)
    node = CacheNode(store, 1 << 20, [("127.0.0.1", root.port)], TcpTransport(None))
    task = asyncio.get_running_loop().create_task(node.run())
    try:
        await wait_until_async(lambda: node.status()["connected"] is True, 20, "connected")
        (a,) = await node.get([b"a"])
        assert (a.value, a.served) == (b"one", "miss")
        (a,) = await node.get([b"a"])
        assert (a.value, a.served) == (b"one", "hit")
        (n,) = await node.get([b"none"])
        assert (n.value, n.served) == (None, "miss")
        seq = root.store.apply([Op(SET, b"a", b"two", owner="t")]).last_seq
        await wait_until_async(lambda: node.state.applied >= seq, 20, "invalidation applied")
        (a,) = await node.get([b"a"])
        assert (a.value, a.served) == (b"two", "miss")
        seq = root.store.apply([Op(DELETE, b"a", b"", owner="t")]).last_seq
        await wait_until_async(lambda: node.state.applied >= seq, 20, "delete applied")
        (a,) = await node.get([b"a"])
        assert (a.value, a.version) == (None, 0)
        assert node.counters.invalidations == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()


async def _asgi_get(app: CacheApp, path: str) -> tuple[int, dict[bytes, bytes]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode()}
    await app(scope | {"headers": []}, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"])


def test_max_lag_is_reported_and_refuse_when_lagging_refuses(tmp_path: Path) -> None:
    root = RootNode(str(tmp_path / "root"), heartbeat_ms=100)
    try:
        root.store.apply([Op(SET, b"a", b"one", owner="t")])
        asyncio.run(_lagging(root, tmp_path))
    finally:
        root.close()


async def _lagging(root: RootNode, tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path / "cache"), 1 << 20)
    node = CacheNode(store, 1 << 20, [("127.0.0.1", root.port)], TcpTransport(None), max_lag=0.5)
    app = CacheApp(node, refuse_when_lagging=True)
    # Nothing heard from the root yet: lagging, and reads refused with Retry-After.
    assert node.lagging() and node.status()["lagging"] is True
    status, headers = await _asgi_get(app, "/v1/kv/a")
    assert status == 503 and headers[b"retry-after"] == b"1"
    task = asyncio.get_running_loop().create_task(node.run())
    try:
        await wait_until_async(lambda: not node.lagging(), 20, "caught up")
        assert (await _asgi_get(app, "/v1/kv/a"))[0] == 200
        # The source stops: its heartbeats stop, the lag passes --max-lag.
        root.call(root.source.stop())
        await wait_until_async(node.lagging, 20, "lagging")
        assert (await _asgi_get(app, "/v1/kv/a"))[0] == 503
        lag = node.status()["lag_s"]
        assert isinstance(lag, float) and lag > 0.5
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()


def _issue(ca: trustme.CA, ca_file: Path, d: Path, name: str, role: str) -> TlsFiles:
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    made, made_key = certs.node_cert(name, role, [], ca_cert, ca_key)
    (d / f"{name}.crt").write_bytes(made.public_bytes(serialization.Encoding.PEM))
    (d / f"{name}.key").write_bytes(certs.key_pem(made_key))
    return TlsFiles(cert=str(d / f"{name}.crt"), key=str(d / f"{name}.key"), ca=str(ca_file))


def test_a_cache_follows_a_tls_source_with_its_certificate_only(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    root_files = _issue(ca, tmp_path / "ca.crt", tmp_path, "root", "root")
    cache_files = _issue(ca, tmp_path / "ca.crt", tmp_path, "cache", "replica")
    root = RootNode(str(tmp_path / "root"), tls=TlsContexts(root_files))
    try:
        root.store.apply([Op(SET, b"a", b"one", owner="t")])
        asyncio.run(_over_tls(root, tmp_path, cache_files))
    finally:
        root.close()


async def _over_tls(root: RootNode, tmp_path: Path, files: TlsFiles) -> None:
    # Without a certificate the source never says a word to it; with one, it follows.
    refused: list[str] = []
    root.source.on_refused = refused.append
    for name, transport in (
        ("plain", TcpTransport(None)),
        ("tls", TcpTransport(TlsContexts(files))),
    ):
        store = CacheStore(str(tmp_path / name), 1 << 20)
        node = CacheNode(store, 1 << 20, [("127.0.0.1", root.port)], transport)
        task = asyncio.get_running_loop().create_task(node.run())
        try:
            if name == "plain":
                await wait_until_async(lambda: bool(refused), 20, "refused")
                assert node.status()["connected"] is False
            else:
                await wait_until_async(lambda: node.status()["connected"] is True, 20, "connected")  # noqa: B023
                (a,) = await node.get([b"a"])
                assert a.value == b"one"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            store.close()


def test_a_restart_past_the_sources_history_drops_what_it_held(tmp_path: Path) -> None:
    root = RootNode(str(tmp_path / "root"))
    try:
        root.store.apply([Op(SET, b"a", b"one", owner="t")])
        asyncio.run(_held_then_stale(root, tmp_path, first=True))
        # While the cache is down, `a` changes and the log no longer holds that change.
        root.store.apply([Op(SET, b"a", b"two", owner="t")])
        for i in range(5):
            root.store.apply([Op(SET, b"x%d" % i, b"x", owner="t")])
        assert root.store.gc_log(keep_entries=1) > 0
        asyncio.run(_held_then_stale(root, tmp_path, first=False))
    finally:
        root.close()


async def _held_then_stale(root: RootNode, tmp_path: Path, *, first: bool) -> None:
    store = CacheStore(str(tmp_path / "cache"), 1 << 20)
    node = CacheNode(store, 1 << 20, [("127.0.0.1", root.port)], TcpTransport(None))
    if not first:
        assert b"a" in node.state.held  # warm: what it held is back
    task = asyncio.get_running_loop().create_task(node.run())
    try:
        await wait_until_async(lambda: node.status()["connected"] is True, 20, "connected")
        (a,) = await node.get([b"a"])
        # The source refused to stream the history it lost: the cache started over at its
        # head, dropping `a`'s old value rather than serving it.
        assert a.value == (b"one" if first else b"two")
        assert a.served == "miss"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()


def test_the_protected_segment_survives_a_clean_restart(tmp_path: Path) -> None:
    root = RootNode(str(tmp_path / "root"))
    try:
        root.store.apply([Op(SET, b"hot", b"h", owner="t"), Op(SET, b"once", b"o", owner="t")])
        asyncio.run(_read_hot_and_once(root, tmp_path))
    finally:
        root.close()
    store = CacheStore(str(tmp_path / "cache"), 1 << 20)
    node = CacheNode(store, 1 << 20, [], TcpTransport(None))
    try:
        # Read twice before the stop: protected again, so a scan cannot push it out first.
        assert node.state.policy.protected(b"hot")
        assert not node.state.policy.protected(b"once") and b"once" in node.state.held
    finally:
        store.close()


async def _read_hot_and_once(root: RootNode, tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path / "cache"), 1 << 20)
    node = CacheNode(store, 1 << 20, [("127.0.0.1", root.port)], TcpTransport(None))
    task = asyncio.get_running_loop().create_task(node.run())
    try:
        await wait_until_async(lambda: node.status()["connected"] is True, 20, "connected")
        await node.get([b"hot", b"once"])
        await node.get([b"hot"])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        node.close()


def test_large_values_come_in_several_answers_and_a_read_is_bounded(tmp_path: Path) -> None:
    root = RootNode(str(tmp_path / "root"))
    try:
        big = [Op(SET, b"big%02d" % i, bytes([i]) * (3 << 20), owner="t") for i in range(23)]
        for i in range(0, len(big), 4):
            root.store.apply(big[i : i + 4])
        asyncio.run(_large(root, tmp_path))
    finally:
        root.close()


async def _large(root: RootNode, tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path / "cache"), 64 << 20)
    node = CacheNode(store, 64 << 20, [("127.0.0.1", root.port)], TcpTransport(None))
    task = asyncio.get_running_loop().create_task(node.run())
    try:
        await wait_until_async(lambda: node.status()["connected"] is True, 20, "connected")
        # 8 values of 3 MiB: more than one answer carries (16 MiB), all of them served.
        keys = [b"big%02d" % i for i in range(8)]
        got = await node.get(keys)
        assert [a.value for a in got] == [bytes([i]) * (3 << 20) for i in range(8)]
        assert node.fetches >= 2
        # 23 of them (69 MiB) are more than one read may be answered with.
        with pytest.raises(TooLarge):
            await node.get([b"big%02d" % i for i in range(23)])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()


def test_an_expiry_invalidates_like_a_delete(tmp_path: Path) -> None:
    root = RootNode(str(tmp_path / "root"))
    try:
        far = (int(time.time()) + 3600) * 1_000_000
        seq = root.store.apply([Op(SET, b"e", b"v1", owner="t", deadline=far)]).last_seq
        asyncio.run(_expiring(root, tmp_path, seq))
    finally:
        root.close()


async def _expiring(root: RootNode, tmp_path: Path, set_seq: int) -> None:
    store = CacheStore(str(tmp_path / "cache"), 1 << 20)
    node = CacheNode(store, 1 << 20, [("127.0.0.1", root.port)], TcpTransport(None))
    task = asyncio.get_running_loop().create_task(node.run())
    try:
        await wait_until_async(lambda: node.status()["connected"] is True, 20, "connected")
        assert [a.value for a in await node.get([b"e"])] == [b"v1"]
        assert (await node.get([b"e"]))[0].served == "hit"
        # What the root's expirer logs once the deadline passes: an EXPIRE entry.
        out = root.store.apply([Op(EXPIRE, b"e", b"", owner="t", expect_seq=set_seq)])
        await wait_until_async(lambda: node.state.applied >= out.last_seq, 20, "expiry applied")
        (a,) = await node.get([b"e"])
        assert (a.value, a.served) == (None, "miss")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
