"""ha.etcd against a real etcd: leases, the create-if-absent campaign, resign."""

from __future__ import annotations

import asyncio

from ha.etcd import Etcd as EtcdClient
from testkit.etcd import Etcd


def test_campaign_lease_and_resign(etcd: Etcd) -> None:
    async def scenario() -> None:
        c = EtcdClient(["http://127.0.0.1:1", etcd.url])  # a dead endpoint first: skipped
        try:
            la, ttl = await c.grant(2)
            lb, _ = await c.grant(2)
            assert ttl == 2
            won, kv = await c.create(b"/k", b"a", la)
            assert won and kv is not None
            term = kv.create_revision
            lost, holder = await c.create(b"/k", b"b", lb)
            assert not lost and holder is not None
            assert (holder.value, holder.create_revision, holder.lease) == (b"a", term, la)
            assert await c.keepalive(la) == 2
            assert not await c.delete_if(b"/k", term + 100)  # not ours: untouched
            assert await c.delete_if(b"/k", term)
            assert await c.get(b"/k") is None
            won, kv = await c.create(b"/k", b"b", lb)
            assert won and kv is not None and kv.create_revision > term  # terms only grow
            await c.revoke(lb)  # the key goes with its lease
            assert await c.get(b"/k") is None
            assert await c.keepalive(lb) == 0
        finally:
            await c.close()

    asyncio.run(scenario())
