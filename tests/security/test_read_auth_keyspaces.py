"""Read tokens over several keyspaces and on the root (real root and replica processes).

- A consumer reading ``[a/, d)`` with keyspaces ``a/`` and ``c/`` gets the keys of both and
  none of ``b/``, page by page (cursors valid) and as NDJSON; a watch over both is refused
  with a hint (a watch follows one prefix).
- `mercury root --read-auth`: the root's reads take consumer tokens (each its keyspaces),
  producer and admin tokens as before; 401 without a token, 403 outside; range and bulk
  reads stay with consumer nodes (421 once the token may read them); a watch is narrowed to
  the token's keyspace; a revoked or expired token fails on the next request.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from testkit.procs import Procs
from testkit.replication import wait_for
from tests.gateway.conftest import Root, make_root
from tests.replicator.nodes import start_replica

KEYS = ["a/1", "a/2", "b/1", "b/2", "c/1", "c/2", "d/1"]


def _h(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _populate(root: Root) -> dict[str, str]:
    """Producers pa, pb, pc, pd (one keyspace each) write KEYS; consumer `ac` reads a/ and
    c/. Returns every token by owner name."""
    tokens: dict[str, str] = {}
    for ks in "abcd":
        r = root.admin().put(f"/v1/admin/producers/p{ks}", json={"keyspaces": [f"{ks}/"]})
        assert r.status_code in (200, 201), r.text
        r = root.admin().post(f"/v1/admin/producers/p{ks}/tokens")
        assert r.status_code == 201, r.text
        tokens[f"p{ks}"] = r.json()["token"]
    r = root.admin().put("/v1/admin/consumers/ac", json={"keyspaces": ["a/", "c/"]})
    assert r.status_code in (200, 201), r.text
    r = root.admin().post("/v1/admin/consumers/ac/tokens", json={"label": "test"})
    assert r.status_code == 201, r.text
    tokens["ac"] = r.json()["token"]
    tokens["ac_id"] = r.json()["token_id"]
    for k in KEYS:
        r = root.client(tokens[f"p{k[0]}"]).put(f"/v1/kv/{k}", content=k.encode())
        assert r.status_code in (200, 201), r.text
    return tokens


def _pages(base: str, token: str, params: dict[str, str]) -> tuple[list[str], list[str]]:
    """Every key of a paged range (limit 1) and the raw answers."""
    keys: list[str] = []
    raw: list[str] = []
    cursor = None
    for _ in range(20):
        p = {**params, "limit": "1", **({"cursor": cursor} if cursor else {})}
        r = httpx.get(f"{base}/v1/range", params=p, headers=_h(token), timeout=10)
        assert r.status_code == 200, r.text
        raw.append(r.text)
        doc = r.json()
        keys += [it["key"] for it in doc["items"]]
        cursor = doc["next_cursor"]
        if cursor is None:
            return keys, raw
    raise AssertionError("the range never ended")


def test_a_range_across_several_keyspaces_returns_each_of_them(
    tmp_path: Path, procs: Procs
) -> None:
    root = make_root(procs, tmp_path / "root")
    tokens = _populate(root)
    src = int(root.args[3].split(":")[1])
    replica = start_replica(procs, tmp_path / "r1", [src], "--read-auth", name="r1")
    base = f"http://127.0.0.1:{replica.http}"
    ac = tokens["ac"]
    wait_for(
        lambda: httpx.get(f"{base}/v1/kv/c/2", headers=_h(ac), timeout=5).status_code == 200,
        30,
        "replica synced",
    )
    readable = ["a/1", "a/2", "c/1", "c/2"]

    keys, raw = _pages(base, ac, {"start": "a/", "end": "d"})
    assert keys == readable
    assert not any("b/" in t or "d/" in t for t in raw)  # no key name outside, not in cursors
    assert _pages(base, ac, {})[0] == readable  # the whole keyspace
    assert _pages(base, ac, {"start": "a/2", "end": "c/2"})[0] == ["a/2", "c/1"]
    # One page holds keys of both keyspaces.
    r = httpx.get(f"{base}/v1/range", params={"start": "a/"}, headers=_h(ac), timeout=10)
    assert [i["key"] for i in r.json()["items"]] == readable

    nd = httpx.get(
        f"{base}/v1/range",
        params={"start": "a/", "end": "d", "keys_only": "true"},
        headers={**_h(ac), "Accept": "application/x-ndjson"},
        timeout=10,
    )
    assert nd.status_code == 200
    assert [json.loads(x)["key"] for x in nd.text.splitlines() if x] == readable

    # Touching none of them: 403; inside one: as before.
    r = httpx.get(f"{base}/v1/range", params={"prefix": "b/"}, headers=_h(ac), timeout=10)
    assert r.status_code == 403
    assert _pages(base, ac, {"prefix": "c/"})[0] == ["c/1", "c/2"]

    # A watch over both keyspaces: refused with a hint; over one: served.
    r = httpx.get(f"{base}/v1/watch", params={"prefix": ""}, headers=_h(ac), timeout=10)
    assert r.status_code == 403 and "watch each" in r.json()["hint"]
    assert _watch_keys(f"{base}/v1/watch", ac, "c/", 2) == ["c/1", "c/2"]
    root.close_clients()


def _watch_keys(url: str, token: str, prefix: str, want: int) -> list[str]:
    """The keys of the first `want` change lines of a watch from seq 0."""
    keys: list[str] = []
    params = {"prefix": prefix, "from_seq": "0"}
    with httpx.stream("GET", url, params=params, headers=_h(token), timeout=10) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            doc: dict[str, Any] = json.loads(line)
            if "key" in doc:
                keys.append(doc["key"])
            if len(keys) >= want:
                break
    return keys


def test_root_read_auth_takes_consumer_tokens(tmp_path: Path, procs: Procs) -> None:
    root = make_root(procs, tmp_path / "root", "--read-auth")
    tokens = _populate(root)
    url = root.url
    ac = tokens["ac"]

    def get(path: str, token: str | None) -> httpx.Response:
        return httpx.get(f"{url}{path}", headers=_h(token), timeout=10)

    # Point reads: the consumer reads its keyspaces, producers theirs, the admin everything.
    assert get("/v1/kv/a/1", None).status_code == 401
    assert get("/v1/kv/a/1", "mct_unknown").status_code == 401
    r = get("/v1/kv/a/1", ac)
    assert r.status_code == 200 and r.content == b"a/1" and r.headers["etag"]
    assert get("/v1/kv/c/2", ac).content == b"c/2"
    assert get("/v1/kv/b/1", ac).status_code == 403
    assert get("/v1/kv/a/zz", ac).status_code == 404
    assert get("/v1/kv/b/1", tokens["pb"]).status_code == 200
    assert get("/v1/kv/a/1", tokens["pb"]).status_code == 403
    assert get("/v1/kv/d/1", root.admin_token).status_code == 200
    # The consumer's use is its token's last use.
    listed = root.admin().get("/v1/admin/consumers/ac/tokens").json()["tokens"]
    assert listed[0]["last_used"] is not None

    # Bulk and range reads: the token first, then the root's referral to consumer nodes.
    bulk = f"{url}/v1/get_bulk"
    assert httpx.post(bulk, json={"keys": ["a/1"]}, timeout=10).status_code == 401
    r = httpx.post(bulk, json={"keys": ["a/1", "b/1"]}, headers=_h(ac), timeout=10)
    assert r.status_code == 403
    assert httpx.post(bulk, json={"keys": ["a/1"]}, headers=_h(ac), timeout=10).status_code == 421
    assert get("/v1/range?prefix=a/", None).status_code == 401
    assert get("/v1/range?prefix=b/", ac).status_code == 403
    assert get("/v1/range?prefix=a/", ac).status_code == 421

    # Watch: narrowed to the token's keyspace, several refused, none without a token.
    assert get("/v1/watch?prefix=a/", None).status_code == 401
    assert get("/v1/watch?prefix=b/", ac).status_code == 403
    assert get("/v1/watch", ac).status_code == 403
    assert _watch_keys(f"{url}/v1/watch", ac, "c/", 2) == ["c/1", "c/2"]
    assert _watch_keys(f"{url}/v1/watch", tokens["pa"], "", 2) == ["a/1", "a/2"]

    # Revocation and expiry: refused on the next request.
    r = root.admin().delete(f"/v1/admin/consumers/ac/tokens/{tokens['ac_id']}")
    assert r.status_code == 200, r.text
    assert get("/v1/kv/a/1", ac).status_code == 401
    r = root.admin().post("/v1/admin/consumers/ac/tokens", json={"expires_in_s": 1})
    short = r.json()["token"]
    assert get("/v1/kv/a/1", short).status_code == 200
    time.sleep(1.2)
    assert get("/v1/kv/a/1", short).status_code == 401

    # The process logs no token.
    root.close_clients()
    procs.terminate(root.proc)
    logs = procs.logs()
    assert not any(t in logs for k, t in tokens.items() if k != "ac_id")
    assert short not in logs and root.admin_token not in logs
