"""Arbitrary range parameters, keys and bulk bodies never make the read API fail: every
answer is 2xx/4xx, errors are problem+json (real process, hypothesis-generated input)."""

from __future__ import annotations

from urllib.parse import quote_from_bytes

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.store import Store
from tests.reads.conftest import StartReads, put

raw = st.binary(max_size=12)
params = st.fixed_dictionaries(
    {},
    optional={
        "prefix": raw,
        "start": raw,
        "end": raw,
        "cursor": st.one_of(raw, st.sampled_from([b"AQ", b"AQAAAAAAAAAAAGs"])),
        "limit": st.one_of(st.integers(-5, 20_000).map(lambda n: str(n).encode()), raw),
        "keys_only": st.sampled_from([b"true", b"false", b"1", b"x"]),
    },
)


def test_fuzzed_reads_answer_2xx_or_problem_4xx(store: Store, start_reads: StartReads) -> None:
    put(store, {bytes([i, j]): b"v" for i in (0, 97, 98, 255) for j in range(0, 256, 51)})
    srv = start_reads()
    with httpx.Client(base_url=srv.url, timeout=10) as c:

        @settings(
            max_examples=150,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(params, st.booleans())
        def check_range(p: dict[str, bytes], ndjson: bool) -> None:
            qs = "&".join(f"{k}={quote_from_bytes(v, safe='')}" for k, v in p.items())
            headers = {"Accept": "application/x-ndjson"} if ndjson else {}
            r = c.get("/v1/range?" + qs, headers=headers)
            assert r.status_code in (200, 400), r.text
            if r.status_code == 400:
                assert r.headers["content-type"] == "application/problem+json"

        @settings(max_examples=100, deadline=None)
        @given(st.binary(min_size=0, max_size=600))
        def check_get(key: bytes) -> None:
            # dots encoded too: a client would otherwise resolve "." and ".." segments
            r = c.get("/v1/kv/" + quote_from_bytes(key, safe="").replace(".", "%2E"))
            assert r.status_code in (200, 400, 404), r.text

        @settings(max_examples=100, deadline=None)
        @given(
            st.one_of(
                st.dictionaries(st.sampled_from(["keys", "keys_b64", "x"]), st.lists(st.text())),
                st.text(),
                st.integers(),
            )
        )
        def check_bulk(body: object) -> None:
            r = c.post("/v1/get_bulk", json=body)
            assert r.status_code in (200, 400), r.text

        check_range()
        check_get()
        check_bulk()
