"""Write semantics that never silently do the wrong thing, against a real `mercury root`:
Idempotency-Key bound to its request, quota answers a client can honour, answers that
agree with what the store did, conditions never ignored, and prefix deletes."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.answers import Answer
from gateway.idempotency import Hold, Idempotency, fingerprint, store_key
from mercury_client import Client
from store.store import Store
from tests.gateway.conftest import Root

PROBLEM = "application/problem+json"


def _problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["detail"]
    return body


def _seq(root: Root) -> int:
    return int(root.client().get("/v1/status").json()["seq"])


# --- 1. Idempotency-Key: bound to its request, per producer, with a TTL ------------------


def test_idempotency_key_replays_the_same_request_and_refuses_another(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    h = {"Idempotency-Key": "one"}
    first = c.put(f"/v1/kv/{name}/k", content=b"1", headers=h)
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    version = first.json()["seq"]
    again = c.put(f"/v1/kv/{name}/k", content=b"1", headers=h)
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    # the same key with another body, another path, another condition, another method:
    # each refused with 422 naming the conflict, none applied, none answered as the first
    for r in (
        c.put(f"/v1/kv/{name}/k", content=b"2", headers=h),
        c.put(f"/v1/kv/{name}/other", content=b"1", headers=h),
        c.put(f"/v1/kv/{name}/k", content=b"1", headers={**h, "If-None-Match": "*"}),
        c.delete(f"/v1/kv/{name}/k", headers=h),
        c.post(
            "/v1/batch", json={"ops": [{"op": "set", "key": f"{name}/k", "value": "1"}]}, headers=h
        ),
    ):
        p = _problem(r, 422)
        assert p["type"].endswith("/idempotency-key-reused") and p["idempotency_key"] == "one"
        assert "idempotent-replayed" not in r.headers
    got = c.get(f"/v1/kv/{name}/k")  # none of them touched the key
    assert got.content == b"1" and got.headers["etag"] == f'"{version}"'
    assert c.get(f"/v1/kv/{name}/other").status_code == 404


def test_idempotency_fingerprint_of_a_large_body(shared_root: Root) -> None:
    """Bodies from 1 MiB are hashed off the event loop: same answers as small ones."""
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    h = {"Idempotency-Key": "big"}
    value = bytes(range(256)) * (3 << 12)  # 3 MiB
    first = c.put(f"/v1/kv/{name}/big", content=value, headers=h)
    again = c.put(f"/v1/kv/{name}/big", content=value, headers=h)
    assert first.status_code == again.status_code == 200 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    _problem(c.put(f"/v1/kv/{name}/big", content=value[:-1] + b"x", headers=h), 422)


def test_idempotency_keys_are_per_producer(shared_root: Root) -> None:
    a, tok_a = shared_root.producer()
    b, tok_b = shared_root.producer()
    h = {"Idempotency-Key": "shared-name"}
    ra = shared_root.client(tok_a).put(f"/v1/kv/{a}/x", content=b"a", headers=h)
    # B's request with A's key is B's own first request: applied, not replayed, not 422
    rb = shared_root.client(tok_b).put(f"/v1/kv/{b}/x", content=b"b", headers=h)
    assert ra.status_code == rb.status_code == 200
    assert "idempotent-replayed" not in rb.headers
    assert shared_root.client(tok_b).get(f"/v1/kv/{b}/x").content == b"b"


def test_idempotency_answers_expire_after_the_ttl(tmp_path: Path) -> None:
    """A stored answer older than idempotency_ttl_s is not served (even before the GC
    collects it): the key then names a new request."""
    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 24)
    try:
        # Two views of the same stored answers: under a TTL of a minute the answer is
        # young, whatever the machine's speed; under 0.3 s it is old once the test has
        # slept past that.
        young, idem = Idempotency(store, ttl_s=60), Idempotency(store, ttl_s=0.3)
        key = store_key("p", "k")
        fp1 = fingerprint("PUT", b"/v1/kv/p/a", b"", {}, b"1")
        fp2 = fingerprint("PUT", b"/v1/kv/p/a", b"", {}, b"2")
        store.apply(
            [],
            answers=lambda _r: [(key, b'{"status":200,"body":{"n":1},"fp":"%s"}' % fp1.encode())],
        )
        calls: list[int] = []

        async def write(_hold: Hold) -> Answer:
            calls.append(1)
            return Answer(200, {"n": 2}, {})

        async def scenario() -> None:
            replay = await young.once(key, "k", fp1, write)
            assert replay.body == {"n": 1} and replay.headers["Idempotent-Replayed"] == "true"
            conflict = await young.once(key, "k", fp2, write)
            assert conflict.status == 422 and not calls
            # Deliberate: the stored answer must grow older than the 0.3 s TTL.
            await asyncio.sleep(0.5)
            fresh = await idem.once(key, "k", fp2, write)
            assert fresh.body == {"n": 2} and calls == [1]

        asyncio.run(scenario())
    finally:
        store.close()


# --- 2. Quota answers a client can honour -------------------------------------------------


def test_a_batch_no_wait_can_admit_is_413_with_the_largest_admissible(shared_root: Root) -> None:
    quota = {"ops_per_s": 2, "burst": 3, "max_delay_ms": 500}
    name, tok = shared_root.producer(quota=quota)
    c = shared_root.client(tok)
    ops = [{"op": "set", "key": f"{name}/{i}", "value": "v"} for i in range(5)]
    r = c.post("/v1/batch", json={"ops": ops})
    p = _problem(r, 413)
    # burst 3 + 2 ops/s x 0.5 s of hold = 4 ops at most, whatever the wait
    assert p["max_ops"] == 4 and p["ops"] == 5 and "retry-after" not in r.headers
    assert "max_bytes" not in p  # no bytes quota: unlimited
    ok = c.post("/v1/batch", json={"ops": ops[:4]})
    assert ok.status_code == 200 and ok.json()["written"] == 4


def test_the_sdk_honours_the_quota_answers_and_writes_everything(shared_root: Root) -> None:
    """End to end: the SDK re-cuts on the 413's max_ops and waits out each 429's
    Retry-After; every op lands, once."""
    quota = {"ops_per_s": 4, "burst": 3, "max_delay_ms": 250}
    name, tok = shared_root.producer(quota=quota)
    with Client(shared_root.url, tok) as client:
        total = client.batch([("set", f"{name}/{i}", f"v{i}") for i in range(10)])
    assert total.written == 10
    c = shared_root.client(tok)
    assert all(c.get(f"/v1/kv/{name}/{i}").content == f"v{i}".encode() for i in range(10))
    q = c.get(f"/v1/usage/{name}").json()["quota_ops"]
    assert q["too_large"] == 10  # the first try, then pieces of at most 4


def test_bytes_over_the_bytes_quota_are_413_with_max_bytes(shared_root: Root) -> None:
    quota = {"bytes_per_s": 100, "bytes_burst": 100, "max_delay_ms": 0}
    name, tok = shared_root.producer(quota=quota)
    c = shared_root.client(tok)
    key = f"{name}/big"
    p = _problem(c.put(f"/v1/kv/{key}", content=b"x" * 150), 413)
    assert p["max_bytes"] == 100 and p["bytes"] == len(key) + 150
    assert c.put(f"/v1/kv/{key}", content=b"x" * (100 - len(key))).status_code == 200


def _ratelimit_t(header: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r'"(\w+)";r=\d+;t=(\d+)', header)}


def test_a_429s_retry_after_agrees_with_ratelimit_and_comes_true(shared_root: Root) -> None:
    quota = {"ops_per_s": 1, "burst": 2, "max_delay_ms": 0}
    name, tok = shared_root.producer(quota=quota)
    c = shared_root.client(tok)
    ops = [{"op": "set", "key": f"{name}/{i}", "value": "v"} for i in range(2)]
    assert c.post("/v1/batch", json={"ops": ops}).status_code == 200
    r = c.post("/v1/batch", json={"ops": ops})
    _problem(r, 429)
    retry = int(r.headers["retry-after"])
    t = _ratelimit_t(r.headers["ratelimit"])
    assert retry == max(t.values()) == t["ops"] and 1 <= retry <= 2
    # Deliberate: what is under test is that the Retry-After comes true once waited out.
    time.sleep(retry + 0.05)
    again = c.post("/v1/batch", json={"ops": ops})
    assert again.status_code == 200, again.text
    # held, refused and too-large ops are counted apart
    q2 = {"ops_per_s": 10, "burst": 1, "max_delay_ms": 1000}
    n2, tok2 = shared_root.producer(quota=q2)
    c2 = shared_root.client(tok2)
    # Two ops over a burst of one are held 0.1 s however fast the machine is (two PUTs
    # would be held only if the second came within 0.1 s of the first).
    two = [{"op": "set", "key": f"{n2}/{k}", "value": "v"} for k in "ab"]
    assert c2.post("/v1/batch", json={"ops": two}).status_code == 200
    big = [{"op": "delete", "key": f"{n2}/{i}"} for i in range(50)]
    _problem(c2.post("/v1/batch", json={"ops": big}), 413)
    u2 = shared_root.client(tok2).get(f"/v1/usage/{n2}").json()["quota_ops"]
    assert u2["held"] == 2 and u2["too_large"] == 50 and u2["refused"] == 0
    u = c.get(f"/v1/usage/{name}").json()["quota_ops"]
    assert u["refused"] == 2 and u["held"] == 0
    metrics = shared_root.client().get("/metrics").text
    assert f'mercury_quota_ops_total{{outcome="refused",producer="{name}"}} 2.0' in metrics
    assert f'mercury_write_ops_total{{producer="{name}",result="throttled"}} 2.0' in metrics


# --- 3. Answers that agree with themselves ------------------------------------------------


def test_set_then_delete_of_an_absent_key_says_what_the_store_did(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    key = f"{name}/new"
    ops = [{"op": "set", "key": key, "value": "x"}, {"op": "delete", "key": key}]
    r = c.post("/v1/batch", params={"results": "true"}, json={"ops": ops})
    body = r.json()
    assert r.status_code == 200
    # applied one after the other, as sent: the set wrote, the delete deleted what it wrote
    written = body["results"][0]["seq"]
    assert written > 0
    assert body["results"] == [
        {"key": key, "status": "written", "seq": written},
        {"key": key, "status": "deleted", "seq": written + 1},
    ]
    assert (body["written"], body["deleted"], body["absent"]) == (1, 1, 0)
    assert body["seq"] == written + 1 <= _seq(shared_root)
    assert c.get(f"/v1/kv/{key}").status_code == 404
    # two sets of one key: the first is superseded (never stored), at the second's seq
    ops = [{"op": "set", "key": key, "value": "1"}, {"op": "set", "key": key, "value": "2"}]
    body = c.post("/v1/batch", params={"results": "true"}, json={"ops": ops}).json()
    seq = body["seq"]
    assert body["results"] == [
        {"key": key, "status": "superseded", "seq": seq},
        {"key": key, "status": "written", "seq": seq},
    ]
    assert (body["written"], body["superseded"]) == (1, 1)
    assert c.get(f"/v1/kv/{key}").headers["etag"] == f'"{seq}"'
    # ... and a set replaced by a duplicate of the stored value: nothing written at all
    ops = [{"op": "set", "key": key, "value": "3"}, {"op": "set", "key": key, "value": "2"}]
    body = c.post("/v1/batch", json={"ops": ops}).json()
    assert (body["written"], body["superseded"], body["duplicates"]) == (0, 1, 1)
    assert body["seq"] == seq
    got = c.get(f"/v1/kv/{key}")
    assert got.content == b"2" and got.headers["etag"] == f'"{seq}"'


def test_batch_totals_add_up_and_results_name_each_op(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    assert c.put(f"/v1/kv/{name}/same", content=b"s").status_code == 200
    raw_b64 = base64.b64encode(f"{name}/".encode() + b"\xff").decode()  # not UTF-8
    ops = [
        {"op": "set", "key": f"{name}/a", "value": "1"},
        {"op": "set", "key": f"{name}/same", "value": "s"},
        {"op": "delete", "key": f"{name}/gone"},
        {"op": "set", "key_b64": raw_b64, "value": "b"},
    ]
    r = c.post("/v1/batch", params={"results": "1"}, json={"ops": ops})
    body = r.json()
    assert r.status_code == 200, r.text
    totals = ("written", "deleted", "duplicates", "absent", "superseded", "precondition_failed")
    assert sum(body[k] for k in totals) == len(ops)
    assert [x["status"] for x in body["results"]] == ["written", "duplicate", "absent", "written"]
    assert body["results"][3] == {"key_b64": raw_b64, "status": "written", "seq": body["seq"]}
    assert body["seq"] == max(x["seq"] for x in body["results"])
    # without ?results and without conditions: totals only
    plain = c.post("/v1/batch", json={"ops": [{"op": "set", "key": f"{name}/b", "value": "1"}]})
    assert "results" not in plain.json()


def test_root_get_names_the_keys_version(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    seq = c.put(f"/v1/kv/{name}/v", content=b"1").json()["seq"]
    c.put(f"/v1/kv/{name}/other", content=b"1")
    r = c.get(f"/v1/kv/{name}/v")
    assert r.headers["etag"] == f'"{seq}"'
    assert r.headers["x-mercury-version"] == r.headers["x-mercury-seq"] == str(seq)


# --- 4. Conditions are never silently ignored ---------------------------------------------


def test_if_match_on_a_batch_is_refused_not_ignored(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    ops = [{"op": "set", "key": f"{name}/a", "value": "1"}]
    for h in ({"If-Match": '"5"'}, {"If-None-Match": "*"}):
        p = _problem(c.post("/v1/batch", json={"ops": ops}, headers=h), 400)
        assert "if_seq" in p["hint"]
    assert c.get(f"/v1/kv/{name}/a").status_code == 404
    # a misspelt per-op condition is refused too, never run unconditionally
    bad = [{"op": "set", "key": f"{name}/a", "value": "1", "if_sq": 3}]
    p = _problem(c.post("/v1/batch", json={"ops": bad}), 400)
    assert "if_sq" in p["detail"]
    for cond in (
        {"if_seq": -1},
        {"if_seq": "3"},
        {"if_absent": 1},
        {"if_absent": True, "if_seq": 4},
        {"if_seq": None},  # null is not "no condition": it was run unconditionally
        {"if_absent": None},
    ):
        _problem(c.post("/v1/batch", json={"ops": [{**ops[0], **cond}]}), 400)
    # a delete with a value is a set misspelt: refused, not run as a delete
    gone = {"op": "delete", "key": f"{name}/a", "value": "1"}
    assert "no value" in _problem(c.post("/v1/batch", json={"ops": [gone]}), 400)["detail"]
    assert c.get(f"/v1/kv/{name}/a").status_code == 404


def test_a_conditional_write_cannot_be_async(shared_root: Root) -> None:
    """A 202 is sent before the commit decides the condition: its outcome could never be
    reported, so the combination is refused rather than the condition silently lost."""
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    q = {"async": "true"}
    _problem(c.put(f"/v1/kv/{name}/a", content=b"1", params=q, headers={"If-Match": '"0"'}), 400)
    _problem(c.delete(f"/v1/kv/{name}/a", params=q, headers={"If-None-Match": "*"}), 400)
    op = {"op": "set", "key": f"{name}/a", "value": "1", "if_absent": True}
    _problem(c.post("/v1/batch", params=q, json={"ops": [op]}), 400)
    assert c.get(f"/v1/kv/{name}/a").status_code == 404
    # unconditional async writes still answer 202
    assert c.put(f"/v1/kv/{name}/a", content=b"1", params=q).status_code == 202


def test_per_op_conditions_are_checked_at_commit(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    v1 = c.put(f"/v1/kv/{name}/x", content=b"1").json()["seq"]
    ops = [
        {"op": "set", "key": f"{name}/x", "value": "2", "if_seq": v1},  # holds
        {"op": "set", "key": f"{name}/y", "value": "1", "if_absent": True},  # holds
        {"op": "set", "key": f"{name}/z", "value": "1", "if_seq": 0},  # 0 = absent: holds
        {"op": "delete", "key": f"{name}/x", "if_seq": v1},  # x is now at a newer seq
    ]
    body = c.post("/v1/batch", json={"ops": ops}).json()
    st = [(r["status"], r["seq"]) for r in body["results"]]  # present: the ops had conditions
    assert [s for s, _ in st] == ["written", "written", "written", "precondition_failed"]
    assert st[3][1] == st[0][1]  # the failed condition reports the key's current version
    assert body["written"] == 3 and body["precondition_failed"] == 1
    assert c.get(f"/v1/kv/{name}/x").content == b"2"
    # if_absent on a present key fails and changes nothing
    again = c.post("/v1/batch", json={"ops": [ops[1]]}).json()
    assert again["results"][0]["status"] == "precondition_failed" and again["written"] == 0


def test_if_match_zero_means_absent(shared_root: Root) -> None:
    """`If-Match: "0"` is documented as "the key is absent" (the same as
    `If-None-Match: *`): it creates an absent key and fails on a present one."""
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    h = {"If-Match": '"0"'}
    created = c.put(f"/v1/kv/{name}/z", content=b"1", headers=h)
    assert created.status_code == 200 and created.json()["status"] == "written"
    p = _problem(c.put(f"/v1/kv/{name}/z", content=b"2", headers=h), 412)
    assert p["current_seq"] == created.json()["seq"]
    assert c.get(f"/v1/kv/{name}/z").content == b"1"
    # deleting with "0" an absent key: the condition holds and the key stays absent
    r = c.delete(f"/v1/kv/{name}/never", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "absent"


# --- 5. DELETE /v1/kv?prefix=P ------------------------------------------------------------


def test_prefix_delete_is_bounded_by_the_mass_delete_guard(shared_root: Root) -> None:
    name, tok = shared_root.producer(guards={})
    ks = f"{name}/"
    admin = shared_root.admin()
    r = admin.put(
        f"/v1/admin/producers/{name}",
        json={"keyspaces": [ks], "guards": {ks: {"max_deletes_per_batch": 3}}},
    )
    assert r.status_code in (200, 201), r.text
    c = shared_root.client(tok)
    ops = [{"op": "set", "key": f"{ks}d/{i}", "value": "v"} for i in range(7)]
    ops.append({"op": "set", "key": f"{ks}keep", "value": "v"})
    assert c.post("/v1/batch", json={"ops": ops}).json()["written"] == 8
    rounds = []
    for _ in range(5):
        body = c.delete("/v1/kv", params={"prefix": f"{ks}d/"}).json()
        rounds.append((body["deleted"], body["more"]))
        if not body["more"]:
            break
    assert rounds == [(3, True), (3, True), (1, False)]
    assert c.delete("/v1/kv", params={"prefix": f"{ks}d/"}).json() == {
        "seq": 0,
        "written": 0,
        "deleted": 0,
        "duplicates": 0,
        "absent": 0,
        "superseded": 0,
        "precondition_failed": 0,
        "more": False,
    }
    assert all(c.get(f"/v1/kv/{ks}d/{i}").status_code == 404 for i in range(7))
    assert c.get(f"/v1/kv/{ks}keep").status_code == 200


def test_a_prefix_delete_that_can_never_delete_is_refused_not_more_for_ever(
    shared_root: Root,
) -> None:
    """A guard of 0 deletes per batch answered {"deleted": 0, "more": true} for ever (the
    docs say: retry after the batch window); it is a 400, like a single-key delete."""
    name, tok = shared_root.producer(guards={})
    ks = f"{name}/"
    r = shared_root.admin().put(
        f"/v1/admin/producers/{name}",
        json={"keyspaces": [ks], "guards": {ks: {"max_deletes_per_batch": 0}}},
    )
    assert r.status_code in (200, 201), r.text
    c = shared_root.client(tok)
    assert c.put(f"/v1/kv/{ks}a", content=b"v").status_code == 200
    _problem(c.delete(f"/v1/kv/{ks}a"), 400)
    assert "at most 0 deletes" in _problem(c.delete("/v1/kv", params={"prefix": ks}), 400)["detail"]
    # nothing under the prefix: nothing to refuse
    assert c.delete("/v1/kv", params={"prefix": f"{ks}none/"}).json()["more"] is False


def test_a_prefix_delete_is_sized_to_what_the_rate_quota_admits(shared_root: Root) -> None:
    """A producer whose quota admits at most 9 ops per request (burst 4 + 10/s x 0.5 s)
    got a permanent 413 ("split it") for a prefix of 20 keys, which a client cannot split:
    each request now deletes what the quota admits, and `more` says to go on."""
    quota = {"ops_per_s": 10, "burst": 4, "max_delay_ms": 500}
    name, tok = shared_root.producer(quota=quota)
    c = shared_root.client(tok)
    for b in range(5):
        ops = [{"op": "set", "key": f"{name}/{b}{i}", "value": "v"} for i in range(4)]
        r = c.post("/v1/batch", json={"ops": ops})
        assert r.status_code == 200, r.text
    deleted = []
    for _ in range(10):
        r = c.delete("/v1/kv", params={"prefix": f"{name}/"})
        assert r.status_code in (200, 429), r.text  # 429: held past max_delay; retry
        if r.status_code == 429:
            # Deliberate: a client honouring the quota waits out its Retry-After.
            time.sleep(float(r.headers["retry-after"]))
            continue
        deleted.append(r.json()["deleted"])
        if not r.json()["more"]:
            break
    assert sum(deleted) == 20 and max(deleted) <= 9, deleted


def test_prefix_delete_stays_inside_the_producers_keyspaces(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    assert c.put(f"/v1/kv/{name}/a", content=b"v").status_code == 200
    # a prefix wider than the keyspace would reach other producers' keys
    _problem(c.delete("/v1/kv", params={"prefix": name[:1]}), 403)
    _problem(c.delete("/v1/kv"), 400)
    _problem(c.delete("/v1/kv", params={"prefix": ""}), 400)
    for h in ({"If-Match": '"1"'}, {"If-None-Match": "*"}):  # refused, never ignored
        _problem(c.delete("/v1/kv", params={"prefix": f"{name}/"}, headers=h), 400)
    assert c.get(f"/v1/kv/{name}/a").status_code == 200
    body = c.delete("/v1/kv", params={"prefix": f"{name}/"}).json()
    assert body["deleted"] == 1 and body["more"] is False and body["seq"] > 0
    assert c.get(f"/v1/kv/{name}/a").status_code == 404


def test_a_held_request_stays_in_flight_until_its_commit(tmp_path: Path) -> None:
    """`once` with a write that holds (an async 202): a retry replays the 202 until the
    held future completes — also when it fails (the refusal is not a stored answer, so
    the key is then free again)."""
    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 24)
    try:
        idem = Idempotency(store, ttl_s=60)
        key = store_key("p", "k")
        fp = fingerprint("PUT", b"/v1/kv/p/a", b"", {}, b"1")
        calls: list[int] = []

        async def scenario() -> None:
            commit: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def write(hold: Hold) -> Answer:
                calls.append(1)
                hold(commit)
                return Answer(202, {"status": "accepted"}, {})

            first = await idem.once(key, "k", fp, write)
            retry = await idem.once(key, "k", fp, write)
            assert first.status == retry.status == 202 and calls == [1]
            assert retry.headers["Idempotent-Replayed"] == "true"
            commit.set_exception(RuntimeError("commit failed"))
            await asyncio.sleep(0)  # done-callbacks run on the next loop turn
            again = await idem.once(key, "k", fp, write)
            assert again.status == 202 and calls == [1, 1]

        asyncio.run(scenario())
    finally:
        store.close()
