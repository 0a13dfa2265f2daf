"""Keyspace escapes stay closed, on the root's writes and on a replica's read tokens (real
root and replica processes).

Keys are bytes: a keyspace is a byte prefix, and nothing is normalised on the way — not
percent-encoding beyond its one decoding, not ``..`` path segments, not Unicode forms — so
each trick below either names a key inside the keyspace (and then that literal key, never
another one) or is refused. The prefix boundary is the keyspace's own bytes: ``team/``
never covers ``team-x/``, and a mixed batch is refused whole.
"""

from __future__ import annotations

import base64
import json
import socket
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.procs import Procs
from testkit.replication import wait_for
from tests.gateway.conftest import Root, make_root
from tests.replicator.nodes import Replica, start_replica

NFC = unicodedata.normalize("NFC", "café/")
NFD = unicodedata.normalize("NFD", "café/")


def _raw(port: int, method: str, target: str, token: str, body: bytes = b"") -> tuple[int, bytes]:
    """Send one request with its target exactly as given (no client normalises `..`)."""
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


class Tree:
    """A root (producers `team` on team/, `teamx` on team-x/, `uni` on the NFC keyspace)
    and a --read-auth replica with a consumer `reader` of team/ and the NFC keyspace."""

    def __init__(self, root: Root, replica: Replica, tokens: dict[str, str]) -> None:
        self.root, self.replica, self.tokens = root, replica, tokens
        self.port = int(root.url.rsplit(":", 1)[1])
        self.rbase = f"http://127.0.0.1:{replica.http}"

    def put(self, who: str, path: str, value: bytes = b"v") -> int:
        return self.root.client(self.tokens[who]).put(f"/v1/kv/{path}", content=value).status_code

    def get(self, who: str, path: str) -> httpx.Response:
        return self.root.client(self.tokens[who]).get(f"/v1/kv/{path}")

    def read(self, path: str, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        h = {**(headers or {}), "Authorization": f"Bearer {self.tokens['reader']}"}
        return httpx.get(f"{self.rbase}{path}", headers=h, timeout=10, **kw)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tree]:
    tmp = tmp_path_factory.mktemp("escapes")
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    try:
        root = make_root(procs, tmp / "root")
        tokens: dict[str, str] = {}
        for name, ks in (("team", "team/"), ("teamx", "team-x/"), ("uni", NFC)):
            r = root.admin().put(f"/v1/admin/producers/{name}", json={"keyspaces": [ks]})
            assert r.status_code in (200, 201), r.text
            tokens[name] = root.admin().post(f"/v1/admin/producers/{name}/tokens").json()["token"]
        r = root.admin().put("/v1/admin/consumers/reader", json={"keyspaces": ["team/", NFC]})
        assert r.status_code in (200, 201), r.text
        tokens["reader"] = root.admin().post("/v1/admin/consumers/reader/tokens").json()["token"]
        src = int(root.args[3].split(":")[1])
        replica = start_replica(procs, Path(tmp / "r1"), [src], "--read-auth", name="r1")
        t = Tree(root, replica, tokens)
        assert t.put("teamx", "team-x/secret", b"S") == 200
        assert t.put("team", "team/a", b"A") == 200
        yield t
        root.close_clients()
    finally:
        procs.stop_all()


def test_writes_stay_inside_the_byte_prefix(tree: Tree) -> None:
    # The prefix boundary: team/ never covers team-x/ or team.
    assert tree.put("team", "team-x/evil") == 403
    assert tree.put("team", "team") == 403
    assert tree.put("team", "teamx") == 403
    # Percent-encoding is decoded once, to bytes: an encoded letter is that letter.
    assert tree.put("team", "%74eam-x/evil") == 403
    assert tree.put("team", "%74eam/enc", b"E") == 200
    assert tree.get("team", "team/enc").content == b"E"
    # A NUL before the slash is outside; after it, inside (a key of its own).
    assert tree.put("team", "team%00/x") == 403
    assert tree.put("team", "team/%00", b"N") == 200
    assert tree.get("team", "team%2F%00").content == b"N"


def test_dot_segments_are_key_bytes_never_a_path(tree: Tree) -> None:
    # Sent raw (no client normalises them): the key is the literal bytes, inside team/.
    status, _ = _raw(tree.port, "PUT", "/v1/kv/team/../team-x/secret", tree.tokens["team"], b"X")
    assert status == 200
    encoded = "/v1/kv/team%2F%2e%2e%2Fteam-x%2Fsecret"
    status, _ = _raw(tree.port, "PUT", encoded, tree.tokens["team"], b"Y")
    assert status == 200  # the same literal key, encoded
    assert tree.get("teamx", "team-x/secret").content == b"S"  # untouched
    assert tree.get("team", "team%2F..%2Fteam-x%2Fsecret").content == b"Y"
    status, _ = _raw(tree.port, "PUT", "/v1/kv/../team-x/evil", tree.tokens["team"], b"Z")
    assert status == 403
    status, _ = _raw(tree.port, "GET", "/v1/kv/team/../team-x/secret", tree.tokens["team"])
    assert status == 200  # its own literal key (Y), not team-x/secret
    status, body = _raw(tree.port, "GET", "/v1/kv/team/../team-x/secret", tree.tokens["team"])
    assert body == b"Y"


def test_unicode_forms_are_different_bytes(tree: Tree) -> None:
    assert NFC != NFD
    assert tree.put("uni", f"{NFC}x", b"C") == 200
    assert tree.put("uni", f"{NFD}x") == 403  # not normalised into the keyspace
    assert tree.get("uni", f"{NFC}x").content == b"C"


def test_batches_are_checked_whole(tree: Tree) -> None:
    c = tree.root.client(tree.tokens["team"])
    mixed = [
        {"op": "set", "key": "team/ok", "value": "1"},
        {"op": "set", "key": "team-x/evil", "value": "2"},
    ]
    assert c.post("/v1/batch", json={"ops": mixed}).status_code == 403
    nul = [
        {"op": "set", "key": "team/ok", "value": "1"},
        {"op": "set", "key_b64": base64.b64encode(b"team\x00/x").decode(), "value": "2"},
    ]
    assert c.post("/v1/batch", json={"ops": nul}).status_code == 403
    delete = [{"op": "delete", "key": "team/a"}, {"op": "delete", "key": "team-x/secret"}]
    assert c.post("/v1/batch", json={"ops": delete}).status_code == 403
    assert tree.get("team", "team/ok").status_code == 404  # nothing applied
    assert tree.get("team", "team/a").content == b"A"
    # In a JSON body nothing is percent-decoded: the key is the literal string.
    ok = [{"op": "set", "key": "team/%2e%2e/x", "value": "L"}]
    assert c.post("/v1/batch", json={"ops": ok}).status_code == 200
    assert tree.get("team", "team%2F%252e%252e%2Fx").content == b"L"
    # A prefix delete may not reach past the keyspace either.
    assert c.delete("/v1/kv", params={"prefix": "team"}).status_code == 403
    assert c.delete("/v1/kv", params={"prefix": "team-"}).status_code == 403
    assert tree.get("teamx", "team-x/secret").content == b"S"


def test_read_tokens_hold_the_same_boundaries(tree: Tree) -> None:
    wait_for(lambda: tree.read("/v1/kv/team/a").status_code == 200, 30, "replica synced")
    wait_for(lambda: tree.read(f"/v1/kv/{NFC}x").status_code == 200, 30, "replica synced")
    assert tree.read("/v1/kv/team-x/secret").status_code == 403
    assert tree.read("/v1/kv/%74eam-x/secret").status_code == 403
    assert tree.read("/v1/kv/team%00/x").status_code == 403
    assert tree.read(f"/v1/kv/{NFD}x").status_code == 403
    # Dot segments, raw: the literal key inside team/, never team-x/secret's value.
    reader = tree.tokens["reader"]
    status, body = _raw(tree.replica.http, "GET", "/v1/kv/team/../team-x/secret", reader)
    assert status in (200, 404) and body != b"S"
    status, _ = _raw(tree.replica.http, "GET", "/v1/kv/../team-x/secret", tree.tokens["reader"])
    assert status == 403

    h = {"Authorization": f"Bearer {tree.tokens['reader']}"}
    bulk = f"{tree.rbase}/v1/get_bulk"
    for doc in (
        {"keys": ["team/a", "team-x/secret"]},
        {"keys": ["team/a"], "keys_b64": [base64.b64encode(b"team-x/secret").decode()]},
        {"keys": ["team\u0000/x"]},
        {"keys": [f"{NFD}x"]},
    ):
        assert httpx.post(bulk, json=doc, headers=h, timeout=10).status_code == 403, doc

    # Ranges reaching past the keyspace return only its keys, and never name another.
    for params in ({"prefix": "team"}, {"start": "team", "end": "teamz"}, {"prefix": "t"}):
        r = tree.read("/v1/range", params=params)
        assert r.status_code == 200, (params, r.text)
        keys = [i["key"] for i in r.json()["items"]]
        assert keys and all(k.startswith("team/") for k in keys), (params, keys)
        assert '"team-x/' not in r.text and '"S"' not in r.text  # no key or value of team-x/
        nd = tree.read("/v1/range", params=params, headers={"Accept": "application/x-ndjson"})
        assert [json.loads(x)["key"] for x in nd.text.splitlines() if x] == keys
    assert tree.read("/v1/range", params={"prefix": "team-"}).status_code == 403
    assert tree.read("/v1/range", params={"prefix": "%74eam-x/"}).status_code == 403
