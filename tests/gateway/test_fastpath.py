"""The raw-ASGI fast path and the FastAPI routes give the same answers."""

from __future__ import annotations

import re
from typing import Any

from testkit.logged import entries_since
from tests.gateway.conftest import Root

_SEQ_IN_TEXT = re.compile(r"\bseq (?:is )?(\d+)")


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


def _ranked(answers: list[tuple[int, Any, str]]) -> list[tuple[int, Any, str]]:
    """The answers with every seq replaced by its rank among the seqs they name.

    A root logs documents of its own at a minute's turn (usage series), in the next batch's
    record: when a minute turns during one root's script and not the other's, every later
    seq of that root is higher by as many entries, while each answer's relation to the
    others (a duplicate names the seq the write got, a failed condition the key's current
    seq) is the same. Ranks keep exactly those relations."""
    seqs: set[int] = set()

    def collect(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "seq" and isinstance(v, int):
                    seqs.add(v)
                collect(v)
        elif isinstance(x, list):
            for v in x:
                collect(v)
        elif isinstance(x, str):
            seqs.update(int(m) for m in _SEQ_IN_TEXT.findall(x))

    for _, body, _ in answers:
        collect(body)
    rank = {s: i for i, s in enumerate(sorted(seqs))}

    def rewrite(x: Any) -> Any:
        if isinstance(x, dict):
            return {
                k: (f"#{rank[v]}" if k == "seq" and isinstance(v, int) else rewrite(v))
                for k, v in x.items()
            }
        if isinstance(x, list):
            return [rewrite(v) for v in x]
        if isinstance(x, str):
            return _SEQ_IN_TEXT.sub(
                lambda m: m.group(0).replace(m.group(1), f"#{rank[int(m.group(1))]}"), x
            )
        return x

    return [(status, rewrite(body), ctype) for status, body, ctype in answers]


def test_fast_path_and_fastapi_routes_answer_alike(root_factory: Any) -> None:
    fast_root, slow_root = root_factory(), root_factory("--no-fast-path")
    fast, slow = _script(fast_root), _script(slow_root)
    if any(
        key.startswith(b"usage/")
        for r in (fast_root, slow_root)
        for _, key in entries_since(r.data_dir, 0)
    ):
        assert _ranked(fast) == _ranked(slow)  # a minute turned during a script
    else:
        assert fast == slow
