"""`watch` over a real socket with mutual TLS: changes in order, a dropped stream resumed
from the last seq without repeating a change, 410 as `Gone`, and `mercury kv watch` with
--ca/--cert/--key. The server is `watch_server.WatchApp`, which can drop a stream on
purpose; `tests/reads/test_watch.py` runs the SDK and the CLI against a real replica."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mercury_client import AsyncClient, Change, Client, Gone, Unavailable
from testkit.procs import REPO, mercury_cmd
from testkit.wait import wait_until
from tests.client.watch_server import Pki, Served, WatchApp, make_pki

EXPECTED = [
    Change(1, "set", b"w/a", b"1"),
    Change(2, "set", b"w/b", b"2"),
    Change(2, "set", b"w/c", b"3"),
    Change(2, "delete", b"w/a", None),
    Change(4, "set", b"w/\xff", b"\xfe"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def served(pki: Pki) -> Iterator[tuple[Served, WatchApp]]:
    app = WatchApp()
    s = Served(app, pki)
    try:
        yield s, app
    finally:
        s.stop()


def _client(url: str, pki: Pki) -> Client:
    return Client(url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)))


def test_watch_resumes_after_a_drop_without_repeating(
    served: tuple[Served, WatchApp], pki: Pki
) -> None:
    s, app = served
    with _client(s.url, pki) as c:
        got = list(itertools.islice(c.watch("w/"), len(EXPECTED)))
    assert got == EXPECTED
    # from now (the node's first heartbeat: seq 0); dropped after 3 changes (the middle
    # of seq 2): asked again from seq 2
    assert app.asked == [None, 2]


def test_async_watch_resumes_too(served: tuple[Served, WatchApp], pki: Pki) -> None:
    s, app = served

    async def run() -> list[Change]:
        out: list[Change] = []
        async with AsyncClient(
            s.url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key))
        ) as c:
            async for ch in c.watch("w/"):
                out.append(ch)
                if len(out) == len(EXPECTED):
                    break
        return out

    assert asyncio.run(run()) == EXPECTED
    assert app.asked == [None, 2]


def test_watch_from_now_dropped_before_any_change_resumes_after_the_heartbeat(
    served: tuple[Served, WatchApp], pki: Pki
) -> None:
    s, app = served
    app.now, app.drop_after = 1, 0  # "now" is seq 1; the stream drops after its heartbeat
    with _client(s.url, pki) as c:
        got = list(itertools.islice(c.watch("w/"), len(EXPECTED) - 1))
    # asked again from seq 2, not "from now" (which would skip what came in between)
    assert app.asked == [None, 2]
    assert got == EXPECTED[1:]


def test_watch_from_a_collected_seq_is_gone(served: tuple[Served, WatchApp], pki: Pki) -> None:
    s, app = served
    app.oldest = 10
    with _client(s.url, pki) as c, pytest.raises(Gone) as err:
        next(c.watch("w/", from_seq=3))
    assert err.value.status == 410 and "collected" in err.value.detail


def test_cli_watch_from_a_collected_seq_says_how_to_recover(
    served: tuple[Served, WatchApp], pki: Pki
) -> None:
    s, app = served
    app.oldest = 10
    argv = ["kv", "watch", "w/", "--from-seq", "3", "--read-url", s.url, "--ca", str(pki.ca)]
    argv += ["--cert", str(pki.client_cert), "--key", str(pki.client_key)]
    r = subprocess.run(mercury_cmd(*argv), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 4, r.stderr  # refused: the same request will never succeed
    assert "collected" in r.stderr and "mercury kv export" in r.stderr


def test_mutual_tls_refuses_a_client_without_certificate(
    served: tuple[Served, WatchApp], pki: Pki
) -> None:
    s, _app = served
    with (
        Client(s.url, verify=str(pki.ca), retries=1) as c,
        pytest.raises(Unavailable),
    ):
        next(c.watch("w/"))
    with Client(s.url, retries=1) as c, pytest.raises(Unavailable):  # unknown CA
        next(c.watch("w/"))


def test_cli_watch_prints_json_lines_over_mutual_tls(
    served: tuple[Served, WatchApp], pki: Pki, tmp_path: Path
) -> None:
    s, _app = served
    out = tmp_path / "watch.out"
    argv = ["kv", "watch", "w/", "--read-url", s.url, "--ca", str(pki.ca)]
    argv += ["--cert", str(pki.client_cert), "--key", str(pki.client_key)]
    with out.open("wb") as f, (tmp_path / "watch.err").open("wb") as err:
        p = subprocess.Popen(mercury_cmd(*argv), stdout=f, stderr=err, cwd=REPO)
        try:
            # after the changes the server streams heartbeats, then ends; the CLI would
            # reconnect and go on: stop it by its PID once the lines are there
            wait_until(
                lambda: p.poll() is not None or len(out.read_bytes().splitlines()) >= len(EXPECTED),
                30,
                "the CLI's lines",
            )
        finally:
            p.terminate()
            p.wait(10)
    lines = [json.loads(x) for x in out.read_bytes().splitlines()]
    assert lines[: len(EXPECTED)] == [
        {"seq": 1, "op": "set", "key": "w/a", "value": "1"},
        {"seq": 2, "op": "set", "key": "w/b", "value": "2"},
        {"seq": 2, "op": "set", "key": "w/c", "value": "3"},
        {"seq": 2, "op": "delete", "key": "w/a"},
        {"seq": 4, "op": "set", "key_b64": "dy//", "value_b64": "/g=="},
    ]
