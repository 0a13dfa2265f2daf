"""A root SIGKILLed in the middle of an expiry wave, writers running, then restarted: no
acknowledged write is lost, every key whose deadline passed is expired exactly once (the
restarted root logs what the killed one had not), and the replica holds the same log at the
same seqs."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from store.format import OP_EXPIRE, OP_SET
from testkit.logged import seqs_since
from testkit.procs import Procs, free_port, run_mercury
from testkit.replication import status
from testkit.wait import wait_until
from tests.gateway.test_expiry import _producer, _root
from tests.replicator.nodes import start_replica

N_TTL = 2000
MAX_WRITES = 3000  # the writer's bound in count (and `stop` bounds it in time)


def _expired(data: Path) -> list[tuple[int, bytes]]:
    return [(seq, key) for seq, op, key in seqs_since(data, 0) if op == OP_EXPIRE]


def _writer(base: str, p: dict[str, str], acked: dict[str, str], stop: threading.Event) -> None:
    """PUT fresh keys one after another; a key goes in `acked` only once its write answered
    200. Errors while the root is down are expected: those writes were never acknowledged."""
    with httpx.Client(base_url=base, headers=p, timeout=5) as c:
        for i in range(MAX_WRITES):
            if stop.is_set():
                return
            key, value = f"cfg/w/{i}", f"v{i}"
            try:
                r = c.put(f"/v1/kv/{key}", content=value.encode())
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                acked[key] = value


def test_root_killed_during_an_expiry_wave(tmp_path: Path, procs: Procs) -> None:
    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    gw, repl = free_port(), free_port()
    root = _root(procs, data, gw, repl)
    base = f"http://127.0.0.1:{gw}"
    p = _producer(base, data)
    rep = start_replica(procs, tmp_path / "rep", [repl], repl=False, name="rep")

    # 2,000 keys whose deadlines are spread over 2-3 s (1 ms apart)
    for start in range(0, N_TTL, 500):
        ops = [
            {"op": "set", "key": f"cfg/t/{i}", "value": "t", "ttl": f"{2000 + i // 2}ms"}
            for i in range(start, start + 500)
        ]
        r = httpx.post(f"{base}/v1/batch", json={"ops": ops}, headers=p, timeout=30)
        assert r.status_code == 200, r.text

    acked: dict[str, str] = {}
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(base, p, acked, stop), daemon=True)
    writer.start()
    try:
        wait_until(lambda: _expired(data), 30, "the expiry wave to start on the root")
        procs.kill(root)  # SIGKILL mid-wave, the writer still writing
        before = len(_expired(data))
        root = _root(procs, data, gw, repl)
        wait_until(lambda: len(acked) > 0, 30, "a write acknowledged")
    finally:
        stop.set()
        writer.join(30)
    assert not writer.is_alive()

    wait_until(lambda: len(_expired(data)) >= N_TTL, 30, f"all expiries ({before} before kill)")
    expired = _expired(data)
    keys = [k for _, k in expired]
    assert sorted(keys) == sorted(f"cfg/t/{i}".encode() for i in range(N_TTL)), "once each"
    for i in (0, N_TTL - 1):
        assert httpx.get(f"{base}/v1/kv/cfg/t/{i}", headers=p).status_code == 404

    last = max(seq for seq, _, _ in seqs_since(data, 0))
    wait_until(lambda: status(rep.http)["seq"] >= last, 30, "the replica to catch up")
    on_root = [e for e in seqs_since(data, 0) if e[0] <= last]
    on_rep = [e for e in seqs_since(rep.data_dir, 0) if e[0] <= last]
    assert on_rep == on_root  # the same entries, expiries included, at the same seqs

    # every acknowledged write is in the root's log and its value is read where it is served
    # (get_bulk is a replica's read; its log is the root's, checked just above)
    logged = {k.decode() for _, op, k in on_root if op == OP_SET}
    assert not set(acked) - logged, "acknowledged writes lost on the root"
    names = sorted(acked)
    for start in range(0, len(names), 1000):
        chunk = names[start : start + 1000]
        url = f"http://127.0.0.1:{rep.http}/v1/get_bulk"
        got = httpx.post(url, json={"keys": chunk}, timeout=30).json()["values"]
        lost = [k for k in chunk if got.get(k) != acked[k]]
        assert not lost, f"acknowledged writes lost: {lost[:5]}"
