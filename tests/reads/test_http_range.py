"""Bulk and range reads of the replica HTTP API (real process, real LMDB)."""

from __future__ import annotations

import base64
import json

import httpx

from store.ops import DELETE, SET, Op
from store.store import Store
from tests.reads.conftest import StartReads, put

NDJSON = "application/x-ndjson"


def _pages(c: httpx.Client, params: dict[str, str]) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    while True:
        q = dict(params)
        if cursor:
            q["cursor"] = cursor
        doc = c.get("/v1/range", params=q).json()
        pages.append([it["key"] for it in doc["items"]])
        cursor = doc["next_cursor"]
        if cursor is None:
            return pages


def test_get_bulk_returns_values_and_nulls(store: Store, start_reads: StartReads) -> None:
    put(store, {b"a": b"1", b"b": b"\xff\x00", b"\xfe": b"x"})
    srv = start_reads()
    with httpx.Client(base_url=srv.url) as c:
        r = c.post(
            "/v1/get_bulk",
            json={"keys": ["a", "b", "missing"], "keys_b64": [base64.b64encode(b"\xfe").decode()]},
        )
        assert r.status_code == 200
        doc = r.json()
        assert doc["values"] == {"a": "1", "missing": None}
        assert doc["values_b64"] == {"b": "/wA=", "/g==": "eA=="}
        r = c.post("/v1/get_bulk", json={"keys": [""]})
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/problem+json"


def test_range_by_prefix_pages_cover_every_key_once_in_order(
    store: Store, start_reads: StartReads
) -> None:
    put(store, {f"p/{i:04d}".encode(): b"v" for i in range(250)})
    put(store, {b"o": b"x", b"q": b"y"})
    srv = start_reads()
    with httpx.Client(base_url=srv.url) as c:
        pages = _pages(c, {"prefix": "p/", "limit": "100"})
        assert [len(p) for p in pages] == [100, 100, 50]
        flat = [k for p in pages for k in p]
        assert flat == [f"p/{i:04d}" for i in range(250)]
        r = c.get("/v1/range", params={"start": "p/0010", "end": "p/0013"})
        assert r.headers["x-mercury-seq"] == str(store.last_seq())
        doc = r.json()
        assert [i["key"] for i in doc["items"]] == ["p/0010", "p/0011", "p/0012"]
        assert doc["items"][0]["value"] == "v"
        assert doc["next_cursor"] is None
        doc = c.get("/v1/range", params={"prefix": "p/", "limit": "2", "keys_only": "true"})
        assert doc.json()["items"] == [{"key": "p/0000"}, {"key": "p/0001"}]


def test_pages_cover_every_surviving_key_exactly_once_while_writes_land(
    store: Store, start_reads: StartReads
) -> None:
    put(store, {f"k{i:04d}".encode(): b"v" for i in range(0, 400, 2)})
    srv = start_reads()
    seen: list[str] = []
    cursor = None
    n = 0
    with httpx.Client(base_url=srv.url) as c:
        while True:
            q = {"prefix": "k", "limit": "37"}
            if cursor:
                q["cursor"] = cursor
            doc = c.get("/v1/range", params=q).json()
            seen += [i["key"] for i in doc["items"]]
            cursor = doc["next_cursor"]
            # between pages: insert odd keys everywhere, delete some new ones, rewrite others
            store.apply(
                [
                    Op(SET, f"k{n * 7 % 400 | 1:04d}".encode(), b"new", "t"),
                    Op(SET, f"k{(n * 13) % 400 // 2 * 2:04d}".encode(), b"v%d" % n, "t"),
                    Op(DELETE, f"k{n * 11 % 400 | 1:04d}".encode(), b"", "t"),
                ]
            )
            n += 1
            if cursor is None:
                break
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert {f"k{i:04d}" for i in range(0, 400, 2)} <= set(seen)


def test_cursor_of_another_range_and_bad_params_are_refused(
    store: Store, start_reads: StartReads
) -> None:
    put(store, {b"a1": b"", b"a2": b"", b"b1": b""})
    srv = start_reads()
    with httpx.Client(base_url=srv.url) as c:
        cur = c.get("/v1/range", params={"prefix": "a", "limit": "1"}).json()["next_cursor"]
        r = c.get("/v1/range", params={"prefix": "b", "cursor": cur})
        assert r.status_code == 400 and r.json()["type"].endswith("invalid-cursor")
        assert c.get("/v1/range", params={"cursor": "!!"}).status_code == 400
        assert c.get("/v1/range", params={"limit": "0"}).status_code == 400
        nd = {"Accept": "application/x-ndjson"}
        assert c.get("/v1/range", params={"limit": "0"}, headers=nd).status_code == 400
        assert c.get("/v1/range", params={"limit": "x"}).status_code == 400
        assert c.get("/v1/range", params={"prefix": "a", "start": "b"}).status_code == 400
        assert c.get("/v1/range", params={"start": "b", "end": "a"}).status_code == 400


def test_ndjson_streams_every_item(store: Store, start_reads: StartReads) -> None:
    put(store, {f"s/{i:05d}".encode(): b"val%d" % i for i in range(3000)})
    put(store, {b"s/\xff": b"\x01\xfe"})
    srv = start_reads()
    with (
        httpx.Client(base_url=srv.url) as c,
        c.stream(
            "GET", "/v1/range", params={"prefix": "s/"}, headers={"Accept": "application/x-ndjson"}
        ) as r,
    ):
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert len(lines) == 3001
    assert lines[0] == {"key": "s/00000", "value": "val0"}
    assert lines[-1] == {"key_b64": base64.b64encode(b"s/\xff").decode(), "value_b64": "Af4="}


def test_root_refuses_range_reads_pointing_to_consumer_nodes(
    store: Store, start_reads: StartReads
) -> None:
    put(store, {b"a": b"1"})
    srv = start_reads(role="root")
    with httpx.Client(base_url=srv.url) as c:
        r = c.get("/v1/range", params={"prefix": "a"})
        assert r.status_code == 421
        assert r.headers["content-type"] == "application/problem+json"
        assert "consumer node" in r.json()["hint"]
        assert c.get("/v1/kv/a").content == b"1"


def test_pages_of_large_values_stop_at_the_byte_bound(
    store: Store, start_reads: StartReads
) -> None:
    big = b"x" * (1 << 20)
    for i in range(0, 40, 10):
        put(store, {b"big/%02d" % j: big for j in range(i, i + 10)})
    srv = start_reads()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        pages = _pages(c, {"prefix": "big/", "limit": "1000"})
        assert [len(p) for p in pages] == [16, 16, 8]
        assert [k for p in pages for k in p] == [f"big/{j:02d}" for j in range(40)]
        with c.stream(
            "GET", "/v1/range", params={"prefix": "big/"}, headers={"Accept": NDJSON}
        ) as r:
            assert sum(1 for line in r.iter_lines() if line) == 40


def test_get_bulk_over_the_byte_bound_is_refused_with_413(
    store: Store, start_reads: StartReads
) -> None:
    big = b"y" * (4 << 20)
    names = [f"huge/{i:02d}" for i in range(17)]  # 68 MiB > 64 MiB
    for n in names:
        put(store, {n.encode(): big})
    srv = start_reads()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/get_bulk", json={"keys": names})
        assert r.status_code == 413
        assert r.headers["content-type"] == "application/problem+json"
        assert "fewer keys" in r.json()["hint"]
        r = c.post("/v1/get_bulk", json={"keys": names[:3]})
        assert r.status_code == 200 and len(r.json()["values"]["huge/02"]) == 4 << 20
