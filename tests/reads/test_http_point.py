"""Point reads, status, health and metrics of the replica HTTP read API (real process)."""

from __future__ import annotations

import httpx

from core.problems import NO_SUCH_KEY_TYPE, NO_SUCH_ROUTE_TYPE
from store.store import Store
from tests.reads.conftest import StartReads, put


def test_point_get_returns_value_with_etag_and_applied_seq(
    store: Store, start_reads: StartReads
) -> None:
    put(store, {b"a/1": b"one"})
    seq = put(store, {b"b": b"\x00\xffbin"})
    srv = start_reads()
    with httpx.Client(base_url=srv.url) as c:
        r = c.get("/v1/kv/a%2F1")
        assert r.status_code == 200
        assert r.content == b"one"
        assert r.headers["etag"] == '"1"'
        assert r.headers["x-mercury-seq"] == str(seq)
        r = c.get("/v1/kv/b")
        assert r.content == b"\x00\xffbin"
        assert r.headers["etag"] == f'"{seq}"'
        head = c.head("/v1/kv/b")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-length"] == "5"
        r = c.get("/v1/kv/b", headers={"If-None-Match": f'"{seq}"'})
        assert r.status_code == 304 and r.headers["etag"] == f'"{seq}"'
        # a 304's Content-Length could only be the 200's (RFC 9110): none is sent
        assert "content-length" not in r.headers


def test_point_get_sees_writes_of_another_process(store: Store, start_reads: StartReads) -> None:
    srv = start_reads()
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/v1/kv/k").status_code == 404
        seq = put(store, {b"k": b"v1"})
        r = c.get("/v1/kv/k")
        assert (r.status_code, r.content, r.headers["x-mercury-seq"]) == (200, b"v1", str(seq))


def test_missing_key_and_bad_key_answer_problem_json(store: Store, start_reads: StartReads) -> None:
    srv = start_reads()
    with httpx.Client(base_url=srv.url) as c:
        r = c.get("/v1/kv/nope")
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["status"] == 404
        assert r.json()["type"] == NO_SUCH_KEY_TYPE
        # a wrong base URL (no /v1) is no route, never a key that is absent
        for path in ("/kv/nope", "/v2/kv/nope", "/v1/kvv/nope"):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["type"] == NO_SUCH_ROUTE_TYPE, path
            assert path in r.json()["detail"]
        r = c.get("/v1/kv/" + "x" * 501)
        assert r.status_code == 400 and r.json()["type"].endswith("invalid-read")


def test_status_healthz_and_metrics(store: Store, start_reads: StartReads) -> None:
    seq = put(store, {b"k": b"v"})
    srv = start_reads()
    with httpx.Client(base_url=srv.url) as c:
        st = c.get("/v1/status").json()
        assert st["db_id"] == store.db_id
        assert st["role"] == "replica"
        assert st["seq"] == seq
        assert st["hash_head"] == store.head()[1].hex()
        assert c.get("/healthz").status_code == 200
        c.get("/v1/kv/k")
        text = c.get("/metrics").text
        assert 'mercury_read_seconds_count{op="http_get"}' in text


def test_writes_unknown_paths_and_bad_bodies_answer_problem_json(
    store: Store, start_reads: StartReads
) -> None:
    srv = start_reads()
    with httpx.Client(base_url=srv.url) as c:
        for method in ("PUT", "POST", "DELETE", "PATCH"):
            # a key no route pattern matches too (a newline in it)
            for path in ("/v1/kv/k", "/v1/kv/a%0Ab"):
                r = c.request(method, path, content=b"v")
                assert r.status_code == 405 and "gateway" in r.json()["hint"], (method, path)
                assert r.headers["content-type"] == "application/problem+json"
                assert r.headers["allow"] == "GET, HEAD"  # what a 405 must name
        r = c.post("/v1/status")  # a method the path does not take: Allow names the ones it does
        assert (r.status_code, r.headers["allow"]) == (405, "GET")
        assert r.headers["content-type"] == "application/problem+json"
        r = c.get("/v1/nope")
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
        r = c.post("/v1/get_bulk", json={"keys": "notalist"})
        assert r.status_code == 400 and r.json()["type"].endswith("invalid-read")
    assert store.get(b"k") is None


def test_a_get_bulk_body_naming_keys_twice_is_refused_as_a_bad_body(
    store: Store, start_reads: StartReads
) -> None:
    """``{"keys": [a], "keys": [b]}`` was served as b (the last); a proxy or audit tool
    reading the first sees a. Refused with the status and problem type of a body that is
    not JSON, naming the member."""
    put(store, {b"a": b"1", b"b": b"2"})
    srv = start_reads()
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=srv.url, headers=headers) as c:
        bad = c.post("/v1/get_bulk", content=b'{"keys": ["a", ')
        r = c.post("/v1/get_bulk", content=b'{"keys": ["a"], "keys": ["b"]}')
        assert r.status_code == bad.status_code == 400, r.text
        assert r.headers["content-type"] == bad.headers["content-type"]
        assert r.headers["content-type"] == "application/problem+json"
        doc = r.json()
        assert (doc["type"], doc["title"]) == (bad.json()["type"], bad.json()["title"])
        assert "'keys' appears more than once" in doc["detail"]
        r = c.post("/v1/get_bulk", content=b'{"keys": ["a", "b"]}')
        assert r.status_code == 200 and r.json()["values"] == {"a": "1", "b": "2"}
