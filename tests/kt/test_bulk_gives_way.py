"""A big KT `get_bulk` on the root gives way to the gateway's commits (real root, real
sockets): while one runs, producers' writes keep being acknowledged — some before the
get_bulk's answer arrives — and its connection waited for commits in flight between its
slices (`mercury_listener_commit_waits_total{listener="kt"}`: the bulk work never holds
the GIL the committing thread needs; `core/commitgate.py`). No timing is asserted: the
figures are `bench/kt_bulk_writes.py`'s."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from testkit import metrics
from testkit.procs import Procs, free_port
from tests.gateway.conftest import Root, make_root

KEYS = 50_000
#: get_bulk calls tried at most until one overlapped a commit at a slice boundary (each
#: takes hundreds of slices while writes commit back to back: the first one does).
ATTEMPTS = 5


@pytest.fixture(scope="module")
def kt_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Root, int, str]]:
    tmp = tmp_path_factory.mktemp("ktbulk")
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    kt = free_port()
    try:
        root = make_root(procs, tmp / "data", "--kt-listen", f"127.0.0.1:{kt}")
        _, token = root.producer(["b/"])
        c = root.client(token)
        for start in range(0, KEYS, 1000):
            ops = [
                {"op": "set", "key": f"b/k{i:07d}", "value": f"v{i}"}
                for i in range(start, start + 1000)
            ]
            r = c.post("/v1/batch", json={"ops": ops})
            assert r.status_code == 200, r.text
        yield root, kt, token
        root.close_clients()
    finally:
        procs.stop_all()


def _waits(root: Root) -> float:
    text = httpx.get(f"{root.url}/metrics", timeout=10).text
    return metrics.value(text, "mercury_listener_commit_waits_total", listener="kt")


def _write(
    url: str,
    token: str,
    n: int,
    done: threading.Event,
    acked_during: list[int],
    failures: list[str],
) -> None:
    """PUT keys one at a time until `done`; note those acknowledged before it was set."""
    with httpx.Client(base_url=url, timeout=30) as c:
        h = {"Authorization": f"Bearer {token}"}
        i = 0
        while not done.is_set() and i < 10_000:  # bounded in count
            r = c.put(f"/v1/kv/b/w{n}-{i}", content=b"x", headers=h)
            if r.status_code != 200:
                failures.append(r.text)
                return
            if not done.is_set():
                acked_during.append(i)
            i += 1


def test_writes_are_acknowledged_while_a_big_get_bulk_runs(
    kt_root: tuple[Root, int, str],
) -> None:
    root, kt, token = kt_root
    body = b"".join(b"_b/k%07d\t\n" % i for i in range(KEYS))
    before = _waits(root)
    for attempt in range(ATTEMPTS):
        done = threading.Event()
        acked_during: list[int] = []
        failures: list[str] = []

        writer = threading.Thread(
            target=_write, args=(root.url, token, attempt, done, acked_during, failures)
        )
        writer.start()
        try:
            r = httpx.post(
                f"http://127.0.0.1:{kt}/rpc/get_bulk",
                content=body,
                headers={"Content-Type": "text/tab-separated-values"},
                timeout=120,
            )
        finally:
            done.set()
            writer.join(60)
        assert not failures, failures
        assert r.status_code == 200
        assert r.text.count("\n") == KEYS + 1  # every key, and `num`
        # Acknowledged while the get_bulk was being served, not after it.
        assert acked_during, "no write acknowledged before the get_bulk answered"
        if _waits(root) > before:
            return  # the get_bulk's slices waited for commits in flight
    pytest.fail(f"{ATTEMPTS} get_bulk calls beside back-to-back commits never waited for one")
