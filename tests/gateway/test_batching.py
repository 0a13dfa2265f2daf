"""Batching, coalescing, idempotency and quota isolation against a real root."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from store.store import Store
from testkit import metrics
from testkit.procs import Procs
from testkit.wait import wait_until
from tests.gateway.conftest import Root, logged_since


def _seq(root: Root) -> int:
    return int(root.client().get("/v1/status").json()["seq"])


def test_writes_to_one_key_in_one_window_coalesce(root_factory: Any) -> None:
    root = root_factory(window_ms=400)
    name, tok = root.producer()
    before = _seq(root)

    # Connected beforehand and sent together, so the 8 PUTs meet in a window (connecting
    # inside the threads spread them by more than a window on a loaded machine).
    clients = [httpx.Client(base_url=root.url, timeout=30) for _ in range(8)]
    for c in clients:
        assert c.get("/healthz").status_code == 200
    go = threading.Barrier(8)

    def put(i: int) -> httpx.Response:
        go.wait(timeout=30)
        return clients[i].put(
            f"/v1/kv/{name}/hot",
            content=f"v{i}".encode(),
            headers={"Authorization": f"Bearer {tok}"},
        )

    try:
        with ThreadPoolExecutor(8) as ex:
            answers = list(ex.map(put, range(8)))
    finally:
        for c in clients:
            c.close()
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    # a write replaced inside its window by a later one says so (it was never stored on
    # its own), at the seq of the write that replaced it
    docs = [a.json() for a in answers]
    written = {d["seq"] for d in docs if d["status"] == "written"}
    assert all(d["status"] in ("written", "superseded") for d in docs), docs
    assert any(d["status"] == "superseded" for d in docs), docs  # some did coalesce
    assert all(d["seq"] in written for d in docs if d["status"] == "superseded"), docs
    after = _seq(root)
    # every request answered; far fewer log entries than requests (one per window)
    assert after - before < 8
    final = root.client(tok).get(f"/v1/kv/{name}/hot")
    assert final.headers["etag"] == f'"{after}"'


def test_idempotency_key_applies_once_and_replays_first_answer(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    h = {"Idempotency-Key": "retry-1"}
    first = c.post(
        "/v1/batch", json={"ops": [{"op": "set", "key": f"{name}/i", "value": "1"}]}, headers=h
    )
    assert first.status_code == 200
    seq = _seq(shared_root)
    again = c.post(
        "/v1/batch", json={"ops": [{"op": "set", "key": f"{name}/i", "value": "1"}]}, headers=h
    )
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    # the key reused with another body is refused (422), never answered as the first
    other_body = c.post(
        "/v1/batch", json={"ops": [{"op": "set", "key": f"{name}/i", "value": "2"}]}, headers=h
    )
    assert other_body.status_code == 422
    mine = [k for _, k in logged_since(shared_root, seq) if name.encode() in k]
    assert mine == [] and c.get(f"/v1/kv/{name}/i").content == b"1"  # nothing re-applied
    # another producer's identical key is its own
    other, tok2 = shared_root.producer()
    r = shared_root.client(tok2).put(f"/v1/kv/{other}/i", content=b"x", headers=h)
    assert "idempotent-replayed" not in r.headers


def test_concurrent_retries_with_one_idempotency_key_apply_once(root_factory: Any) -> None:
    """Retries that arrive while the first is still in its batch (a 1.5 s window, all
    six sent together over open connections) wait for its answer: none is stored yet,
    so only the request in flight can tell them apart from new writes."""
    root = root_factory(window_ms=1500)
    name, tok = root.producer()
    before = _seq(root)
    clients = [root.client(tok) for _ in range(6)]
    for c in clients:
        assert c.get("/healthz").status_code == 200
    go = threading.Barrier(6)

    def put(i: int) -> httpx.Response:
        go.wait(timeout=30)
        r: httpx.Response = clients[i].put(
            f"/v1/kv/{name}/c",
            content=b"same body",  # retries of one request
            headers={"Idempotency-Key": "k"},
        )
        return r

    with ThreadPoolExecutor(6) as ex:
        answers = list(ex.map(put, range(6)))
    assert len({a.text for a in answers}) == 1
    assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 5
    # One change, then its logged answer (format 5: op-3 under NUL ++ its storage key).
    logged = logged_since(root, before)
    assert [k for _, k in logged if k == f"{name}/c".encode()] == [f"{name}/c".encode()]
    assert len([k for _, k in logged if k.startswith(b"\x00")]) == 1, logged


def test_idempotent_answer_survives_restart(root: Root) -> None:
    name, tok = root.producer()
    h = {"Idempotency-Key": "durable"}
    first = root.client(tok).put(f"/v1/kv/{name}/d", content=b"1", headers=h).json()
    root.procs.terminate(root.proc)
    root.close_clients()
    root.start()
    again = root.client(tok).put(f"/v1/kv/{name}/d", content=b"1", headers=h)
    assert again.json() == first and again.headers["idempotent-replayed"] == "true"


def test_held_producer_does_not_block_another(shared_root: Root) -> None:
    """A floods far over its quota (one op a second): its requests are held for 1, 2, 3
    and 4 s (the 6th is refused). B, unthrottled, is acknowledged while A's longest holds
    are still held: a hold is a sleep of the held request only, never of the batch or of
    the event loop (either would keep B waiting behind A's holds)."""
    quota = {"ops_per_s": 1, "burst": 1, "max_delay_ms": 4000}
    a_name, a_tok = shared_root.producer(quota=quota)
    b_name, b_tok = shared_root.producer()
    a_done: list[int] = []
    # The 6 requests must reach the gateway together: one arriving 1 s after the first
    # needs 1 s less hold, and the 6th would then fit under 4 s. So each flood thread has
    # its connection open beforehand and they all send at once (on a loaded machine,
    # creating clients and connecting inside the threads spread them by more than that).
    a_clients = [httpx.Client(base_url=shared_root.url, timeout=30) for _ in range(6)]
    for c in a_clients:
        assert c.get("/healthz").status_code == 200
    go = threading.Barrier(6)

    def flood(i: int) -> None:
        go.wait(timeout=30)
        r = a_clients[i].put(
            f"/v1/kv/{a_name}/f{i}", content=b"x", headers={"Authorization": f"Bearer {a_tok}"}
        )
        a_done.append(r.status_code)

    def over_quota() -> bool:
        text = shared_root.client().get("/metrics").text
        held = metrics.value(text, "mercury_quota_ops_total", producer=a_name, outcome="held")
        refused = metrics.value(text, "mercury_quota_ops_total", producer=a_name, outcome="refused")
        return held + refused >= 5

    try:
        b = shared_root.client(b_tok)
        assert b.put(f"/v1/kv/{b_name}/warm", content=b"v").status_code == 200  # connection open
        with ThreadPoolExecutor(6) as ex:
            for i in range(6):
                ex.submit(flood, i)
            # B writes only once A's five requests over the quota are in (held or refused).
            wait_until(over_quota, 30, "A's requests over its quota")
            statuses = [b.put(f"/v1/kv/{b_name}/k{i}", content=b"v").status_code for i in range(5)]
            a_done_when_b_finished = len(a_done)
        assert statuses == [200] * 5
        # A's requests held for 3 and 4 s were still held when B was done (at most the
        # admitted one, the refused one and the 1 and 2 s holds were answered): B's five
        # writes take one window and one commit each, tens of ms.
        assert a_done_when_b_finished <= 4, a_done_when_b_finished
        assert sorted(a_done) == [200] * 5 + [429]
    finally:
        for c in a_clients:
            c.close()


def test_sigterm_commits_and_acknowledges_the_open_batch(root_factory: Any, procs: Procs) -> None:
    root = root_factory(window_ms=1500)
    name, tok = root.producer()
    results: dict[int, int] = {}

    def put(i: int) -> None:
        with httpx.Client(base_url=root.url, timeout=30) as c:
            r = c.put(
                f"/v1/kv/{name}/t{i}", content=b"v", headers={"Authorization": f"Bearer {tok}"}
            )
            results[i] = r.status_code

    threads = [threading.Thread(target=put, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # SIGTERM only once all four requests sit in the open batch (the 1.5 s window keeps it
    # open): a fixed sleep raced the clients' connects on a loaded machine.
    wait_until(lambda: _waiting_requests(root.url) >= 4, 20, "the four PUTs in the open batch")
    # uvicorn re-raises SIGTERM after its graceful shutdown: exit by signal 15 is clean
    assert procs.terminate(root.proc) in (0, -15)
    for t in threads:
        t.join(30)
    assert results == {i: 200 for i in range(4)}, procs.logs()
    with Store.open(str(root.data_dir)) as s:
        assert all(s.get(f"{name}/t{i}".encode()) is not None for i in range(4))


def _waiting_requests(url: str) -> float:
    """The root's `mercury_batch_waiting_requests` gauge."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return metrics.value(text, "mercury_batch_waiting_requests")
