"""Keys that expire, end to end with real processes: the root alone logs each expiry, so the
root and its replica remove a key at the same seq; a write without TTL clears a deadline;
a root killed before a deadline logs the expiry once restarted."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from subprocess import Popen

import httpx

from mercury_client import Client
from store.format import OP_EXPIRE
from testkit.logged import seqs_since
from testkit.procs import Procs, free_port, run_mercury, wait_http
from testkit.replication import status
from testkit.wait import wait_until
from tests.replicator.nodes import start_replica


def _root(procs: Procs, data: Path, gw: int, repl: int) -> Popen[bytes]:
    p = procs.start_mercury(
        "root",
        str(data),
        "--listen",
        f"127.0.0.1:{gw}",
        "--repl-listen",
        f"127.0.0.1:{repl}",
        "--batch-window-ms",
        "10",
        name="root",
    )
    wait_http(f"http://127.0.0.1:{gw}/healthz", proc=p)
    return p


def _producer(base: str, data: Path) -> dict[str, str]:
    admin = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
    httpx.put(f"{base}/v1/admin/producers/p", json={"keyspaces": ["cfg/"]}, headers=admin)
    token = httpx.post(f"{base}/v1/admin/producers/p/tokens", headers=admin).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def _expired(data: Path) -> list[tuple[int, bytes]]:
    return [(seq, key) for seq, op, key in seqs_since(data, 0) if op == OP_EXPIRE]


def test_keys_expire_on_root_and_replica_at_the_same_seq(tmp_path: Path, procs: Procs) -> None:
    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    gw, repl = free_port(), free_port()
    _root(procs, data, gw, repl)
    base = f"http://127.0.0.1:{gw}"
    p = _producer(base, data)
    rep = start_replica(procs, tmp_path / "rep", [repl], repl=False, name="rep")

    r = httpx.put(f"{base}/v1/kv/cfg/a?ttl=1s", content=b"a", headers=p)
    assert r.status_code == 200, r.text
    ops = [
        {"op": "set", "key": "cfg/b", "value": "b", "ttl": "2s"},
        {"op": "set", "key": "cfg/c", "value": "c", "ttl": 1},
        {"op": "set", "key": "cfg/d", "value": "d", "ttl": "1s"},
    ]
    assert httpx.post(f"{base}/v1/batch", json={"ops": ops}, headers=p).status_code == 200
    # c: the same value again without a TTL clears its deadline; d: a later deadline
    assert httpx.put(f"{base}/v1/kv/cfg/c", content=b"c", headers=p).json()["status"] == "written"
    last = httpx.put(f"{base}/v1/kv/cfg/d?ttl=1h", content=b"d", headers=p).json()["seq"]

    # (d: a deadline far enough to be read on both nodes before it passes)
    got = httpx.get(f"{base}/v1/kv/cfg/d", headers=p)
    assert got.status_code == 200 and "expires" in got.headers
    assert got.headers["x-mercury-expires-at"].endswith("Z")
    assert "expires" not in httpx.get(f"{base}/v1/kv/cfg/c", headers=p).headers
    wait_until(lambda: status(rep.http)["seq"] >= last, 30, "the writes on the replica")
    on_rep = httpx.get(f"http://127.0.0.1:{rep.http}/v1/kv/cfg/d")
    assert on_rep.headers["x-mercury-expires-at"] == got.headers["x-mercury-expires-at"]

    # The bounds, named.
    low = httpx.put(f"{base}/v1/kv/cfg/x?ttl=500ms", content=b"x", headers=p)
    assert low.status_code == 400 and "minimum of 1 s" in low.text
    high = httpx.put(f"{base}/v1/kv/cfg/x?ttl=400d", content=b"x", headers=p)
    assert high.status_code == 400 and "maximum" in high.text
    both = httpx.put(f"{base}/v1/kv/cfg/x?ttl=5s&expires_at=2030-01-01T00:00:00Z", headers=p)
    assert both.status_code == 400

    wait_until(lambda: len(_expired(data)) >= 2, 30, "a and b expired on the root")
    expired = _expired(data)
    assert sorted(k for _, k in expired) == [b"cfg/a", b"cfg/b"], expired
    assert httpx.get(f"{base}/v1/kv/cfg/a", headers=p).status_code == 404
    # c's first deadline (1 s) came before b's (2 s), and expiries are logged in deadline
    # order: had c kept it, it would have expired by now.
    assert httpx.get(f"{base}/v1/kv/cfg/c", headers=p).status_code == 200
    assert httpx.get(f"{base}/v1/kv/cfg/d", headers=p).status_code == 200

    root_seq = max(seq for seq, _ in expired)
    wait_until(lambda: status(rep.http)["seq"] >= root_seq, 30, "the expiries on the replica")
    assert _expired(rep.data_dir) == expired  # the same keys at the same seqs
    assert httpx.get(f"http://127.0.0.1:{rep.http}/v1/kv/cfg/b").status_code == 404
    assert httpx.get(f"http://127.0.0.1:{rep.http}/v1/kv/cfg/c").status_code == 200
    usage = httpx.get(f"{base}/v1/usage/p", headers=p).json()
    # expiries are counted apart: not the producer's deletes
    assert (usage["deletes"], usage["expiries"]) == (0, 2)

    # The SDK and the CLI give a deadline too; a put without one clears it.
    token = p["Authorization"].split()[1]
    with Client(base, token) as mc:
        mc.put("cfg/sdk", "v", ttl=timedelta(hours=1))
        assert "expires" in httpx.get(f"{base}/v1/kv/cfg/sdk", headers=p).headers
        mc.put("cfg/sdk", "v")
        assert "expires" not in httpx.get(f"{base}/v1/kv/cfg/sdk", headers=p).headers
    (tmp_path / "p.token").write_text(token)
    cli = ["kv", "put", "--url", base, "--token-file", str(tmp_path / "p.token")]
    assert run_mercury(*cli, "--ttl", "1h", "cfg/cli", "v").returncode == 0
    assert "expires" in httpx.get(f"{base}/v1/kv/cfg/cli", headers=p).headers
    bad = run_mercury(*cli, "--ttl", "0s", "cfg/cli", "v")
    assert bad.returncode == 4 and "minimum of 1 s" in bad.stderr


def test_a_root_killed_before_a_deadline_logs_the_expiry_once_restarted(
    tmp_path: Path, procs: Procs
) -> None:
    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    gw, repl = free_port(), free_port()
    root = _root(procs, data, gw, repl)
    base = f"http://127.0.0.1:{gw}"
    p = _producer(base, data)
    r = httpx.put(f"{base}/v1/kv/cfg/k?ttl=1s", content=b"v", headers=p)
    assert r.status_code == 200
    deadline = httpx.get(f"{base}/v1/kv/cfg/k", headers=p).headers["x-mercury-expires-at"]
    procs.kill(root)  # SIGKILL, the expiry not logged yet
    assert _expired(data) == []
    when = time.mktime(time.strptime(deadline[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    wait_until(lambda: time.time() > when + 1, 10, "the deadline to pass with no root")
    _root(procs, data, gw, repl)
    wait_until(lambda: _expired(data), 30, "the restarted root to log the expiry")
    assert [k for _, k in _expired(data)] == [b"cfg/k"]
    assert httpx.get(f"{base}/v1/kv/cfg/k", headers=p).status_code == 404
