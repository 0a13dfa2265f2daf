"""Read tokens (`--read-auth`) on a real root and replica: each token reads exactly its
keyspaces on `/v1/kv`, `/v1/get_bulk` and `/v1/range` (pages and NDJSON), never seeing a
key name outside them; token-less KT/memcached listeners refuse a non-loopback address;
and no token or Authorization header ever reaches the logs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from testkit.procs import Procs, free_port, run_mercury
from testkit.replication import wait_for
from tests.gateway.conftest import make_root
from tests.replicator.nodes import start_replica

KEYS = {
    "app/a/1": "a1",
    "app/a/2": "a2",
    "app/a/3": "a3",
    "app/b/1": "b1",
    "app/b/2": "b2",
    "other/x": "x",
}


def _setup(tmp_path: Path, procs: Procs) -> tuple[object, object, dict[str, str]]:
    root = make_root(procs, tmp_path / "root")
    tokens = {}
    for name, ks in (("pa", "app/a/"), ("pb", "app/b/"), ("po", "other/")):
        r = root.admin().put(f"/v1/admin/producers/{name}", json={"keyspaces": [ks]})
        assert r.status_code in (200, 201), r.text
        r = root.admin().post(f"/v1/admin/producers/{name}/tokens")
        assert r.status_code == 201, r.text
        tokens[name] = r.json()["token"]
    r = root.admin().put("/v1/admin/consumers/ca", json={"keyspaces": ["app/a/"]})
    assert r.status_code in (200, 201), r.text
    r = root.admin().post("/v1/admin/consumers/ca/tokens")
    assert r.status_code == 201, r.text
    tokens["ca"] = r.json()["token"]
    owner = {"app/a/": "pa", "app/b/": "pb", "other/": "po"}
    for k, v in KEYS.items():
        tok = tokens[next(o for p, o in owner.items() if k.startswith(p))]
        r = root.client(tok).put(f"/v1/kv/{k}", content=v.encode())
        assert r.status_code in (200, 201), r.text
    replica = start_replica(procs, tmp_path / "r1", [int(root.args[3].split(":")[1])],
                            "--read-auth", name="r1")  # fmt: skip
    return root, replica, tokens


def _get(
    url: str,
    token: str | None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    h = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    return httpx.get(url, headers=h, params=params, timeout=10)


def test_read_tokens_allow_exactly_their_keyspaces(tmp_path: Path, procs: Procs) -> None:
    root, replica, tokens = _setup(tmp_path, procs)
    base = f"http://127.0.0.1:{replica.http}"  # type: ignore[attr-defined]
    wait_for(lambda: _get(f"{base}/v1/kv/other/x", tokens["po"]).status_code == 200, 30, "sync")
    ca = tokens["ca"]

    # Point reads: no token 401, a wrong token 401, outside 403, inside 200.
    assert _get(f"{base}/v1/kv/app/a/1", None).status_code == 401
    assert _get(f"{base}/v1/kv/app/a/1", "mct_not-a-token").status_code == 401
    assert _get(f"{base}/v1/kv/app/b/1", ca).status_code == 403
    got = _get(f"{base}/v1/kv/app/a/1", ca)
    assert got.status_code == 200 and got.content == b"a1"
    assert _get(f"{base}/v1/kv/app/a/1", tokens["pa"]).status_code == 200
    assert _get(f"{base}/v1/kv/app/a/1", tokens["pb"]).status_code == 403
    assert _get(f"{base}/healthz", None).status_code == 200  # not a read of keys
    missing = _get(f"{base}/v1/kv/app/a/zz", ca)  # error details name keys as text
    assert missing.status_code == 404 and "'app/a/zz'" in missing.json()["detail"]
    assert "b'" not in missing.text

    # get_bulk: POST alike.
    bulk = f"{base}/v1/get_bulk"
    h = {"Authorization": f"Bearer {ca}"}
    assert httpx.post(bulk, json={"keys": ["app/a/1"]}, timeout=10).status_code == 401
    mixed = {"keys": ["app/a/1", "app/b/1"]}
    assert httpx.post(bulk, json=mixed, headers=h, timeout=10).status_code == 403
    r = httpx.post(bulk, json={"keys": ["app/a/1", "app/a/2"]}, headers=h, timeout=10)
    assert r.status_code == 200 and r.json()["values"] == {"app/a/1": "a1", "app/a/2": "a2"}

    # Range pages: a range over app/ is narrowed to app/a/; every cursor stays inside it.
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        params = {"prefix": "app/", "limit": "1", **({"cursor": cursor} if cursor else {})}
        r = _get(f"{base}/v1/range", ca, params=params)
        assert r.status_code == 200, r.text
        doc = r.json()
        seen += [it["key"] for it in doc["items"]]
        assert "app/b" not in r.text and "other" not in r.text
        cursor = doc["next_cursor"]
        if cursor is None:
            break
    assert seen == ["app/a/1", "app/a/2", "app/a/3"]
    r = _get(f"{base}/v1/range", ca, params={"start": "a", "end": "z"})
    assert r.status_code == 200 and [i["key"] for i in r.json()["items"]] == seen
    assert _get(f"{base}/v1/range", ca, params={"prefix": "other/"}).status_code == 403
    assert _get(f"{base}/v1/range", None, params={"prefix": "app/"}).status_code == 401

    # NDJSON stream of everything: only the token's keys.
    r = _get(f"{base}/v1/range", ca, headers={"Accept": "application/x-ndjson"})
    lines = [json.loads(x) for x in r.text.splitlines() if x]
    assert [x["key"] for x in lines] == seen

    # The root's HTTP reads always need a producer's (or the admin) token.
    root_url = root.url  # type: ignore[attr-defined]
    assert _get(f"{root_url}/v1/kv/app/a/1", None).status_code == 401
    assert _get(f"{root_url}/v1/kv/app/a/1", tokens["pb"]).status_code == 403
    assert _get(f"{root_url}/v1/kv/app/a/1", tokens["pa"]).status_code == 200

    # Secrets never in logs: run over, grep every process's output.
    root.close_clients()  # type: ignore[attr-defined]
    for p in (replica.proc, root.proc):  # type: ignore[attr-defined]
        procs.terminate(p)
    logs = procs.logs()
    for tok in tokens.values():
        assert tok not in logs
    assert "mct_not-a-token" not in logs
    assert "Bearer" not in logs and "authorization" not in logs.lower()


def test_tokenless_listeners_refuse_a_non_loopback_address(tmp_path: Path) -> None:
    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    r = run_mercury("root", str(data), "--listen", f"127.0.0.1:{free_port()}",
                    "--repl-listen", f"127.0.0.1:{free_port()}",
                    "--kt-listen", f"0.0.0.0:{free_port()}", timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert "--allow-unauthenticated-reads" in r.stderr
    r = run_mercury("replica", str(tmp_path / "r"), "--source", f"127.0.0.1:{free_port()}",
                    "--memcached-listen", f"0.0.0.0:{free_port()}", timeout=60)  # fmt: skip
    assert r.returncode == 2 and "memcached" in r.stderr
