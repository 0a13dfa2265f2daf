"""The SDK against a real root and replica: every call, typed errors, retries that honour
Retry-After, and a write retried after a cut connection that is applied once."""

from __future__ import annotations

import asyncio
import time

import pytest

from mercury_client import (
    AsyncClient,
    Client,
    Forbidden,
    PreconditionFailed,
    QuotaExceeded,
    RetryPolicy,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from tests.client.conftest import Cluster
from tests.faults.proxy import FaultProxy, Faults


def _usage(c: Cluster, producer: str) -> dict[str, int]:
    r = c.root.admin().get(f"/v1/usage/{producer}")
    assert r.status_code == 200, r.text
    doc: dict[str, int] = r.json()
    return doc


def test_put_get_delete_batch_range(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    p = f"{name}/"
    with Client(cluster.root.url, token, read_url=cluster.read_url, batch_ops=1000) as c:
        w = c.put(p + "a", "1")
        assert (w.status, w.replayed) == ("written", False) and w.seq > 0
        assert c.put(p + "a", b"1").status == "duplicate"
        odd = p.encode() + b"\xff/?%"
        assert c.put(odd, b"\x00\xfe").status == "written"
        r = c.batch([("set", f"{p}b{i:04d}", f"v{i}") for i in range(2500)] + [("delete", p + "a")])
        assert (r.written, r.deleted, r.requests) == (2500, 1, 3)
        assert c.delete(p + "nothing").status == "absent"
        cluster.caught_up()
        assert c.get(p + "b0007") == b"v7"
        assert c.get(odd) == b"\x00\xfe"
        assert c.get(p + "a") is None
        items = list(c.range(p, page_size=700))
        assert [i.key for i in items] == sorted(
            [f"{p}b{i:04d}".encode() for i in range(2500)] + [odd]
        )
        assert items[0].value == b"v0"
        streamed = list(c.range(p, stream=True, keys_only=True))
        assert [i.key for i in streamed] == [i.key for i in items]
        assert all(i.value is None for i in streamed)
        part = list(c.range(start=f"{p}b0100", end=f"{p}b0200"))
        assert len(part) == 100 and part[0].key == f"{p}b0100".encode()
    # the root answers producer reads of its own keys too
    with Client(cluster.root.url, token) as c:
        assert c.get(p + "b0001") == b"v1"


def test_keys_that_are_dot_segments_are_keys_like_any_other(cluster: Cluster) -> None:
    # `..` as a path segment is resolved away by HTTP clients: the SDK escapes it
    _name, token = cluster.root.producer(keyspaces=["."])
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        for key in (".", "..", "..."):
            assert c.put(key, key.encode()).status == "written", key
        cluster.caught_up()
        for key in (".", "..", "..."):
            assert c.get(key) == key.encode(), key
        with Client(cluster.root.url, token) as root_reads:
            assert root_reads.get("..") == b".."
        assert c.delete("..").status == "deleted"
        cluster.caught_up()
        assert c.get("..") is None and c.get(".") == b"."


def test_async_client_does_the_same(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    p = f"{name}/"

    async def run() -> None:
        async with AsyncClient(cluster.root.url, token, read_url=cluster.read_url) as c:
            assert (await c.put(p + "x", "1")).status == "written"
            r = await c.batch([("set", f"{p}y{i}", "v") for i in range(30)])
            assert r.written == 30
            assert (await c.delete(p + "x")).status == "deleted"
            await asyncio.to_thread(cluster.caught_up)
            assert await c.get(p + "y3") == b"v"
            assert await c.get(p + "x") is None
            keys = [i.key async for i in c.range(p, page_size=7)]
            assert len(keys) == 30
            keys2 = [i.key async for i in c.range(p, stream=True)]
            assert keys2 == keys
            with pytest.raises(Forbidden):
                await c.put("elsewhere/k", "v")

    asyncio.run(run())


def test_refusals_are_typed_and_carry_the_problem(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    with Client(cluster.root.url, token) as c:
        with pytest.raises(Forbidden) as forbidden:
            c.put("not-mine/k", "v")
        assert forbidden.value.status == 403 and forbidden.value.title == "Forbidden"
        assert forbidden.value.body["keyspaces"] == [f"{name}/"]
        with pytest.raises(TooLarge) as large:
            c.put(f"{name}/" + "k" * 600, "v")
        assert "500 bytes" in large.value.detail
    with Client(cluster.root.url, "not-a-token") as c, pytest.raises(Unauthorized):
        c.put(f"{name}/k", "v")
    # A token as read from its file (a trailing newline) works; one with a space inside
    # is refused before any request (it was sent, and failed as unavailable after retries).
    with Client(cluster.root.url, token + "\n") as c:
        assert c.put(f"{name}/nl", "v").status in ("written", "duplicate")
        with pytest.raises(TypeError, match="not int"):
            c.put(f"{name}/n", 3)  # type: ignore[arg-type]  # bytes(3) is 3 zero bytes
    with pytest.raises(ValueError, match="whitespace"):
        Client(cluster.root.url, "mct_a b")


def test_a_batch_over_the_node_limit_is_recut_after_413(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    # The client is told to send 15,000 ops in one request; the gateway admits 10,000 per
    # request and answers 413; the client re-cuts the batch and every op lands once.
    with Client(cluster.root.url, token, batch_ops=15_000) as c:
        r = c.batch([("set", f"{name}/k{i}", "v") for i in range(15_000)])
    assert r.written == 15_000 and r.requests >= 2
    assert _usage(cluster, name)["writes"] == 15_000


def test_429_is_retried_after_the_servers_retry_after(cluster: Cluster) -> None:
    name, token = cluster.root.producer(quota={"ops_per_s": 1, "burst": 1, "max_delay_ms": 0})
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        time.sleep(s)  # deliberate: the SDK really waits out the Retry-After

    with Client(cluster.root.url, token, sleep=sleep) as c:
        c.put(f"{name}/a", "1")
        t0 = time.monotonic()
        assert c.put(f"{name}/b", "2").status == "written"
        elapsed = time.monotonic() - t0
    assert waits, "the second write was not throttled"
    assert all(w >= 1.0 for w in waits), waits  # Retry-After: 1 (seconds), never less
    assert elapsed >= 1.0
    # with no retry left the refusal surfaces, carrying the advice
    with Client(cluster.root.url, token, retries=1) as c:
        with pytest.raises(QuotaExceeded) as err:
            for i in range(3):
                c.put(f"{name}/d{i}", "x")
        assert err.value.retry_after is not None and err.value.retry_after >= 1
        assert "retry-after" in err.value.headers


def test_a_write_retried_after_a_cut_connection_is_applied_once(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    port = int(cluster.root.url.rsplit(":", 1)[1])
    # The first connection is cut after the first byte of the answer: the root has
    # committed the batch, the client saw no answer and retries on a new connection, which
    # the proxy forwards untouched (faults are switched while the client backs off).
    proxy = FaultProxy(port, Faults(raw=True, cut_after=1))

    def heal(_wait: float) -> None:
        proxy.faults = Faults(raw=True)

    try:
        with Client(f"http://127.0.0.1:{proxy.port}", token, retries=3, sleep=heal) as c:
            r = c.batch([("set", f"{name}/k{i}", f"v{i}") for i in range(50)])
        assert proxy.injected.get("cut") == 1 and proxy.connections == 2
        assert (r.written, r.replayed) == (50, 1), r  # the first answer, replayed
        u = _usage(cluster, name)
        assert (u["writes"], u["duplicates"]) == (50, 0)
    finally:
        proxy.close()


def test_without_idempotency_a_cut_write_is_not_retried(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    port = int(cluster.root.url.rsplit(":", 1)[1])
    proxy = FaultProxy(port, Faults(raw=True, cut_after=1))
    try:
        with (
            Client(f"http://127.0.0.1:{proxy.port}", token, idempotent=False) as c,
            pytest.raises(Unavailable),
        ):
            c.put(f"{name}/k", "v")
        assert proxy.connections == 1  # it did not try again blindly
    finally:
        proxy.close()


def test_unreachable_node_is_unavailable_after_the_retries(cluster: Cluster) -> None:
    from testkit.procs import free_port

    slept: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"
    with (
        Client(url, "t", retries=RetryPolicy(attempts=3, base=0.01), sleep=slept.append) as c,
        pytest.raises(Unavailable) as gone,
    ):
        c.get("k")
    assert len(slept) == 2
    assert f"{url}/v1/kv/k" in str(gone.value)  # the URL that did not answer


def test_unusable_tls_options_are_refused_before_any_request() -> None:
    # (The SDK's TLS over a real socket, mutual TLS included, is tested in test_watch.py
    # and test_limits.py against a local HTTPS server.)
    with pytest.raises(OSError):
        Client("https://127.0.0.1:1", verify="/nonexistent/ca.pem")
    with pytest.raises(ValueError):
        Client("https://127.0.0.1:1", verify=False, cert="c.pem")


def test_conditional_writes(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    k = f"{name}/cas"
    with Client(cluster.root.url, token) as c:
        first = c.put(k, "1", if_absent=True)
        assert first.status == "written"
        with pytest.raises(PreconditionFailed) as err:
            c.put(k, "again", if_absent=True)
        assert err.value.status == 412
        second = c.put(k, "2", if_seq=first.seq)
        assert second.status == "written" and second.seq > first.seq
        with pytest.raises(PreconditionFailed) as stale:
            c.put(k, "3", if_seq=first.seq)
        assert stale.value.current_seq == second.seq
        with pytest.raises(PreconditionFailed):
            c.delete(k, if_seq=first.seq)
        v = c.get_with_seq(k)
        assert v is not None and (v.value, v.seq) == (b"2", second.seq)
        assert c.delete(k, if_seq=v.seq).status == "deleted"
        assert c.get_with_seq(k) is None
        assert c.get(k) is None


def test_async_write_retried_after_a_cut_connection_is_applied_once(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    port = int(cluster.root.url.rsplit(":", 1)[1])
    proxy = FaultProxy(port, Faults(raw=True, cut_after=1))

    async def heal(_wait: float) -> None:
        proxy.faults = Faults(raw=True)

    async def run() -> None:
        async with AsyncClient(f"http://127.0.0.1:{proxy.port}", token, sleep=heal) as c:
            w = await c.put(f"{name}/once", "v")
            assert (w.status, w.replayed) == ("written", True)

    try:
        asyncio.run(run())
        assert proxy.injected.get("cut") == 1
        u = _usage(cluster, name)
        assert (u["writes"], u["duplicates"]) == (1, 0)
    finally:
        proxy.close()


def test_get_many_from_the_replica(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    p = f"{name}/"
    odd_key, odd_value = p.encode() + b"\xfe", b"\xff\x00"
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        r = c.batch(
            [("set", f"{p}m{i}", f"v{i}") for i in range(12_000)]
            + [("set", odd_key, odd_value), ("set", p + "text-key", b"\x80")]
        )
        c.wait_applied(r.seq)
        want: list[str | bytes] = [f"{p}m{i}" for i in range(12_000)]
        want += [odd_key, p + "text-key", p + "none"]
        got = c.get_many(want)
    assert len(got) == 12_003
    assert got[f"{p}m11999".encode()] == b"v11999"
    assert got[odd_key] == odd_value and got[(p + "text-key").encode()] == b"\x80"
    assert got[(p + "none").encode()] is None

    async def run() -> dict[bytes, bytes | None]:
        async with AsyncClient(cluster.root.url, token, read_url=cluster.read_url) as ac:
            return await ac.get_many([f"{p}m1", odd_key])

    assert asyncio.run(run()) == {f"{p}m1".encode(): b"v1", odd_key: odd_value}
