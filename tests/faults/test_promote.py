"""Promotion by hand: SIGKILL the root, `mercury promote` its replica's directory, start a
root on it: every producer, token, quota, the admin token and the idempotency answers
work as they did on the old root (real processes and stores, nothing mocked)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from store.store import Store
from testkit.logged import entries_since
from testkit.procs import Procs, free_port, run_mercury, wait_http
from testkit.replication import status, wait_for
from tests.gateway.conftest import make_root
from tests.replicator.nodes import start_replica


def _bearer(token: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **more}


def test_a_promoted_replica_serves_as_the_root_with_everything_it_had(
    tmp_path: Path, procs: Procs
) -> None:
    root = make_root(procs, tmp_path / "root")
    a = root.admin()
    _, tok = root.producer(["p/"])
    _, qtok = root.producer(["q/"], quota={"max_bytes_stored": 2000})
    assert a.put("/v1/admin/consumers/reader", json={"keyspaces": ["p/"]}).status_code == 201
    r = a.post("/v1/admin/consumers/reader/tokens")
    assert r.status_code == 201, r.text
    ctok = r.json()["token"]

    w = root.client(tok)
    one = w.put("/v1/kv/p/one", content=b"1", headers={"Idempotency-Key": "idem-one"})
    assert one.status_code in (200, 201), one.text
    batch_body = {
        "ops": [{"op": "set", "key": "p/b1", "value": "x"}, {"op": "delete", "key": "p/zz"}]
    }
    two = w.post("/v1/batch", json=batch_body, headers={"Idempotency-Key": "idem-two"})
    assert two.status_code == 200, two.text
    q = root.client(qtok)
    assert q.put("/v1/kv/q/big", content=b"b" * 1500).status_code in (200, 201)
    assert q.put("/v1/kv/q/more", content=b"m" * 1000).status_code == 507  # over the quota

    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    rep = start_replica(procs, tmp_path / "rep", [repl_port], name="replica")
    seq = a.get("/v1/status").json()["seq"]
    wait_for(lambda: status(rep.http)["seq"] >= seq, 60, "replica caught up")
    head = a.get("/v1/status").json()

    procs.kill(root.proc)  # the root's machine is gone
    root.close_clients()

    # the replica still runs (its parent holds the store's lock): promotion refuses
    busy = run_mercury("promote", str(rep.data_dir))
    assert busy.returncode == 2 and "locked" in busy.stderr, busy.stderr
    procs.terminate(rep.proc)
    assert (rep.data_dir / "replication.json").exists()
    # Started as a root before its promotion, the replica's store is refused: its old root
    # could still be writing the same history.
    early = run_mercury("root", str(rep.data_dir), "--listen", f"127.0.0.1:{free_port()}")
    assert early.returncode == 2 and "never promoted" in early.stderr, early.stderr
    assert "mercury promote" in early.stderr
    done = run_mercury("promote", str(rep.data_dir))
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["after_seq"] == head["seq"] and info["after_hash"] == head["hash_head"]
    assert info["seq"] == head["seq"] + 1 and info["has_admin"] and info["has_acl"]
    assert not (rep.data_dir / "replication.json").exists()
    with Store.open(str(rep.data_dir), readonly=True) as s:
        promoted = s.get_doc("promotion")
        assert promoted is not None and json.loads(promoted.body)["after_seq"] == head["seq"]

    port, new_repl = free_port(), free_port()
    new_root = procs.start_mercury(
        "root", str(rep.data_dir), "--listen", f"127.0.0.1:{port}",
        "--repl-listen", f"127.0.0.1:{new_repl}", "--batch-window-ms", "20", name="promoted",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc=new_root)
    mine = (b"p/", b"q/")  # the producers' keyspaces
    with httpx.Client(base_url=url, timeout=30) as c:
        # a retried Idempotency-Key gets the old root's first answer, nothing is re-applied
        again = c.put(
            "/v1/kv/p/one", content=b"1", headers=_bearer(tok, **{"Idempotency-Key": "idem-one"})
        )
        assert again.status_code == one.status_code and again.json() == one.json()
        assert again.headers.get("idempotent-replayed") == "true"
        again = c.post(
            "/v1/batch", json=batch_body, headers=_bearer(tok, **{"Idempotency-Key": "idem-two"})
        )
        assert again.status_code == 200 and again.json() == two.json()
        assert again.headers.get("idempotent-replayed") == "true"
        # nothing written by replays (the root may log documents of its own meanwhile)
        assert [k for _, k in entries_since(rep.data_dir, info["seq"]) if k[:2] in mine] == []

        # the old producer token writes; the quota still counts the old root's bytes
        new = c.put("/v1/kv/p/two", content=b"2", headers=_bearer(tok))
        assert new.status_code in (200, 201) and new.json()["seq"] > info["seq"]
        logged = [k for _, k in entries_since(rep.data_dir, info["seq"]) if k[:2] in mine]
        assert logged == [b"p/two"]
        assert c.put("/v1/kv/q/more", content=b"m" * 1000, headers=_bearer(qtok)).status_code == 507
        assert c.put("/v1/kv/q/small", content=b"s", headers=_bearer(qtok)).status_code in (
            200,
            201,
        )
        assert c.put("/v1/kv/q/x", content=b"1", headers=_bearer(tok)).status_code == 403

        # the admin token of the old root works, and changes travel on
        admin = _bearer(root.admin_token)
        assert c.get("/v1/admin/acl", headers=admin).status_code == 200
        assert c.get("/v1/admin/acl", headers=_bearer(tok)).status_code == 403
        r = c.put("/v1/admin/producers/late", json={"keyspaces": ["late/"]}, headers=admin)
        assert r.status_code == 201, r.text
        end = c.get("/v1/status").json()["seq"]

    # a consumer token reads on a replica of the promoted root (bootstrapped from it)
    r2 = start_replica(procs, tmp_path / "r2", [new_repl], "--read-auth", repl=False, name="r2")
    wait_for(lambda: status(r2.http)["seq"] >= end, 60, "new replica caught up")
    base = f"http://127.0.0.1:{r2.http}"
    got = httpx.get(f"{base}/v1/kv/p/two", headers=_bearer(ctok), timeout=10)
    assert got.status_code == 200 and got.content == b"2"
    assert httpx.get(f"{base}/v1/kv/q/big", headers=_bearer(ctok), timeout=10).status_code == 403

    # one history: the new replica's head is the promoted root's
    now = httpx.get(f"{url}/v1/status", timeout=10).json()
    wait_for(lambda: status(r2.http)["seq"] >= now["seq"], 60, "new replica at the head")
    assert status(r2.http)["hash_head"] == now["hash_head"]

    procs.terminate(r2.proc)
    procs.terminate(new_root)
    verify = run_mercury("verify", str(rep.data_dir))
    assert verify.returncode == 0, verify.stdout
    # the answers came through the log: byte-identical on the bootstrapped replica
    answers = [_answers(str(d)) for d in (rep.data_dir, r2.data_dir)]
    assert len(answers[0]) == 2 and answers[0] == answers[1]


def _answers(data_dir: str) -> list[tuple[bytes, bytes]]:
    with Store.open(data_dir, readonly=True) as s, s.env.begin(db=s.dbs.idem) as txn:
        return [(bytes(k), bytes(v)) for k, v in txn.cursor()]


def test_promote_refuses_a_missing_store(tmp_path: Path) -> None:
    r = run_mercury("promote", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "mercury init" in r.stderr and "Traceback" not in r.stderr
