"""The SDK pointed at an HA candidate that does not lead (a real `ha_front.Front` on a real
socket) in front of a real root: a standby's 307 is followed to the leader with the same
request and token, never read as a value or a result; during an election the 503 is
retried; a redirect that would leave HTTPS is not followed; given several URLs, a dead,
electing or stale candidate moves the call on to the next at once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ha.front import Front
from mercury_client import AsyncClient, Client, RetryPolicy, Unavailable, calls
from testkit.procs import Procs, free_port, run_mercury
from tests.gateway.conftest import Root, make_root


class StandbyFront:
    """A non-leading candidate's HTTP face on its own loop thread; `role` and `leader`
    change what it answers."""

    def __init__(self, leader: str | None) -> None:
        self.port = free_port()
        self.leader = leader
        self.loop = asyncio.new_event_loop()
        self.front = Front("127.0.0.1", self.port, self._status)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def _status(self) -> tuple[str, int | None, str | None, dict[str, object]]:
        role = "standby" if self.leader is not None else "electing"
        return role, 2, self.leader, {"seq": 0}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.front.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.front.stop(), self.loop).result(10)
        # The front holds its listening socket until close (a leading root shares it).
        asyncio.run_coroutine_threadsafe(self.front.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def root(tmp_path: Path, procs: Procs) -> Iterator[Root]:
    r = make_root(procs, tmp_path / "root")
    yield r
    r.close_clients()


@pytest.fixture
def standby(root: Root) -> Iterator[StandbyFront]:
    f = StandbyFront(root.url)
    f.start()
    yield f
    f.stop()


def test_writes_and_reads_sent_to_a_standby_reach_the_leader(
    root: Root, standby: StandbyFront
) -> None:
    name, token = root.producer()
    with Client(standby.url, token) as c:
        w = c.put(f"{name}/a", b"1")
        assert (w.status, w.seq > 0) == ("written", True)
        assert c.put(f"{name}/a", b"1", idempotency_key="k1").status == "duplicate"
        assert c.get(f"{name}/a") == b"1"  # the value, not the standby's answer
        assert c.get(f"{name}/none") is None
        assert c.batch([("set", f"{name}/b", "2"), ("delete", f"{name}/a")]).written == 1
        assert c.delete(f"{name}/b").status == "deleted"
    assert root.client(token).get(f"/v1/kv/{name}/a").status_code == 404  # the leader did it

    async def same_with_async() -> None:
        async with AsyncClient(standby.url, token) as ac:
            assert (await ac.put(f"{name}/c", b"3")).status == "written"
            assert await ac.get(f"{name}/c") == b"3"

    asyncio.run(same_with_async())


def test_during_an_election_the_503_is_retried_then_unavailable(root: Root) -> None:
    name, token = root.producer()
    electing = StandbyFront(None)
    electing.start()
    try:
        fast = RetryPolicy(attempts=3, base=0.01, cap=0.05, max_wait=5)
        with Client(electing.url, token, retries=fast) as c:
            with pytest.raises(Unavailable) as err:
                c.get(f"{name}/a")
            assert err.value.status == 503
            # the leader is elected meanwhile: the next call reaches it
            electing.leader = root.url
            assert c.put(f"{name}/a", b"1").status == "written"
    finally:
        electing.stop()


def test_a_redirect_leaving_https_is_not_followed() -> None:
    def answer(location: str, url: str) -> httpx.Response:
        return httpx.Response(
            307, headers={"location": location}, request=httpx.Request("PUT", url)
        )

    assert calls.redirect(answer("http://b/v1/kv/k", "https://a/v1/kv/k")) is None
    assert calls.redirect(answer("https://b/v1/kv/k", "https://a/v1/kv/k")) == "https://b/v1/kv/k"
    assert calls.redirect(answer("/v1/kv/k", "http://a:1/x")) == "http://a:1/v1/kv/k"
    plain: Any = httpx.Response(
        302, headers={"location": "/x"}, request=httpx.Request("GET", "http://a/")
    )
    assert calls.redirect(plain) is None  # only 307/308 keep the method and body


def test_admin_commands_sent_to_a_standby_name_the_leader(
    root: Root, standby: StandbyFront, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(root.admin_token)
    for argv in (["usage"], ["acl", "token", "list", "someone"]):
        r = run_mercury(*argv, "--url", standby.url, "--admin-token-file", str(token_file))
        assert r.returncode != 0, r.stdout  # not the standby's answer printed as a report
        assert f"--url {root.url}" in r.stderr, r.stderr


def test_several_urls_skip_a_dead_one_an_electing_one_and_a_307_to_a_dead_leader(
    root: Root,
) -> None:
    """Every way an HA candidate can fail a call moves it on to the next URL at once, with
    no wait between (a wait comes only once every URL failed)."""
    name, token = root.producer()
    dead = f"http://127.0.0.1:{free_port()}"
    electing, stale = StandbyFront(None), StandbyFront(dead)  # stale: a 307 to a dead leader
    electing.start()
    stale.start()
    try:
        urls = [dead, electing.url, stale.url, root.url]
        slept: list[float] = []
        with Client(urls, token, sleep=slept.append) as c:
            assert c.put(f"{name}/a", b"1").status == "written"
            assert slept == []
            assert c._writes.base() == root.url  # kept: the next call goes there first
            assert c.get(f"{name}/a") == b"1"

        async def same_with_async() -> list[float]:
            waits: list[float] = []

            async def sleep(s: float) -> None:
                waits.append(s)

            async with AsyncClient(",".join(urls), token, sleep=sleep) as ac:
                assert (await ac.put(f"{name}/b", b"2")).status == "written"
            return waits

        assert asyncio.run(same_with_async()) == []
        # Every URL failing: one wait per round, and the call ends once its tries are spent.
        fast = RetryPolicy(attempts=2, base=0.01, cap=0.01)
        with (
            Client([dead, electing.url], token, retries=fast, sleep=slept.append) as c,
            pytest.raises(Unavailable),
        ):
            c.put(f"{name}/c", b"3")
        assert len(slept) == 1
    finally:
        electing.stop()
        stale.stop()
