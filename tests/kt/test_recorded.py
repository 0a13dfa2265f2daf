"""The recorded ktserver replication stream (tests/data/kt/stream.bin): parsed on every run,
and replayed by a fake master to a real `mercury kt-bridge` writing to a real root, with a
SIGKILL midway that must cost neither a gap nor a write applied twice."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from kt import ulog as kt_ulog
from mercury.cmd_kt_bridge import METRICS_MAX_CONNECTIONS
from testkit import metrics
from testkit.procs import Procs, free_port
from testkit.wait import wait_until
from tests.client.conftest import Cluster
from tests.kt.conftest import producer_token_file
from tests.kt.recorder import SCRIPT, ReplayMaster, load

STREAM = Path(__file__).resolve().parents[1] / "data" / "kt" / "stream.bin"


def changes() -> list[kt_ulog.Change]:
    out = [kt_ulog.decode(e) for e in load(STREAM)]
    return [c for c in out if c is not None]


def test_recorded_stream_is_the_script() -> None:
    got = changes()
    want = [(p, a) for p, a in SCRIPT]
    assert len(got) == len(want) == 14
    ts = [c.ts for c in got]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)  # a cursor: unique, increasing
    for c, (proc, params) in zip(got, want, strict=True):
        assert c.sid == 1
        assert c.dbid == int(params.get("DB", "0"))
        assert c.kind == proc
        assert c.key == params.get("key", "").encode()
        if proc == "set":
            assert c.value == params["value"].encode()
            assert (c.xt == kt_ulog.XT_NONE) == ("xt" not in params)
    # an expiry is an absolute time in seconds, about now + xt when recorded
    xt = next(c for c in got if c.key == b"cfg/xt")
    assert abs(xt.xt - (xt.ts // 10**9 + 3600)) < 5


def final_state(prefix: bytes) -> dict[bytes, bytes]:
    """What database 0 holds after the stream, keys under `prefix`."""
    state: dict[bytes, bytes] = {}
    for c in changes():
        if c.dbid != 0:
            continue
        k = prefix + c.key
        if c.kind == "set":
            state[k] = c.value
        elif c.kind == "remove":
            state.pop(k, None)
        elif c.kind == "clear":
            state.clear()
    return state


def _changes(c: Cluster, producer: str) -> int:
    """Keys `producer` wrote or deleted, from the root's durable usage counters. Not the
    global seq: the log also carries the root's own documents (usage series at a minute's
    end, ACL changes), so seq deltas are not a producer's writes."""
    r = httpx.get(
        f"{c.root.url}/v1/usage/{producer}",
        headers={"Authorization": f"Bearer {c.root.admin_token}"},
        timeout=5,
    )
    r.raise_for_status()
    u = r.json()
    return int(u["writes"]) + int(u["deletes"])


def _wait_state(path: Path, ts: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    def reached() -> bool:
        if path.exists():
            doc = json.loads(path.read_text())
            if doc["ts"] >= ts and doc["pending"] is None:
                return True
        assert proc.poll() is None, "kt-bridge exited"
        return False

    wait_until(reached, timeout, f"the bridge's cursor at ts {ts}")


def _under(c: Cluster, prefix: bytes) -> dict[bytes, bytes]:
    c.caught_up()
    r = httpx.get(
        f"{c.read_url}/v1/range", params={"prefix": prefix.decode(), "limit": 1000}, timeout=10
    )
    assert r.status_code == 200, r.text
    return {it["key"].encode(): it["value"].encode() for it in r.json()["items"]}


def _bridge(
    procs: Procs, c: Cluster, port: int, token: Path, state: Path, prefix: str, *extra: str
) -> subprocess.Popen[bytes]:
    return procs.start_mercury(
        "kt-bridge",
        "--kt",
        f"127.0.0.1:{port}",
        "--url",
        c.root.url,
        "--read-url",
        c.read_url,
        "--token-file",
        str(token),
        "--state",
        str(state),
        "--prefix",
        prefix,
        "--window-ms",
        "10000",
        "--batch-ops",
        "3",
        *extra,
        name="kt-bridge",
    )


def _run_until(
    procs: Procs, c: Cluster, master: ReplayMaster, token: Path, state: Path, prefix: str
) -> None:
    p = _bridge(procs, c, master.port, token, state, prefix)
    _wait_state(state, changes()[-1].ts, p)
    procs.terminate(p)


def test_bridge_resumes_after_sigkill_without_gap_or_double_write(
    kt_cluster: tuple[Cluster, Procs], tmp_path: Path
) -> None:
    """Batches are cut by count only (3 changes; a 10 s window; a clear flushes first), so
    a run killed midway must end with the same state AND the same number of changes (the
    producer's writes and deletes) as an uninterrupted run: no change lost, none applied in
    a different cut. (That a replayed batch is answered rather than re-applied is proven
    below, where it would show.)"""
    c, procs = kt_cluster
    entries = load(STREAM)

    # uninterrupted
    name1, token1 = producer_token_file(c, tmp_path, "kt1/")
    master = ReplayMaster(entries)
    try:
        _run_until(procs, c, master, token1, tmp_path / "s1.state", "kt1/")
        assert _under(c, b"kt1/") == final_state(b"kt1/")
        changes_uninterrupted = _changes(c, name1)
        assert master.hellos == [(0, 65535)]
    finally:
        master.close()

    # killed as soon as a batch is in flight, then restarted
    name2, token2 = producer_token_file(c, tmp_path, "kt2/")
    master = ReplayMaster(entries, pace=0.03)
    try:
        state = tmp_path / "s2.state"
        p = _bridge(procs, c, master.port, token2, state, "kt2/")
        wait_until(
            lambda: state.exists() and json.loads(state.read_text())["pending"] is not None,
            60,
            "a batch pending in the bridge's state",
            interval=0.001,
        )
        # Deliberate, not a synchronisation: the kill lands somewhere in the batch's flight
        # (before the root got it, while it commits, or after the answer), and every one of
        # those must end as the uninterrupted run did.
        time.sleep(0.02)
        procs.kill(p)
        killed_at = json.loads(state.read_text())
        _run_until(procs, c, master, token2, state, "kt2/")
        # the restarted bridge asked for the entries after its durable cursor
        assert master.hellos[-1] == (killed_at["ts"], 65535)
        assert _under(c, b"kt2/") == final_state(b"kt2/")
        assert _changes(c, name2) == changes_uninterrupted
    finally:
        master.close()


def test_a_refused_batch_stops_the_bridge_and_is_kept_pending(
    kt_cluster: tuple[Cluster, Procs], tmp_path: Path
) -> None:
    """Keys outside the producer's keyspaces: the bridge exits 2 naming the refusal, with
    the batch still pending in its state (nothing skipped), and nothing was written."""
    c, procs = kt_cluster
    _, token = producer_token_file(c, tmp_path, "kt3/")
    master = ReplayMaster(load(STREAM))
    try:
        state = tmp_path / "s3.state"
        p = _bridge(procs, c, master.port, token, state, "elsewhere/")
        assert p.wait(60) == 2
        assert "refused" in procs.logs()
        doc = json.loads(state.read_text())
        assert doc["ts"] == 0 and doc["pending"] is not None
        assert _under(c, b"elsewhere/") == {}
    finally:
        master.close()


def test_a_replayed_batch_is_answered_not_reapplied(
    kt_cluster: tuple[Cluster, Procs], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge dies right after the root acknowledged its first batch, before moving its
    cursor; meanwhile someone overwrites a key of that batch. The restarted bridge sends
    the same batch with the same Idempotency-Key: the root answers it from its record and
    does NOT write the batch's older values over the newer one (sent again without the key,
    `cfg/a=3` would overwrite it and count one more write)."""
    c, procs = kt_cluster
    entries = load(STREAM)

    name1, token1 = producer_token_file(c, tmp_path, "kt4/")
    master = ReplayMaster(entries)
    try:
        _run_until(procs, c, master, token1, tmp_path / "s4.state", "kt4/")
        changes_uninterrupted = _changes(c, name1)
    finally:
        master.close()

    name2, token2 = producer_token_file(c, tmp_path, "kt5/")
    master = ReplayMaster(entries)
    try:
        state = tmp_path / "s5.state"
        with monkeypatch.context() as m:
            m.setenv("MERCURY_FAILPOINTS", "kt_bridge.acked=kill")
            p = _bridge(procs, c, master.port, token2, state, "kt5/")
        p.wait(60)
        doc = json.loads(state.read_text())
        assert doc["ts"] == 0 and doc["pending"] is not None  # acknowledged, not recorded
        h = {"Authorization": f"Bearer {token2.read_text().strip()}"}
        r = httpx.put(f"{c.root.url}/v1/kv/kt5/cfg/a", content=b"operator", headers=h, timeout=10)
        assert r.status_code == 200, r.text
        assert _under(c, b"kt5/")[b"kt5/cfg/a"] == b"operator"
        _run_until(procs, c, master, token2, state, "kt5/")
        assert _under(c, b"kt5/") == final_state(b"kt5/")
        # the operator's write is the only extra change: the replay wrote nothing
        assert _changes(c, name2) == changes_uninterrupted + 1
        assert "1 replayed requests" in procs.logs()
    finally:
        master.close()


def test_bridge_metrics_show_when_it_last_heard_its_master(
    kt_cluster: tuple[Cluster, Procs], tmp_path: Path
) -> None:
    """`--metrics-listen`: what the "KT bridge stopped" alert watches (deploy/prometheus)."""
    c, procs = kt_cluster
    _, token = producer_token_file(c, tmp_path, "ktm/")
    master = ReplayMaster(load(STREAM))
    port = free_port()
    started = time.time()
    try:
        p = _bridge(
            procs, c, master.port, token, tmp_path / "m.state", "ktm/",
            "--metrics-listen", f"127.0.0.1:{port}",
        )  # fmt: skip

        def heard() -> float | None:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            got = metrics.unlabelled(text).get("mercury_kt_bridge_last_contact_timestamp_seconds")
            return got if got is not None and got >= started else None

        wait_until(
            heard, 30, "the bridge's metrics showing its last contact", ignore=(httpx.HTTPError,)
        )
        # The scrape endpoint is a listener like the nodes' (`net.http_bounds`): sockets that
        # never send a request beyond its cap are evicted, and a scrape is still answered.
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(96)]
        try:
            wait_until(heard, 30, "a scrape answered over the idle sockets")

            def evicted() -> int:
                n = 0
                for s in idle:
                    s.setblocking(False)
                    try:
                        n += s.recv(1) == b""
                    except BlockingIOError:
                        pass
                    except OSError:
                        n += 1
                return n

            assert wait_until(lambda: evicted() >= 96 - METRICS_MAX_CONNECTIONS, 30, "evictions")
        finally:
            for s in idle:
                s.close()
        assert procs.terminate(p) == 0
    finally:
        master.close()
