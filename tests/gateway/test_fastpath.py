"""The raw-ASGI fast path and the FastAPI routes give the same answers."""

from __future__ import annotations

from typing import Any

from tests.gateway.conftest import Root


def _script(root: Root) -> list[tuple[int, Any, str]]:
    a = root.admin()
    assert a.put("/v1/admin/producers/fp", json={"keyspaces": ["fp/"]}).status_code == 201
    c = root.client(a.post("/v1/admin/producers/fp/tokens").json()["token"])
    out = []
    for r in (
        c.put("/v1/kv/fp/a", content=b"1"),
        c.put("/v1/kv/fp/a", content=b"1"),
        c.put("/v1/kv/fp/a", content=b"2", headers={"If-Match": '"99"'}),
        c.put("/v1/kv/fp/a", content=b"2", headers={"If-None-Match": "*"}),
        c.put("/v1/kv/other", content=b"2"),
        c.put("/v1/kv/fp/" + "k" * 600, content=b"2"),
        c.post("/v1/batch", json={"ops": [{"op": "set", "key": "fp/b", "value": "x"}]}),
        c.post("/v1/batch", content=b"{bad"),
        # chunked (no Content-Length): the one body reader joins the chunks on both paths
        c.put("/v1/kv/fp/c", content=iter([b"ab", b"cd", b"ef"])),
        c.post(
            "/v1/batch",
            content=iter([b'{"ops": [{"op": "set", ', b'"key": "fp/d", "value": "y"}]}']),
        ),
        c.delete("/v1/kv/fp/a"),
        c.delete("/v1/kv/fp/a"),
        c.put("/v1/kv/fp/i", content=b"1", headers={"Idempotency-Key": "x"}),
        c.put("/v1/kv/fp/i", content=b"2", headers={"Idempotency-Key": "x"}),
        root.client().put("/v1/kv/fp/a", content=b"1"),
    ):
        body = r.json()
        out.append((r.status_code, body, r.headers["content-type"]))
    # the chunked bodies were stored whole
    assert c.get("/v1/kv/fp/c").content == b"abcdef"
    assert c.get("/v1/kv/fp/d").content == b"y"
    return out


def test_fast_path_and_fastapi_routes_answer_alike(root_factory: Any) -> None:
    fast = _script(root_factory())
    slow = _script(root_factory("--no-fast-path"))
    assert fast == slow
