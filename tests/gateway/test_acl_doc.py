"""The ACL as one replicated document, consumers, managed tokens, audit and purge — against
a real root process over HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from acl.tokens import hash_token, new_token
from store import codec
from store.ops import DELETE
from store.replica_apply import payload
from store.store import Store
from testkit import metrics
from testkit.procs import Procs, free_port, run_mercury, wait_http
from testkit.replication import status, wait_for
from testkit.wait import wait_until
from tests.gateway.conftest import Root
from tests.replicator.nodes import start_replica

ACL = "/v1/admin/acl"


def _acl(root: Root) -> tuple[dict[str, Any], str]:
    r = root.admin().get(ACL)
    assert r.status_code == 200, r.text
    return r.json(), r.headers["etag"]


def test_get_acl_is_one_document_with_its_version(shared_root: Root) -> None:
    name, _tok = shared_root.producer()
    doc, etag = _acl(shared_root)
    assert etag == f'"{doc["version"]}"' and doc["version"] > 0
    assert set(doc) == {"version", "producers", "consumers"}
    assert doc["producers"][name]["keyspaces"] == [f"{name}/"]
    assert "tokens" not in doc["producers"][name] and "token_ids" not in doc["producers"][name]


def test_put_acl_needs_if_match_and_refuses_a_stale_version(shared_root: Root) -> None:
    a = shared_root.admin()
    doc, etag = _acl(shared_root)
    body = {"producers": doc["producers"], "consumers": doc["consumers"]}
    r = a.put(ACL, json=body)
    assert r.status_code == 428, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    shared_root.producer()  # the ACL moves on
    r = a.put(ACL, json=body, headers={"If-Match": etag})
    assert r.status_code == 412, r.text
    assert _acl(shared_root)[1] != etag


def test_invalid_put_lists_every_problem_and_changes_nothing(shared_root: Root) -> None:
    a = shared_root.admin()
    shared_root.producer(["x/"])
    before, etag = _acl(shared_root)
    bad = {
        "producers": {
            "a": {"keyspaces": ["k/"]},
            "b": {"keyspaces": ["k/sub/"]},  # overlaps a
            "c": {"keyspaces": ["c/"], "shared": ["nope/"]},  # shared not among keyspaces
            "d": {"keyspaces": ["d/"], "colour": "red"},  # unknown field
        },
        "consumers": {"r": {"keyspaces": "not-a-list"}},
    }
    r = a.put(ACL, json=bad, headers={"If-Match": etag})
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert len(errors) == 4, errors
    assert any("overlaps" in e for e in errors) and any("'d'" in e for e in errors)
    after, etag2 = _acl(shared_root)
    assert after == before and etag2 == etag


def test_a_falsy_producers_member_is_refused_not_read_as_none(shared_root: Root) -> None:
    a = shared_root.admin()
    name, _ = shared_root.producer(["f/"])
    before, etag = _acl(shared_root)
    falsies: list[Any] = [[], False, 0, ""]
    for falsy in falsies:
        r = a.put(ACL, json={"producers": falsy}, headers={"If-Match": etag})
        assert r.status_code == 422, (falsy, r.text)
    for field in ("quota", "guards"):
        r = a.put(f"/v1/admin/producers/{name}", json={"keyspaces": ["f/"], field: []})
        assert r.status_code == 400, (field, r.text)
    r = a.put(f"/v1/admin/producers/{name}", json={"keyspaces": False})
    assert r.status_code == 400, r.text
    after, etag2 = _acl(shared_root)
    assert after == before and etag2 == etag


def test_put_acl_commits_atomically_keeps_tokens_and_dry_run_changes_nothing(
    shared_root: Root,
) -> None:
    a = shared_root.admin()
    name, tok = shared_root.producer(["mv/"])
    doc, etag = _acl(shared_root)
    new = {
        "producers": {name: {"keyspaces": ["mv/", "more/"]}, "fresh": {"keyspaces": ["f/"]}},
        "consumers": {"reader": {"keyspaces": ["mv/"]}},
    }
    r = a.put(ACL + "?dry_run=true", json=new, headers={"If-Match": etag})
    assert r.status_code == 200 and r.json()["committed"] is False, r.text
    changes = r.json()["changes"]
    assert "+ producer fresh" in changes and "+ consumer reader" in changes
    assert any(c.startswith(f"~ producer {name}") for c in changes)
    assert _acl(shared_root) == (doc, etag)  # dry run: nothing committed
    r = a.put(ACL, json=new, headers={"If-Match": etag})
    assert r.status_code == 200 and r.json()["committed"] is True, r.text
    assert r.json()["changes"] == changes
    got, etag2 = _acl(shared_root)
    assert etag2 == f'"{r.json()["version"]}"' != etag
    assert set(got["producers"]) == {name, "fresh"} and set(got["consumers"]) == {"reader"}
    # the producer's token survived the document PUT
    w = shared_root.client(tok).put("/v1/kv/more/x", content=b"1")
    assert w.status_code in (200, 201), w.text
    # the same document again: nothing to do, version unchanged
    r = a.put(ACL, json=new, headers={"If-Match": etag2})
    assert r.status_code == 200 and r.json()["changes"] == [] and r.json()["committed"] is False


def test_consumers_and_their_tokens(root: Root) -> None:
    a = root.admin()
    r = a.put("/v1/admin/consumers/edge", json={"keyspaces": ["cfg/"]})
    assert r.status_code == 201 and r.json()["keyspaces"] == ["cfg/"], r.text
    r = a.post("/v1/admin/consumers/edge/tokens", json={"label": "pop-1"})
    assert r.status_code == 201, r.text
    tid, tok = r.json()["token_id"], r.json()["token"]
    assert r.json()["label"] == "pop-1"
    doc, _ = _acl(root)
    assert doc["consumers"] == {"edge": {"keyspaces": ["cfg/"]}}
    listed = a.get("/v1/admin/consumers/edge/tokens").json()["tokens"]
    assert [t["token_id"] for t in listed] == [tid] and "hash" not in listed[0]
    # a consumer token is no writer
    w = root.client(tok).put("/v1/kv/cfg/a", content=b"1")
    assert w.status_code == 403, w.text
    assert a.delete(f"/v1/admin/consumers/edge/tokens/{tid}").status_code == 200
    assert root.client(tok).put("/v1/kv/cfg/a", content=b"1").status_code == 401


def test_tokens_have_labels_expiry_last_use_and_revocation_is_immediate(shared_root: Root) -> None:
    a = shared_root.admin()
    name, _ = shared_root.producer()
    r = a.post(f"/v1/admin/producers/{name}/tokens", json={"label": "ci", "expires_in_s": 2})
    assert r.status_code == 201, r.text
    short = r.json()
    assert short["label"] == "ci" and short["expires"] and short["created"]
    r = a.post(f"/v1/admin/producers/{name}/tokens", json={"label": "deploy"})
    long_tok = r.json()
    c = shared_root.client(long_tok["token"])
    assert c.put(f"/v1/kv/{name}/k", content=b"v").status_code in (200, 201)
    tokens = {
        t["token_id"]: t for t in a.get(f"/v1/admin/producers/{name}/tokens").json()["tokens"]
    }
    assert tokens[long_tok["token_id"]]["last_used"] is not None
    assert tokens[long_tok["token_id"]]["expires"] is None
    assert tokens[short["token_id"]]["label"] == "ci"
    assert all("token" not in t and "hash" not in t for t in tokens.values())
    assert shared_root.client(short["token"]).put(f"/v1/kv/{name}/s", content=b"v").status_code in (
        200,
        201,
    )
    # Deliberate: the test must cross the token's 2-second lifetime (counted from its
    # creation, answered before this sleep starts), so it is surely past once this ends.
    time.sleep(2.2)
    r = shared_root.client(short["token"]).put(f"/v1/kv/{name}/s", content=b"w")
    assert r.status_code == 401 and "expired" in r.text
    assert a.delete(f"/v1/admin/producers/{name}/tokens/{long_tok['token_id']}").status_code == 200
    assert c.put(f"/v1/kv/{name}/k", content=b"w").status_code == 401


def test_audit_limit_out_of_range_is_refused_not_clamped(shared_root: Root) -> None:
    a = shared_root.admin()
    for bad in ("-1", "0", "1001", "5000", "x"):
        r = a.get("/v1/admin/audit", params={"limit": bad})
        assert r.status_code == 400 and "1 to 1000" in r.json()["detail"], (bad, r.text)
    assert a.get("/v1/admin/audit", params={"limit": "1000"}).status_code == 200


def test_every_admin_change_is_audited(root: Root) -> None:
    a = root.admin()
    mark = a.get(ACL).json()["version"]
    name, _ = root.producer()
    a.put("/v1/admin/consumers/aud", json={"keyspaces": ["z/"]})
    a.delete(f"/v1/admin/producers/{name}")
    recs = a.get("/v1/admin/audit", params={"since": str(mark)}).json()["records"]
    assert [r["action"] for r in recs] == [
        "put_producer", "create_token", "put_consumer", "delete_producer",
    ]  # fmt: skip
    assert all(r["who"] == "admin" and r["seq"] > mark and r["time"].endswith("Z") for r in recs)
    assert recs[0]["diff"] == [f"+ producer {name}"] and recs[0]["target"] == name
    # by time: from the third record's time on
    later = a.get("/v1/admin/audit", params={"since": recs[2]["time"]}).json()["records"]
    assert [r["seq"] for r in later] == [recs[2]["seq"], recs[3]["seq"]]
    assert a.get("/v1/admin/audit", params={"since": "yesterday"}).status_code == 400


def test_acl_lives_in_the_replicated_document_not_in_state(root: Root) -> None:
    name, _ = root.producer()
    root.procs.terminate(root.proc)
    with Store.open(str(root.data_dir), readonly=True) as s:
        assert s.get_state("acl") is None
        doc = s.get_doc("acl")
        assert doc is not None and name.encode() in doc.body
    root.start()  # the restarted root rebuilds its ACL from the document
    assert name in _acl(root)[0]["producers"]


def test_delete_with_purge_removes_its_keys_through_the_log(root: Root) -> None:
    a = root.admin()
    name, tok = root.producer(guards={})
    a.put(
        f"/v1/admin/producers/{name}",
        json={"keyspaces": [f"{name}/"], "guards": {f"{name}/": {"max_deletes_per_batch": 7}}},
    )
    c = root.client(tok)
    body = {"ops": [{"op": "set", "key": f"{name}/{i:03d}", "value": "v"} for i in range(30)]}
    assert c.post("/v1/batch", json=body).status_code == 200
    # the producer keeps writing while it is purged: none of its writes may survive
    stop = threading.Event()
    statuses: list[int] = []

    def writer() -> None:
        with httpx.Client(base_url=root.url, headers={"Authorization": f"Bearer {tok}"}) as w:
            for i in range(2000):
                if stop.is_set():
                    return
                statuses.append(w.put(f"/v1/kv/{name}/late{i:04d}", content=b"x").status_code)

    t = threading.Thread(target=writer)
    t.start()
    try:
        # Purge once the writer is really writing (a write answered 200), not after a
        # fixed pause: on a loaded machine its first answer may take longer than any pause.
        wait_until(lambda: 200 in statuses or not t.is_alive(), 30, "the writer's first 200")
        r = a.delete(f"/v1/admin/producers/{name}", params={"purge": "true"})
    finally:
        stop.set()
        t.join(30)
    assert r.status_code == 200 and r.json()["removed"] == name, r.text
    late = statuses.count(200)
    assert late > 0 and statuses[-1] == 401, statuses[-5:]
    assert r.json()["purged"] == 30 + late
    root.procs.terminate(root.proc)
    with Store.open(str(root.data_dir), readonly=True) as s:
        with s.reader() as rd:
            assert list(rd.scan(prefix=f"{name}/".encode(), keys_only=True)) == []
        assert s.usage()[name].keys == 0
        # the purge's deletes: transactions of at most 7 (its guard), every key once. A
        # record may also hold the late writes that met a purge batch in one window, so
        # deletes are counted per record, not only in records of deletes alone.
        recs = s.read_log(1, max_records=100_000, max_bytes=1 << 30)
        ops = [[e.op for e in codec.decode_entries(payload(rec))] for rec in recs]
        deletes = [o.count(DELETE) for o in ops if DELETE in o]
        assert deletes and max(deletes) <= 7 and sum(deletes) == 30 + late, deletes
    root.start()
    assert name not in _acl(root)[0]["producers"]


def test_a_write_whose_body_outlasts_the_revocation_is_refused_not_left_behind_a_purge(
    root_factory: Any,
) -> None:
    """A PUT authenticated from its headers before the purge revoked the producer's tokens,
    its body arriving once the purge's cursor had passed its key: it was applied, and its
    key outlived the producer. It must be refused at its submit (401)."""
    root = root_factory(window_ms=200)
    a = root.admin()
    name, tok = root.producer(guards={})
    ks = f"{name}/"
    guard = {ks: {"max_deletes_per_batch": 1}}  # one delete per batch window
    assert a.put(
        f"/v1/admin/producers/{name}", json={"keyspaces": [ks], "guards": guard}
    ).is_success
    c = root.client(tok)
    for i in range(5):
        assert c.put(f"/v1/kv/{name}/m{i}", content=b"v").status_code == 200
    # The slow PUT carries a token of its own, so its `last_used` tells when the root has
    # authenticated it: a purge that began before that would refuse it at its headers,
    # and the test would pass without ever having a body outlast a revocation.
    r = a.post(f"/v1/admin/producers/{name}/tokens", json={"label": "slow"})
    assert r.status_code == 201, r.text
    slow_id, slow_tok = r.json()["token_id"], r.json()["token"]
    host, port = root.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), 10) as slow:
        head = (
            f"PUT /v1/kv/{name}/a-late HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {slow_tok}\r\nContent-Length: 4\r\n\r\nab"
        )
        slow.sendall(head.encode())

        def authenticated() -> bool:
            listed = a.get(f"/v1/admin/producers/{name}/tokens").json()["tokens"]
            return any(t["token_id"] == slow_id and t["last_used"] for t in listed)

        wait_until(authenticated, 30, "the slow PUT's headers authenticated")
        purge: list[httpx.Response] = []

        def run_purge() -> None:
            with httpx.Client(base_url=root.url, timeout=60) as admin:
                auth = {"Authorization": f"Bearer {root.admin_token}"}
                params = {"purge": "true"}
                purge.append(
                    admin.delete(f"/v1/admin/producers/{name}", params=params, headers=auth)
                )

        t = threading.Thread(target=run_purge)
        t.start()

        # Once the purge's first delete (m0) committed, its cursor is past "a-late".
        def m0_deleted() -> bool:
            with Store.open(str(root.data_dir), readonly=True) as st, st.reader() as rd:
                return rd.get(f"{name}/m0".encode()) is None

        wait_until(m0_deleted, 30, "the purge's first delete committed")
        slow.sendall(b"cd")
        slow.settimeout(30)
        reply = slow.recv(65536)
        t.join(60)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:300]
    assert purge and purge[0].status_code == 200 and purge[0].json()["purged"] == 5, purge
    root.procs.terminate(root.proc)
    with Store.open(str(root.data_dir), readonly=True) as st, st.reader() as rd:
        assert list(rd.scan(prefix=ks.encode(), keys_only=True)) == []
    root.start()


def test_a_write_held_by_its_quota_through_a_whole_purge_is_refused(root: Root) -> None:
    """A PUT held by its rate quota while the purge runs and removes the producer: when
    the hold ended the fence was already lifted, and the write went in under a producer
    that no longer exists."""
    # One op per 5 s: the second PUT is held ~5 s for its token, far longer than a purge
    # of one key takes, so the purge starts and ends inside the hold.
    quota = {"ops_per_s": 0.2, "burst": 1, "max_delay_ms": 10000}
    name, tok = root.producer(quota=quota)
    c = root.client(tok)
    assert c.put(f"/v1/kv/{name}/a", content=b"v").status_code == 200  # the burst spent
    held: list[httpx.Response] = []

    def put_held() -> None:
        with httpx.Client(base_url=root.url, timeout=30) as w:
            auth = {"Authorization": f"Bearer {tok}"}
            held.append(w.put(f"/v1/kv/{name}/b", content=b"v", headers=auth))

    def held_ops() -> float:
        text = root.client().get("/metrics").text
        return metrics.value(text, "mercury_quota_ops_total", producer=name, outcome="held")

    t = threading.Thread(target=put_held)
    t.start()
    # Purge only once the PUT is authenticated and held by its quota: a purge that came
    # first would refuse it at its token (401 too), and the test would prove nothing.
    wait_until(held_ops, 30, "the second PUT held by its quota")
    r = root.admin().delete(f"/v1/admin/producers/{name}", params={"purge": "true"})
    assert r.status_code == 200 and r.json()["purged"] == 1, r.text
    assert not held, ("the PUT left its hold before the purge ended", held)
    t.join(30)
    assert held and held[0].status_code == 401, held
    root.procs.terminate(root.proc)
    with Store.open(str(root.data_dir), readonly=True) as st, st.reader() as rd:
        assert list(rd.scan(prefix=f"{name}/".encode(), keys_only=True)) == []
    root.start()


def test_a_replica_gets_the_acl_document_by_bootstrap_and_by_the_log(root: Root) -> None:
    a = root.admin()
    name, tok = root.producer()
    w = root.client(tok).put(f"/v1/kv/{name}/k", content=b"v", headers={"Idempotency-Key": "i1"})
    assert w.status_code in (200, 201), w.text
    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    rep = start_replica(root.procs, root.data_dir.parent / "rep", [repl_port], repl=False)
    seq = a.get("/v1/status").json()["seq"]
    wait_for(lambda: status(rep.http)["seq"] >= seq, 60, "replica bootstrapped")
    # a later change travels down the ordinary log stream
    assert a.put("/v1/admin/consumers/edge", json={"keyspaces": ["e/"]}).status_code == 201
    seq = a.get("/v1/status").json()["seq"]
    wait_for(lambda: status(rep.http)["seq"] >= seq, 30, "replica caught up")
    root.procs.terminate(rep.proc)
    root.procs.terminate(root.proc)
    with Store.open(str(root.data_dir), readonly=True) as s:
        want = s.get_doc("acl")
        want_audit = s.scan_docs("audit/")
        want_admin = s.get_doc("admin_token_hash")
        with s.env.begin(db=s.dbs.idem) as txn:
            want_answers = list(txn.cursor())
    with Store.open(str(rep.data_dir), readonly=True) as r:
        assert r.get_doc("acl") == want and want is not None
        assert b'"edge"' in want.body and name.encode() in want.body
        assert r.scan_docs("audit/") == want_audit
        # format 5: the admin hash and the idempotency answer travel too, byte for byte
        assert r.get_doc("admin_token_hash") == want_admin and want_admin is not None
        with r.env.begin(db=r.dbs.idem) as txn:
            assert list(txn.cursor()) == want_answers and len(want_answers) == 1
    root.start()


def _cli(root: Root, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    tok = tmp_path / "admin.token"
    tok.write_text(root.admin_token)
    return run_mercury(*args, "--url", root.url, "--admin-token-file", str(tok))


def test_cli_apply_prunes_only_when_asked_and_dry_run_shows_the_put(
    shared_root: Root, tmp_path: Path
) -> None:
    f = tmp_path / "acl.yaml"
    f.write_text('producers:\n  c1: {keyspaces: ["c1/"]}\nconsumers:\n  r1: {keyspaces: ["c1/"]}\n')
    r = _cli(shared_root, tmp_path, "acl", "apply", str(f))
    assert r.returncode == 0, r.stderr
    assert "+ producer c1" in r.stdout and "+ consumer r1" in r.stdout
    f.write_text('producers:\n  c2: {keyspaces: ["c2/"]}\n')
    r = _cli(shared_root, tmp_path, "acl", "apply", str(f))  # c1 and r1 kept
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "+ producer c2", r.stdout
    before = _acl(shared_root)
    dry = _cli(shared_root, tmp_path, "acl", "apply", str(f), "--prune", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "- producer c1" in dry.stdout and "- consumer r1" in dry.stdout
    assert "not applied" in dry.stdout and _acl(shared_root) == before
    r = _cli(shared_root, tmp_path, "acl", "apply", str(f), "--prune")
    assert r.returncode == 0 and r.stdout.splitlines()[:2] == dry.stdout.splitlines()[:2]
    assert (
        set(_acl(shared_root)[0]["producers"]) == {"c2"} and _acl(shared_root)[0]["consumers"] == {}
    )


def test_cli_token_create_list_revoke_and_log(shared_root: Root, tmp_path: Path) -> None:
    name, _ = shared_root.producer()
    r = _cli(
        shared_root, tmp_path, "acl", "token", "create", name, "--label", "ci", "--expires", "90d"
    )
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("mct_") and "shown only now" in r.stderr
    assert shared_root.client(token).put(f"/v1/kv/{name}/k", content=b"v").status_code in (200, 201)
    listed = _cli(shared_root, tmp_path, "acl", "token", "list", name)
    line = next(x for x in listed.stdout.splitlines() if "'ci'" in x)
    assert "expires=20" in line and "last_used=20" in line and token not in listed.stdout
    tid = line.split()[0]
    assert _cli(shared_root, tmp_path, "acl", "token", "revoke", name, tid).returncode == 0
    assert shared_root.client(token).put(f"/v1/kv/{name}/k", content=b"w").status_code == 401
    log = _cli(shared_root, tmp_path, "acl", "log")
    assert log.returncode == 0 and f"revoke_token producer/{name}" in log.stdout
    assert f"- token {tid}" in log.stdout
    bad = _cli(shared_root, tmp_path, "acl", "token", "create", name, "--expires", "soon")
    assert bad.returncode == 2 and "--expires" in bad.stderr


def test_cli_names_a_producer_called_dot_dot_as_itself(shared_root: Root, tmp_path: Path) -> None:
    # `..` as a path segment is resolved away by HTTP clients: the CLI escapes it
    made = shared_root.admin().put("/v1/admin/producers/%2E%2E", json={"keyspaces": ["dots/"]})
    assert made.status_code in (200, 201), made.text
    r = _cli(shared_root, tmp_path, "acl", "token", "create", "..")
    assert r.returncode == 0, r.stderr
    assert (
        shared_root.client(r.stdout.strip()).put("/v1/kv/dots/k", content=b"v").status_code == 200
    )
    listed = _cli(shared_root, tmp_path, "acl", "token", "list", "..")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1, listed.stdout


def test_a_migrated_format_2_root_keeps_its_producers_and_tokens(
    tmp_path: Path, procs: Procs
) -> None:
    """A root store from before replicated documents (the ACL in the node-local state,
    tokens stored as id -> hash): `mercury migrate`, then the root serves the same ACL."""
    d = tmp_path / "old"
    admin, tok = new_token(), new_token()
    legacy = {
        "producers": [{"name": "old", "keyspaces": ["old/"], "tokens": {"tok_1": hash_token(tok)}}]
    }
    s = Store.create(str(d), format_version=2, sync=False)
    s.put_state("admin_token_hash", hash_token(admin).encode())
    s.put_state("acl", json.dumps(legacy).encode())
    s.close()
    r = run_mercury("migrate", str(d))
    assert r.returncode == 0, r.stderr
    port = free_port()
    proc = procs.start_mercury(
        "root", str(d), "--listen", f"127.0.0.1:{port}", "--repl-listen",
        f"127.0.0.1:{free_port()}", "--batch-window-ms", "20", name="migrated",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc=proc)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}) as a:
        got = a.get(ACL).json()
        assert got["producers"]["old"]["keyspaces"] == ["old/"] and got["version"] == 1
        listed = a.get("/v1/admin/producers/old/tokens").json()["tokens"]
        assert [t["token_id"] for t in listed] == ["tok_1"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok}"}) as p:
        assert p.put("/v1/kv/old/k", content=b"v").status_code in (200, 201)
    procs.terminate(proc)
    with Store.open(str(d), readonly=True) as st:
        assert st.get_state("acl") is None and st.get_doc("acl") is not None
