"""The SDK tells a missing key from a wrong URL, deletes a prefix to its end, and sizes its
batches from what a 413 named (against a real root and replica)."""

from __future__ import annotations

import asyncio

import pytest

from mercury_client import AsyncClient, Client, NoSuchRoute, NotFound
from tests.client.conftest import Cluster


def test_a_wrong_base_url_raises_and_a_missing_key_is_none(cluster: Cluster) -> None:
    name, token = cluster.root.producer()
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        c.put(f"{name}/here", "1")
        cluster.caught_up()
        assert c.get(f"{name}/absent") is None
        assert c.get_with_seq(f"{name}/absent") is None
    # `/api` before `/v1`: the nodes answer no-such-route, which is never "absent"
    for url in (cluster.root.url, cluster.read_url):
        with Client(url + "/api", token, read_url=url + "/api") as c:
            with pytest.raises(NoSuchRoute) as err:
                c.get(f"{name}/here")
            assert not isinstance(err.value, NotFound) and "/api/v1/kv/" in err.value.detail

    async def aget() -> None:
        async with AsyncClient(cluster.root.url, token, read_url=cluster.read_url) as c:
            assert await c.get_with_seq(f"{name}/absent") is None
        async with AsyncClient(cluster.root.url, token, read_url=cluster.read_url + "/x") as c:
            with pytest.raises(NoSuchRoute):
                await c.get(f"{name}/here")

    asyncio.run(aget())


def test_delete_prefix_repeats_until_nothing_remains(cluster: Cluster) -> None:
    # A guard of 7 deletes per batch: the node deletes 7 a request and says `more`.
    name, token = cluster.root.producer()
    ks = f"{name}/"
    admin = cluster.root.admin()
    r = admin.put(
        f"/v1/admin/producers/{name}",
        json={"keyspaces": [ks], "guards": {ks: {"max_deletes_per_batch": 7}}},
    )
    assert r.status_code == 200, r.text
    with Client(cluster.root.url, token, read_url=cluster.read_url) as c:
        c.batch([("set", f"{ks}d/{i}", "v") for i in range(20)] + [("set", f"{ks}keep", "v")])
        r2 = c.delete_prefix(f"{ks}d/")
        assert r2.deleted == 20 and r2.requests >= 3
        cluster.caught_up()
        assert [i.key for i in c.range(ks)] == [f"{ks}keep".encode()]

    async def adel() -> int:
        async with AsyncClient(cluster.root.url, token) as c:
            return (await c.delete_prefix(f"{ks}keep")).deleted

    assert asyncio.run(adel()) == 1


def test_a_413_sizes_this_and_later_batches(cluster: Cluster) -> None:
    # burst + rate x max_delay = 30 + 3000 x 0 = 30 ops (refilled in 10 ms): the largest
    # request ever admitted
    name, token = cluster.root.producer(quota={"ops_per_s": 3000, "burst": 30, "max_delay_ms": 0})
    acked: list[int] = []
    with Client(cluster.root.url, token) as c:
        r = c.batch([("set", f"{name}/a{i}", "v") for i in range(90)], on_done=acked.append)
        assert r.written == 90 and acked == [30, 30, 30]
        assert c.batch_ops == 30  # remembered: the next batch is cut to it from the start
        acked.clear()
        c.batch([("set", f"{name}/b{i}", "v") for i in range(45)], on_done=acked.append)
        assert acked == [30, 15]
