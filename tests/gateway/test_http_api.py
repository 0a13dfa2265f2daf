"""Every status code of the root's HTTP API (docs/api.md) from a real `mercury root`."""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import msgpack

from core.problems import NO_SUCH_KEY_TYPE, NO_SUCH_ROUTE_TYPE, NOT_FOUND_TYPE
from store.store import Store
from testkit import metrics
from testkit.logged import records, seqs_since
from testkit.wait import wait_until
from tests.gateway.conftest import Root, logged_since

PROBLEM = "application/problem+json"


def _problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["detail"]
    return body


def test_put_get_delete_answer_with_seq(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    r = c.put(f"/v1/kv/{name}/a", content=b"v1")
    assert r.status_code == 200 and r.json()["status"] == "written"
    seq = r.json()["seq"]
    g = c.get(f"/v1/kv/{name}/a")
    assert g.status_code == 200 and g.content == b"v1" and g.headers["etag"] == f'"{seq}"'
    d = c.delete(f"/v1/kv/{name}/a")
    assert d.status_code == 200 and d.json()["status"] == "deleted"
    # The delete's own seq: the next entry of the log but for documents the root logs of
    # its own after a batch's ops (a minute's usage series), so it is found in the log.
    key = f"{name}/a".encode()
    assert d.json() == {"seq": _seq_of(shared_root, seq, key), "status": "deleted"}
    d2 = c.delete(f"/v1/kv/{name}/a")
    assert d2.status_code == 200 and d2.json()["status"] == "absent"
    _problem(c.get(f"/v1/kv/{name}/a"), 404)


def _seq_of(root: Root, after: int, key: bytes) -> int:
    """The seq of the only entry for `key` the root logged after `after`."""
    found = [seq for seq, _, k in seqs_since(root.data_dir, after) if k == key]
    assert len(found) == 1, found
    return found[0]


def test_duplicate_set_is_not_logged_and_says_so(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    first = c.put(f"/v1/kv/{name}/d", content=b"same").json()
    before = shared_root.client().get("/v1/status").json()["seq"]
    again = c.put(f"/v1/kv/{name}/d", content=b"same").json()
    assert again == {"seq": first["seq"], "status": "duplicate"}
    b = c.post("/v1/batch", json={"ops": [{"op": "set", "key": f"{name}/d", "value": "same"}]})
    assert b.json()["duplicates"] == 1 and b.json()["written"] == 0
    assert [k for _, k in logged_since(shared_root, before) if name.encode() in k] == []
    u = c.get(f"/v1/usage/{name}").json()
    assert u["duplicates"] == 2 and u["writes"] == 1 and u["keys"] == 1


def test_percent_encoded_and_binary_keys(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    assert c.put(f"/v1/kv/{name}/a%20b%2Fc%FF", content=b"x").status_code == 200
    ops = [
        {
            "op": "set",
            "key_b64": base64.b64encode(f"{name}/".encode() + b"\xfe").decode(),
            "value_b64": base64.b64encode(b"\x00\x01").decode(),
        }
    ]
    assert c.post("/v1/batch", json={"ops": ops}).json()["written"] == 1
    assert c.get(f"/v1/kv/{name}/a%20b%2Fc%FF").content == b"x"
    assert c.get(f"/v1/kv/{name}/%FE").content == b"\x00\x01"
    # line breaks are key bytes like any other: each key is written, read and deleted (a
    # read once matched no route: Starlette's path parameters stop at a line break)
    for enc in ("a%0Ab", "a%0Db", "%0D%0A", "a%0A"):
        path = f"/v1/kv/{name}/{enc}"
        assert c.put(path, content=enc.encode()).status_code == 200, enc
        r = c.get(path)
        assert (r.status_code, r.content) == (200, enc.encode()), (enc, r.text)
        assert c.delete(path).json()["status"] == "deleted", enc
        assert _problem(c.get(path), 404)["type"].endswith("/no-such-key"), enc


def test_head_of_a_key_and_the_methods_a_405_names(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    seq = c.put(f"/v1/kv/{name}/h", content=b"12345").json()["seq"]
    r = c.head(f"/v1/kv/{name}/h")
    assert (r.status_code, r.content, r.headers["content-length"]) == (200, b"", "5")
    assert r.headers["etag"] == f'"{seq}"'
    assert c.head(f"/v1/kv/{name}/none").status_code == 404
    # a 405 names every method the path takes, not those of one route
    for method in ("POST", "PATCH"):
        r = c.request(method, f"/v1/kv/{name}/h", content=b"x")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, PUT, DELETE", r.headers
        assert "GET, HEAD, PUT, DELETE" in _problem(r, 405)["detail"]
    assert c.get(f"/v1/kv/{name}/h").content == b"12345"  # nothing changed


def test_msgpack_batch_carries_binary_values(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    body = msgpack.packb(
        {
            "ops": [
                {"op": "set", "key": f"{name}/m".encode(), "value": b"\xff\x00bin"},
                {"op": "set", "key": f"{name}/n", "value": "text"},
            ]
        }
    )
    r = c.post("/v1/batch", content=body, headers={"content-type": "application/msgpack"})
    assert r.status_code == 200 and r.json()["written"] == 2, r.text
    assert c.get(f"/v1/kv/{name}/m").content == b"\xff\x00bin"
    bad = c.post("/v1/batch", content=b"\xc1", headers={"content-type": "application/msgpack"})
    _problem(bad, 400)


def test_400_invalid_inputs_name_the_reason(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    assert "JSON" in _problem(c.post("/v1/batch", content=b"{nope"), 400)["detail"]
    assert "ops" in _problem(c.post("/v1/batch", json={"x": 1}), 400)["detail"]
    p = _problem(c.post("/v1/batch", json={"ops": [{"op": "frob", "key": f"{name}/x"}]}), 400)
    assert "op 0" in p["detail"]
    p = _problem(c.post("/v1/batch", json={"ops": [{"op": "set", "key": f"{name}/x"}]}), 400)
    assert "value" in p["detail"]
    p = _problem(c.put(f"/v1/kv/{name}/x", content=b"v", headers={"If-Match": "abc"}), 400)
    assert "If-Match" in p["detail"]
    _problem(c.post("/v1/batch", json={"ops": [{"op": "set", "key": "", "value": "v"}]}), 400)


def test_401_without_or_with_unknown_token(shared_root: Root) -> None:
    name, _ = shared_root.producer()
    _problem(shared_root.client().put(f"/v1/kv/{name}/a", content=b"v"), 401)
    _problem(shared_root.client("mct_nope").put(f"/v1/kv/{name}/a", content=b"v"), 401)
    _problem(shared_root.client().get("/v1/admin/producers"), 401)


def test_403_names_key_and_keyspaces_and_applies_nothing(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    p = _problem(c.put("/v1/kv/elsewhere/a", content=b"v"), 403)
    assert "elsewhere/a" in p["detail"] and f"{name}/" in p["detail"]
    assert p["keyspaces"] == [f"{name}/"]
    ops = [
        {"op": "set", "key": f"{name}/ok", "value": "v"},
        {"op": "set", "key": "other/no", "value": "v"},
    ]
    _problem(c.post("/v1/batch", json={"ops": ops}), 403)
    _problem(c.get(f"/v1/kv/{name}/ok"), 404)  # the allowed op was not applied either
    # a producer token is not an admin token
    _problem(c.get("/v1/admin/producers"), 403)
    _problem(shared_root.admin().put(f"/v1/kv/{name}/a", content=b"v"), 403)


def test_404_unknown_producer(shared_root: Root) -> None:
    a = shared_root.admin()
    for r in (
        a.delete("/v1/admin/producers/nobody"),
        a.post("/v1/admin/producers/nobody/tokens"),
        a.get("/v1/usage/nobody"),
    ):
        assert _problem(r, 404)["type"] == NOT_FOUND_TYPE


def test_404_says_no_such_key_or_no_such_route(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    assert _problem(c.get(f"/v1/kv/{name}/absent"), 404)["type"] == NO_SUCH_KEY_TYPE
    # a wrong base URL (no /v1, a typo) is no route, never a key that is absent
    for path in (f"/kv/{name}/absent", f"/v1/kvv/{name}/absent", "/nope"):
        p = _problem(c.get(path), 404)
        assert p["type"] == NO_SUCH_ROUTE_TYPE and path in p["detail"], path


def test_409_overlap_unless_both_shared(shared_root: Root) -> None:
    a = shared_root.admin()
    assert a.put("/v1/admin/producers/ov1", json={"keyspaces": ["ov/x/"]}).status_code == 201
    p = _problem(a.put("/v1/admin/producers/ov2", json={"keyspaces": ["ov/"]}), 409)
    assert "ov/x/" in p["detail"] and "ov1" in p["detail"]
    # only one side shared: still refused
    p = _problem(
        a.put("/v1/admin/producers/ov2", json={"keyspaces": ["ov/"], "shared": ["ov/"]}), 409
    )
    r = a.put("/v1/admin/producers/ov1", json={"keyspaces": ["ov/x/"], "shared": ["ov/x/"]})
    assert r.status_code == 200
    r = a.put("/v1/admin/producers/ov2", json={"keyspaces": ["ov/"], "shared": ["ov/"]})
    assert r.status_code == 201, r.text


def test_412_if_match_and_if_none_match(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    k = f"/v1/kv/{name}/cas"
    r = c.put(k, content=b"1", headers={"If-None-Match": "*"})
    assert r.status_code == 200
    seq = r.json()["seq"]
    p = _problem(c.put(k, content=b"2", headers={"If-None-Match": "*"}), 412)
    assert p["current_seq"] == seq
    _problem(c.put(k, content=b"2", headers={"If-Match": f'"{seq + 100}"'}), 412)
    r = c.put(k, content=b"2", headers={"If-Match": f'"{seq}"'})
    assert r.status_code == 200 and r.json()["seq"] > seq
    _problem(c.delete(k, headers={"If-Match": f'"{seq}"'}), 412)
    assert c.get(k).content == b"2"


def test_413_key_value_and_batch_limits(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    p = _problem(c.put(f"/v1/kv/{name}/" + "k" * 500, content=b"v"), 413)
    assert "500" in p["detail"]
    p = _problem(c.put(f"/v1/kv/{name}/big", content=b"x" * ((25 << 20) + 1)), 413)
    assert str(25 << 20) in p["detail"]
    ops = [{"op": "delete", "key": f"{name}/{i}"} for i in range(10_001)]
    p = _problem(c.post("/v1/batch", json={"ops": ops}), 413)
    assert "10000" in p["detail"]


def test_421_range_reads_point_to_consumer_nodes(shared_root: Root) -> None:
    c = shared_root.client()
    p = _problem(c.get("/v1/range", params={"prefix": "a/"}), 421)
    assert "consumer node" in p["detail"]
    _problem(c.post("/v1/get_bulk", json={"keys": ["a"]}), 421)


def test_429_with_retry_after_and_ratelimit_headers(shared_root: Root) -> None:
    quota = {"ops_per_s": 1, "burst": 1, "max_delay_ms": 0}
    name, tok = shared_root.producer(quota=quota)
    c = shared_root.client(tok)
    assert c.put(f"/v1/kv/{name}/q", content=b"1").status_code == 200
    r = c.put(f"/v1/kv/{name}/q", content=b"2")
    _problem(r, 429)
    assert int(r.headers["retry-after"]) >= 1
    assert "ops" in r.headers["ratelimit-policy"] and "r=" in r.headers["ratelimit"]
    assert r.headers["ratelimit-policy"] == '"ops";q=1;w=1'  # 1 per 1 s window
    # throttled counters are committed with the next batch (one window later)
    wait_until(lambda: c.get(f"/v1/usage/{name}").json()["throttled"] >= 1, 30, "throttled 1")


def test_held_request_succeeds_with_ratelimit_headers(shared_root: Root) -> None:
    quota = {"ops_per_s": 20, "burst": 1, "max_delay_ms": 2000}
    name, tok = shared_root.producer(quota=quota)
    c = shared_root.client(tok)
    assert "ratelimit" not in c.put(f"/v1/kv/{name}/h", content=b"v").headers  # the burst
    # Three ops over a burst of one are held (0.1 s or more) however fast the machine is:
    # PUTs one after another would be held only if each came within 50 ms of the last.
    ops = [{"op": "set", "key": f"{name}/h{i}", "value": "v"} for i in range(3)]
    r = c.post("/v1/batch", json={"ops": ops})
    assert r.status_code == 200 and r.json()["written"] == 3, r.text
    assert "ratelimit" in r.headers and "ratelimit-policy" in r.headers, r.headers
    assert r.headers["ratelimit-policy"] == '"ops";q=20;w=1', r.headers  # 20/s, burst < 1 s


def test_shadow_quota_counts_without_enforcing(shared_root: Root) -> None:
    quota = {"ops_per_s": 1, "burst": 1, "max_delay_ms": 0, "shadow": True}
    name, tok = shared_root.producer(quota=quota)
    c = shared_root.client(tok)
    assert all(c.put(f"/v1/kv/{name}/s{i}", content=b"v").status_code == 200 for i in range(4))
    wait_until(lambda: c.get(f"/v1/usage/{name}").json()["throttled"] >= 2, 30, "throttled 2")
    assert c.get(f"/v1/usage/{name}").json()["writes"] == 4


def test_507_storage_quota_for_growing_writes_only(shared_root: Root) -> None:
    name, tok = shared_root.producer(quota={"max_bytes_stored": 200})
    c = shared_root.client(tok)
    assert c.put(f"/v1/kv/{name}/a", content=b"x" * 100).status_code == 200
    p = _problem(c.put(f"/v1/kv/{name}/b", content=b"x" * 100), 507)
    assert "200" in p["detail"]
    # shrinking an existing value and deleting still work
    assert c.put(f"/v1/kv/{name}/a", content=b"x" * 10).status_code == 200
    assert c.delete(f"/v1/kv/{name}/a").status_code == 200


def test_storage_quota_counts_writes_not_yet_committed(root_factory: Callable[..., Root]) -> None:
    """Twenty concurrent writes inside one 1.5 s window: only those that fit are
    admitted, although none is committed when the others are checked."""
    root = root_factory(window_ms=1500)
    name, tok = root.producer(quota={"max_bytes_stored": 1000})
    # Connected beforehand and sent together: the twenty meet in one window.
    clients = [root.client(tok) for _ in range(20)]
    for c in clients:
        assert c.get("/healthz").status_code == 200
    go = threading.Barrier(20)

    def put(i: int) -> httpx.Response:
        go.wait(timeout=30)
        return clients[i].put(f"/v1/kv/{name}/k{i:02d}", content=b"x" * 100)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(put, range(20)))
    statuses = [a.status_code for a in answers]
    assert set(statuses) == {200, 507}
    # The admitted writes were committed together, in one batch: each was checked while
    # the others admitted before it were not committed yet (admitted one after another
    # across commits, they would pass with a quota that counts only committed bytes).
    admitted = [a.json()["seq"] for a in answers if a.status_code == 200]
    with Store.open(str(root.data_dir), readonly=True) as store:
        holding = [
            (r.first_seq, r.last_seq)
            for r in records(store, min(admitted))
            if any(r.first_seq <= q <= r.last_seq for q in admitted)
        ]
    assert len(holding) == 1, (holding, admitted)
    usage = root.admin().get(f"/v1/usage/{name}").json()
    assert usage["keys"] == statuses.count(200)
    assert usage["bytes"] <= 1000 < usage["bytes"] + usage["bytes"] // usage["keys"]


def test_guards_refuse_empty_values_and_cap_deletes(shared_root: Root) -> None:
    name = "guarded"
    a = shared_root.admin()
    body = {
        "keyspaces": ["g/"],
        "guards": {"g/": {"refuse_empty": True, "max_deletes_per_batch": 2}},
    }
    assert a.put(f"/v1/admin/producers/{name}", json=body).status_code == 201
    tok = a.post(f"/v1/admin/producers/{name}/tokens").json()["token"]
    c = shared_root.client(tok)
    assert "empty" in _problem(c.put("/v1/kv/g/e", content=b""), 400)["detail"]
    ops = [{"op": "delete", "key": f"g/{i}"} for i in range(3)]
    assert "deletes" in _problem(c.post("/v1/batch", json={"ops": ops}), 400)["detail"]
    assert c.post("/v1/batch", json={"ops": ops[:2]}).status_code == 200


def test_async_write_answers_202_then_lands(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    r = c.put(f"/v1/kv/{name}/as", content=b"v", params={"async": "true"})
    assert r.status_code == 202
    wait_until(lambda: c.get(f"/v1/kv/{name}/as").status_code == 200, 30, "the async write")
    assert c.get(f"/v1/kv/{name}/as").content == b"v"


def test_tokens_list_and_revoke(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    a = shared_root.admin()
    listed = {p["name"]: p for p in a.get("/v1/admin/producers").json()["producers"]}
    (tid,) = listed[name]["token_ids"]
    assert "token" not in listed[name] and "tokens" not in listed[name]
    assert a.delete(f"/v1/admin/producers/{name}/tokens/{tid}").status_code == 200
    _problem(shared_root.client(tok).put(f"/v1/kv/{name}/r", content=b"v"), 401)


def test_status_metrics_healthz_docs(shared_root: Root) -> None:
    c = shared_root.client()
    st = c.get("/v1/status").json()
    assert st["role"] == "root" and set(st) >= {"db_id", "seq", "hash_head"}
    assert c.get("/healthz").status_code == 200
    m = c.get("/metrics").text
    for metric in (
        "mercury_write_ops_total",
        "mercury_batch_commit_seconds",
        "mercury_batch_ops",
        "mercury_write_ack_seconds",
    ):
        assert metric in m
    assert c.get("/docs").status_code == 200
    assert "/v1/batch" in c.get("/openapi.json").json()["paths"]


def test_usage_report_lists_producers(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    shared_root.client(tok).put(f"/v1/kv/{name}/u", content=b"12345")
    rows = {r["producer"]: r for r in shared_root.admin().get("/v1/usage").json()["producers"]}
    row = rows[name]
    assert row["keys"] == 1 and row["bytes"] > 5 + len(f"{name}/u") and row["writes"] == 1
    assert set(row) >= {"producer", "keys", "bytes", "writes", "duplicates", "throttled"}
    other, _ = shared_root.producer()
    _problem(shared_root.client(tok).get(f"/v1/usage/{other}"), 403)


def test_overlong_idempotency_key_is_refused_without_failing_the_batch(
    shared_root: Root,
) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    p = _problem(
        c.put(f"/v1/kv/{name}/ik", content=b"v", headers={"Idempotency-Key": "k" * 300}), 400
    )
    assert "Idempotency-Key" in p["detail"]
    assert c.put(f"/v1/kv/{name}/ik", content=b"v").status_code == 200


def test_413_batch_body_refused_from_its_content_length(shared_root: Root) -> None:
    import socket

    _, tok = shared_root.producer()
    host, port = shared_root.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/batch HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {tok}\r\nContent-Length: {(100 << 20) + 1}\r\n\r\n".encode()
        )
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(4096)
    assert data.startswith(b"HTTP/1.1 413"), data[:200]


def test_async_retry_before_the_commit_is_not_applied_again(root_factory: Any) -> None:
    """An async write is answered 202 before its commit, when its answer is not stored
    yet: a retry with its Idempotency-Key must replay that 202, not write again — here
    the second write would silently undo a later one."""
    root = root_factory(window_ms=1500)
    name, tok = root.producer()
    c = root.client(tok)
    first = {"Idempotency-Key": "x"}
    async_ = {"async": "true"}
    r1 = c.put(f"/v1/kv/{name}/k", content=b"v1", params=async_, headers=first)
    r2 = c.put(f"/v1/kv/{name}/k", content=b"v2", params=async_)
    retry = c.put(f"/v1/kv/{name}/k", content=b"v1", params=async_, headers=first)
    assert r1.status_code == r2.status_code == retry.status_code == 202
    assert "idempotent-replayed" not in r1.headers
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == r1.json()
    wait_until(lambda: c.get(f"/v1/kv/{name}/k").content == b"v2", 30, "the async writes")
    # After the commit the retry gets the stored answer: what the store did with it. (The
    # commit is readable a moment before the loop hears of it and ends the in-flight
    # entry: a retry in between still replays the 202, which is true too.)
    retries: list[httpx.Response] = []

    def answered() -> bool:
        r: httpx.Response = c.put(f"/v1/kv/{name}/k", content=b"v1", params=async_, headers=first)
        retries.append(r)
        return r.status_code != 202

    wait_until(answered, 30, "the retry answered from the store")
    assert all(r.headers["idempotent-replayed"] == "true" for r in retries)
    after = retries[-1]
    assert after.status_code == 200 and after.json()["status"] == "superseded", after.json()
    assert c.get(f"/v1/kv/{name}/k").content == b"v2"


def test_a_route_spelt_with_escapes_is_refused_not_keyed_wrong(shared_root: Root) -> None:
    """The route is matched on the decoded path and the key cut from the raw one:
    ``/v1/k%76/P/a`` was keyed ``6/P/a`` (a 403 naming a key never sent; a 200 for another
    key than meant had the producer owned ``6/``)."""
    name, tok = shared_root.producer()
    host, port = shared_root.url.removeprefix("http://").split(":")
    for path in (f"/v1/k%76/{name}/a", f"/v1/kv%2F{name}/a", f"/v1%2Fkv/{name}/a"):
        for method in ("PUT", "GET", "DELETE"):
            with socket.create_connection((host, int(port)), 10) as s:
                s.settimeout(10)
                body = b"v" if method == "PUT" else b""
                head = (
                    f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tok}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                s.sendall(head.encode() + body)
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
            status = int(reply.split(b" ", 2)[1])
            assert status in (400, 404), (method, path, reply[:300])
            assert b"6/" not in reply and b"2F" not in reply, reply[:300]
    assert shared_root.client(tok).get(f"/v1/kv/{name}/a").status_code == 404


def test_the_log_last_seq_metric_is_the_stores_after_a_restart(root_factory: Any) -> None:
    """It read 0 after a restart until the first producer batch (and missed an ACL change
    committed beside the batcher): every replica then looked thousands of seqs ahead."""
    root = root_factory()
    name, tok = root.producer()
    assert root.client(tok).put(f"/v1/kv/{name}/a", content=b"v").status_code == 200
    root.procs.terminate(root.proc)
    root.start()

    def gauge() -> float:
        return metrics.value(root.client().get("/metrics").text, "mercury_log_last_seq")

    seq = root.client().get("/v1/status").json()["seq"]
    assert seq > 0 and gauge() == seq
    root.producer()  # an ACL change: committed by the admin API, not a batch
    assert gauge() == root.client().get("/v1/status").json()["seq"] > seq
