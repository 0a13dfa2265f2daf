"""The non-leader HTTP face of a candidate, over a real socket: status, its own metrics, 307
with the body drained first (no reset before the answer), 503 with leader_url null during
an election."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from mercury.ha_front import Front
from tests.support.procs import free_port


def test_standby_redirects_and_electing_refuses() -> None:
    port = free_port()
    state: dict[str, Any] = {"role": "standby", "url": "http://leader:8080"}

    def status() -> tuple[str, int | None, str | None, dict[str, object]]:
        return state["role"], 7, state["url"], {"seq": 42}

    async def scenario() -> None:
        front = Front("127.0.0.1", port, status, metrics=lambda: ("text/plain", b"node_metric 1\n"))
        await front.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                r = await c.get("/v1/status")
                assert r.json() == {
                    "role": "standby",
                    "term": 7,
                    "leader_url": "http://leader:8080",
                    "seq": 42,
                }
                # this node's own metrics, not the leader's (a scraper follows redirects)
                r = await c.get("/metrics")
                assert (r.status_code, r.text) == (200, "node_metric 1\n")
                assert r.headers["content-type"] == "text/plain"
                r = await c.put("/v1/kv/a/b?async=true", content=b"x" * 100_000)
                assert r.status_code == 307
                assert r.headers["location"] == "http://leader:8080/v1/kv/a/b?async=true"
                state.update(role="electing", url=None)
                r = await c.post("/v1/batch", content=b"{}")
                assert r.status_code == 503
                assert r.headers["content-type"] == "application/problem+json"
                assert r.headers["retry-after"] == "1"
                doc = r.json()
                assert doc["leader_url"] is None and doc["type"].endswith("/no-leader")
        finally:
            await front.stop()

    asyncio.run(scenario())
