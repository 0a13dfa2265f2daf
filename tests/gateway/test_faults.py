"""Crash safety of the write path: SIGKILL the root while producers write."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from store.check import check
from store.store import Store
from testkit.procs import Procs, run_mercury
from testkit.wait import wait_until


def test_sigkill_mid_batch_loses_no_acked_write(root_factory: Any, procs: Procs) -> None:
    root = root_factory(window_ms=50)
    name, tok = root.producer()
    acked: list[tuple[bytes, bytes, int]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        with httpx.Client(
            base_url=root.url, timeout=10, headers={"Authorization": f"Bearer {tok}"}
        ) as c:
            for i in range(2000):  # bounded; the kill ends it much earlier
                if stop.is_set():
                    return
                key, value = f"{name}/w{w}/{i % 50}", f"{w}-{i}".encode()
                try:
                    if i % 7 == 3:
                        ops = [
                            {"op": "set", "key": f"{key}/b{j}", "value": f"{i}"} for j in range(5)
                        ]
                        r = c.post("/v1/batch", json={"ops": ops})
                        if r.status_code == 200:
                            with lock:
                                acked.extend(
                                    (f"{key}/b{j}".encode(), f"{i}".encode(), w) for j in range(5)
                                )
                        continue
                    r = c.put(f"/v1/kv/{key}", content=value)
                except httpx.HTTPError:
                    return
                if r.status_code == 200:
                    with lock:
                        acked.append((key.encode(), value, w))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    # Kill mid-stream once the writers have many answers (a fixed pause may pass before
    # they have any on a loaded machine). The eight writers never pause, so writes are in
    # flight (in the open batch, being committed, being answered) whenever the kill lands.
    wait_until(lambda: len(acked) > 50, 60, "more than 50 acknowledged writes")
    procs.kill(root.proc)
    stop.set()
    for t in threads:
        t.join(15)
    assert len(acked) > 50, "the writers should have been acknowledged many times"
    # the last acknowledged value of each key must be there (a later unacked write may
    # have landed too: each writer owns its keys, so only that writer's later values count)
    last: dict[bytes, bytes] = {}
    order: dict[bytes, list[bytes]] = {}
    for key, value, _w in acked:
        last[key] = value
        order.setdefault(key, []).append(value)
    with Store.open(str(root.data_dir)) as s:
        for key, value in last.items():
            got = s.get(key)
            assert got is not None, f"acked key {key!r} lost"
            assert got.value == value or got.value not in order[key][:-1], (key, got.value)
        report = check(s)
        assert report.ok, report.problems
    v = run_mercury("verify", str(root.data_dir))
    assert v.returncode == 0, v.stdout + v.stderr
    # and the root starts again on the same store
    root.close_clients()
    root.start()
    assert root.client().get("/v1/status").json()["seq"] >= 1
