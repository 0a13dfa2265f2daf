"""JSON bodies naming a member twice in one object, against a real root over HTTP.

orjson keeps the last of repeated members, so ``{"keyspaces": ["a/"], "keyspaces":
["b/"]}`` was stored as ``["b/"]`` while a proxy or audit tool reading the body first-wins
sees ``["a/"]``. Every JSON body the gateway decodes now refuses it, with the status and
problem type the same route gives a body that is not JSON, naming the member, and nothing
changes.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgpack

from tests.gateway.conftest import Root, logged_since

ACL = "/v1/admin/acl"


def _refused_like_bad_json(r: httpx.Response, bad: httpx.Response, member: str) -> None:
    """`r` is answered as `bad` (a body that is not JSON, same route) is, naming `member`."""
    assert bad.status_code == 400, bad.text
    assert r.status_code == bad.status_code, r.text
    assert r.headers["content-type"] == bad.headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = r.json()
    assert set(doc) == set(bad.json())
    assert (doc["type"], doc["title"], doc["status"]) == (
        bad.json()["type"],
        bad.json()["title"],
        400,
    )
    assert f"member {member!r} appears more than once" in doc["detail"], doc


def _acl(root: Root) -> tuple[dict[str, Any], str]:
    r = root.admin().get(ACL)
    assert r.status_code == 200, r.text
    return r.json(), r.headers["etag"]


def test_admin_bodies_naming_a_member_twice_are_refused_and_change_nothing(
    shared_root: Root,
) -> None:
    a = shared_root.admin()
    name, _tok = shared_root.producer()
    before, etag = _acl(shared_root)
    url = f"/v1/admin/producers/{name}"

    # PUT producer: the review's case, on an existing producer and on a new one.
    body = b'{"keyspaces": ["%s/"], "keyspaces": ["stolen/"]}' % name.encode()
    _refused_like_bad_json(a.put(url, content=body), a.put(url, content=b"{nope"), "keyspaces")
    fresh = url + "x"
    _refused_like_bad_json(
        a.put(fresh, content=b'{"keyspaces": ["f/"], "keyspaces": ["g/"]}'),
        a.put(fresh, content=b"{nope"),
        "keyspaces",
    )
    assert a.get(fresh).status_code == 404
    # ... and deeper: a guard's settings named twice.
    nested = (
        b'{"keyspaces": ["%s/"], "guards": {"%s/": {"refuse_empty": true, '
        b'"max_deletes_per_batch": 1, "max_deletes_per_batch": 1000000}}}'
    ) % (name.encode(), name.encode())
    _refused_like_bad_json(
        a.put(url, content=nested), a.put(url, content=b"{nope"), "max_deletes_per_batch"
    )

    # PUT the whole ACL document: a producer named twice, and keyspaces twice inside one.
    h = {"If-Match": etag}
    for body, member in (
        (
            b'{"producers": {"%s": {"keyspaces": ["a/"]}, "%s": {"keyspaces": ["b/"]}}, '
            b'"consumers": {}}' % (name.encode(), name.encode()),
            name,
        ),
        (b'{"producers": {}, "consumers": {}, "producers": {}}', "producers"),
        (
            b'{"producers": {"%s": {"keyspaces": ["%s/"], "keyspaces": ["z/"]}}, '
            b'"consumers": {}}' % (name.encode(), name.encode()),
            "keyspaces",
        ),
    ):
        _refused_like_bad_json(
            a.put(ACL, content=body, headers=h), a.put(ACL, content=b"{", headers=h), member
        )
    r = a.put(ACL + "?dry_run=true", content=body, headers=h)
    _refused_like_bad_json(r, a.put(ACL, content=b"{", headers=h), "keyspaces")

    # Consumers and tokens.
    curl = "/v1/admin/consumers/c" + name
    _refused_like_bad_json(
        a.put(curl, content=b'{"keyspaces": ["a/"], "keyspaces": ["b/"]}'),
        a.put(curl, content=b"{nope"),
        "keyspaces",
    )
    assert a.get(curl).status_code == 404
    turl = url + "/tokens"
    tokens = a.get(turl).json()["tokens"]
    _refused_like_bad_json(
        a.post(turl, content=b'{"label": "a", "expires_in_s": 60, "expires_in_s": 1e9}'),
        a.post(turl, content=b"{nope"),
        "expires_in_s",
    )
    assert a.get(turl).json()["tokens"] == tokens

    after, etag2 = _acl(shared_root)
    assert (after, etag2) == (before, etag)
    assert after["producers"][name]["keyspaces"] == [f"{name}/"]
    # A body naming each member once is still taken (the same names in different objects).
    r = a.put(url, content=b'{"keyspaces": ["%s/"], "quota": {}}' % name.encode())
    assert r.status_code == 200, r.text


def test_a_batch_naming_a_member_twice_is_refused_and_writes_nothing(shared_root: Root) -> None:
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    k = f"{name}/k".encode()
    seq = c.get("/v1/status").json()["seq"]
    bad = c.post("/v1/batch", content=b"{nope")
    for body, member in (
        # the common shape the compiled decoder takes, but "value" twice
        (b'{"ops": [{"op": "set", "key": "%s", "value": "a", "value": "b"}]}' % k, "value"),
        # a delete that is a set to a first-wins reader
        (b'{"ops": [{"op": "set", "key": "%s", "value": "a", "op": "delete"}]}' % k, "op"),
        # the reference path (a condition), "key" twice
        (
            b'{"ops": [{"op": "set", "key": "%s", "if_absent": true, "key": "%s2", '
            b'"value": "v"}]}' % (k, k),
            "key",
        ),
        # two op arrays
        (
            b'{"ops": [{"op": "set", "key": "%s", "value": "a"}], "ops": '
            b'[{"op": "delete", "key": "%s"}]}' % (k, k),
            "ops",
        ),
        # over 1 MiB: decoded by the lean decoder, "value" twice in the last op
        (
            b'{"ops": ['
            + b",".join(
                b'{"op": "set", "key": "%s:%d", "value": "%s"}' % (k, i, b"v" * 200)
                for i in range(6000)
            )
            + b', {"op": "set", "key": "%s", "value": "a", "value": "b"}]}' % k,
            "value",
        ),
    ):
        _refused_like_bad_json(c.post("/v1/batch", content=body), bad, member)
    assert c.get(f"/v1/kv/{name}/k").status_code == 404
    assert [key for _, key in logged_since(shared_root, seq) if key.startswith(k)] == []
    ok = c.post("/v1/batch", content=b'{"ops": [{"op": "set", "key": "%s", "value": "a"}]}' % k)
    assert ok.status_code == 200 and ok.json()["written"] == 1, ok.text


def test_a_msgpack_batch_repeating_a_map_key_is_refused_and_writes_nothing(
    shared_root: Root,
) -> None:
    """The same one reading for a msgpack body: a map naming a key twice is the same 400
    as a body that is not msgpack, naming the key."""
    name, tok = shared_root.producer()
    c = shared_root.client(tok)
    h = {"Content-Type": "application/msgpack"}
    k = f"{name}/m".encode()
    seq = c.get("/v1/status").json()["seq"]
    bad = c.post("/v1/batch", content=b"\xc1", headers=h)  # 0xc1: never used by msgpack

    def mp_map(*pairs: tuple[bytes, bytes]) -> bytes:
        """A msgpack map of already packed (key, value) pairs, repeats kept."""
        return bytes([0x80 | len(pairs)]) + b"".join(kk + v for kk, v in pairs)

    op = msgpack.packb("op")
    set_ = msgpack.packb("set")
    key = msgpack.packb(k)
    value = msgpack.packb("value")
    body = mp_map(
        (
            msgpack.packb("ops"),
            b"\x91" + mp_map((op, set_), (b"\xa3key", key), (value, b"\xa1a"), (value, b"\xa1b")),
        )
    )
    _refused_like_bad_json(c.post("/v1/batch", content=body, headers=h), bad, "value")
    assert c.get(f"/v1/kv/{name}/m").status_code == 404
    assert [kk for _, kk in logged_since(shared_root, seq) if kk.startswith(k)] == []
    ok_body = msgpack.packb({"ops": [{"op": "set", "key": k, "value": b"a"}]})
    ok = c.post("/v1/batch", content=ok_body, headers=h)
    assert ok.status_code == 200 and ok.json()["written"] == 1, ok.text
