"""The non-leader HTTP face of a candidate, over a real socket: status, its own metrics, 307
with the body drained first (no reset before the answer), 503 with leader_url null during
an election."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ha import front as ha_front
from ha.front import Forwarder, Front
from testkit.procs import Procs, free_port
from testkit.wait import wait_until
from tests.gateway.conftest import make_root


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
                # every node's health shape, saying this one takes no writes
                r = await c.get("/healthz")
                assert r.status_code == 200
                assert r.json() == {
                    "status": "ok",
                    "role": "standby",
                    "seq": 42,
                    "term": 7,
                    "leader_url": "http://leader:8080",
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
            await front.close()  # the listening socket is held until close

    asyncio.run(scenario())


def _exchange(port: int, data: bytes, *, then: bytes = b"") -> bytes:
    """Send `data` (then `then`, after a pause) on a raw socket; the whole reply."""
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.settimeout(15)
        s.sendall(data)
        if then:
            # Deliberate: the rest of the body comes late, so the front has the head and
            # part of the body when it answers (the case under test). A rest that still
            # arrives in time only makes it easier; it cannot fail it.
            time.sleep(0.2)
            with contextlib.suppress(OSError):  # the answer may already be on its way
                s.sendall(then)
        reply = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                reply += chunk
    return reply


def test_refusals_are_answered_and_large_bodies_do_not_reset_the_307(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each refusal was a silent close or a reset: a malformed line, a head over the
    limit, a body over 1 MiB (its 307 lost to the reset); and a target that is not a
    path made the Location name another host (an open redirect)."""
    port = free_port()
    monkeypatch.setattr(ha_front, "MAX_CONNECTIONS", 2)

    def status() -> tuple[str, int | None, str | None, dict[str, object]]:
        return "standby", 7, "http://127.0.0.1:1", {}

    done = threading.Event()
    started = threading.Event()
    fronts: list[Front] = []

    def serve() -> None:
        async def main() -> None:
            front = Front("127.0.0.1", port, status)
            await front.start()
            fronts.append(front)
            started.set()
            await asyncio.to_thread(done.wait)
            await front.stop()
            await front.close()

        asyncio.run(main())

    t = threading.Thread(target=serve)
    t.start()
    try:
        assert started.wait(10)
        # at the connection cap, held by sockets that send nothing (first: no earlier
        # exchange still lingers): the newcomer is served in the slot of the one waiting
        # longest for its head (red team: reopened as they were closed, such sockets had
        # every newcomer answered 503 for as long as they went on)
        held = [socket.create_connection(("127.0.0.1", port), 10) for _ in range(2)]
        try:
            wait_until(lambda: len(fronts[0]._conns) == 2, 10, "both connections accepted")
            reply = _exchange(port, b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
            held[0].settimeout(5)
            try:
                evicted = held[0].recv(1) == b""  # the oldest
            except ConnectionResetError:
                evicted = True
            assert evicted
            held[1].setblocking(False)
            with pytest.raises(BlockingIOError):
                held[1].recv(1)  # still open
        finally:
            for h in held:
                h.close()
        # a value of 3 MiB: the 307 arrives whole, not a reset
        body = b"x" * (3 << 20)
        head = f"PUT /v1/kv/a/b HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        reply = _exchange(port, head.encode() + body[:65536], then=body[65536:])
        assert reply.startswith(b"HTTP/1.1 307"), reply[:200]
        assert b"Location: http://127.0.0.1:1/v1/kv/a/b\r\n" in reply
        # a target that is not a path: 400, and no Location at all
        reply = _exchange(port, b"GET @evil.example/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 400") and b"Location" not in reply, reply[:300]
        reply = _exchange(port, b"GARBAGE\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
        for size in (20 << 10, 100 << 10):  # past the limit; past the stream's buffer too
            big = b"GET /x HTTP/1.1\r\nX-Pad: " + b"p" * size + b"\r\n\r\n"
            reply = _exchange(port, big)
            assert reply.startswith(b"HTTP/1.1 431"), (size, reply[:200])
    finally:
        done.set()
        t.join(30)


def test_forwarding_front_passes_writes_to_a_real_root_and_refuses_honestly(
    tmp_path: Path, procs: Procs
) -> None:
    """`--ha-forward`'s front before a real root: a write comes back with the root's own
    answer (Expect: 100-continue answered, not waited out); a leader that refuses
    connections is a 503 + Retry-After; reads keep the 307."""
    root = make_root(procs, tmp_path / "root")
    name, token = root.producer()
    port = free_port()
    state: dict[str, Any] = {"url": root.url}

    def status() -> tuple[str, int | None, str | None, dict[str, object]]:
        return "standby", 3, state["url"], {}

    async def scenario() -> None:
        front = Front("127.0.0.1", port, status, forward=Forwarder("n1"))
        await front.start()
        h = {"Authorization": f"Bearer {token}", "Idempotency-Key": "f-1"}
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
                r = await c.put(f"/v1/kv/{name}/a", content=b"1", headers=h)
                assert (r.status_code, r.json()["status"]) == (200, "written"), r.text
                again = await c.put(f"/v1/kv/{name}/a", content=b"1", headers=h)
                assert again.headers.get("idempotent-replayed") == "true"
                r = await c.get(f"/v1/kv/{name}/a", headers=h)
                assert (r.status_code, r.headers["location"]) == (307, f"{root.url}/v1/kv/{name}/a")
                state["url"] = f"http://127.0.0.1:{free_port()}"  # a leader gone meanwhile
                r = await c.put(f"/v1/kv/{name}/b", content=b"2", headers=h)
                assert (r.status_code, r.headers.get("retry-after")) == (503, "1"), r.text
                assert "unreachable" in r.json()["detail"]
            # curl's way with a body: the head, then the body only after 100 Continue (a
            # blocking socket: in a thread, this loop serves the front).
            state["url"] = root.url
            answer = await asyncio.to_thread(raw_put, f"/v1/kv/{name}/c", token, port)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
        finally:
            await front.stop()
            await front.close()

    try:
        asyncio.run(scenario())
        assert root.client(token).get(f"/v1/kv/{name}/c").content == b"3"
        assert root.client(token).get(f"/v1/kv/{name}/b").status_code == 404
    finally:
        root.close_clients()


def raw_put(path: str, token: str, port: int) -> bytes:
    """PUT one byte as curl does with `Expect: 100-continue`; the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
            "\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"3")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer
