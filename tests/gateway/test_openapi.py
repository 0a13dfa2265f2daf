"""The root's /openapi.json tells the truth: what a real root answers (status, content type,
headers, problem+json shape) is what the document declares for that operation, and the
document declares the parameters the handlers read."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Root

PROBLEM_REF = "#/components/schemas/Problem"


@pytest.fixture(scope="module")
def spec(shared_root: Root) -> dict[str, Any]:
    r = shared_root.client().get("/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def conforms(spec: dict[str, Any], method: str, path: str, r: httpx.Response) -> None:
    """`r` (the answer to `method` on the route `path`) is declared by the document: its
    status, its content type, the headers declared required; a problem has the shape."""
    op = spec["paths"][path][method.lower()]
    declared = op["responses"]
    status = str(r.status_code)
    assert status in declared, f"{method} {path} answered {status}; declared {list(declared)}"
    resp = declared[status]
    media = _media(r.headers.get("content-type"))
    assert media in resp.get("content", {}), (
        f"{method} {path} {status} is {media}; declared {list(resp.get('content', {}))}"
    )
    for name, h in resp.get("headers", {}).items():
        if h.get("required"):
            assert name.lower() in r.headers, f"{method} {path} {status}: no {name} header"
    if r.status_code >= 400 and media == "application/problem+json":
        assert resp["content"][media]["schema"] == {"$ref": PROBLEM_REF}
        body = r.json()
        for member, kind in (("type", str), ("title", str), ("status", int), ("detail", str)):
            assert isinstance(body.get(member), kind), (member, body)
        assert body["status"] == r.status_code


def test_errors_share_one_problem_schema_and_no_phantom_422(spec: dict[str, Any]) -> None:
    problem = spec["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail"}
    assert problem.get("additionalProperties") is True  # extension members
    assert "HTTPValidationError" not in str(spec)  # FastAPI's 422 is never sent
    errors = 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for status, resp in op["responses"].items():
                if int(status) < 400 or (path, status) == ("/healthz", "503"):
                    continue  # a stopping root's health is its usual JSON shape
                errors += 1
                assert resp["content"] == {
                    "application/problem+json": {"schema": {"$ref": PROBLEM_REF}}
                }, (method, path, status)
                if status in ("429", "503"):
                    assert "Retry-After" in resp["headers"], (method, path, status)
                if status == "429":
                    assert resp["headers"]["Retry-After"]["required"] is True
    assert errors > 100
    # The listener answers an oversized request head before any route: declared on all.
    ops = [op for ops in spec["paths"].values() for op in ops.values()]
    assert all("431" in op["responses"] for op in ops)


def test_success_codes_and_content_types_are_the_real_ones(
    spec: dict[str, Any], shared_root: Root
) -> None:
    admin = shared_root.admin()
    n = "oa" + uuid.uuid4().hex[:6]
    prod = f"/v1/admin/producers/{n}"
    r = admin.put(prod, json={"keyspaces": [f"{n}/"]})
    assert r.status_code == 201
    conforms(spec, "PUT", "/v1/admin/producers/{name}", r)
    r = admin.put(prod, json={"keyspaces": [f"{n}/"], "shared": []})
    assert r.status_code == 200
    conforms(spec, "PUT", "/v1/admin/producers/{name}", r)
    r = admin.post(f"{prod}/tokens", json={})
    assert r.status_code == 201
    conforms(spec, "POST", "/v1/admin/producers/{name}/tokens", r)
    # a route whose only success is 201 declares no 200
    assert "200" not in spec["paths"]["/v1/admin/producers/{name}/tokens"]["post"]["responses"]
    tok = shared_root.client(r.json()["token"])

    r = tok.put(f"/v1/kv/{n}/k", content=b"\x00\xffbytes")
    assert r.status_code == 200
    conforms(spec, "PUT", "/v1/kv/{key}", r)
    r = tok.put(f"/v1/kv/{n}/k2", content=b"v", params={"async": "true"})
    assert r.status_code == 202
    conforms(spec, "PUT", "/v1/kv/{key}", r)
    r = tok.post("/v1/batch", json={"ops": [{"op": "set", "key": f"{n}/b", "value": "v"}]})
    assert r.status_code == 200
    conforms(spec, "POST", "/v1/batch", r)
    r = tok.delete("/v1/kv", params={"prefix": f"{n}/b", "async": "true"})
    assert r.status_code == 202
    conforms(spec, "DELETE", "/v1/kv", r)

    r = tok.get(f"/v1/kv/{n}/k")
    assert (r.status_code, _media(r.headers["content-type"])) == (200, "application/octet-stream")
    conforms(spec, "GET", "/v1/kv/{key}", r)
    assert (
        "application/json"
        not in spec["paths"]["/v1/kv/{key}"]["get"]["responses"]["200"]["content"]
    )

    r = shared_root.client().get("/metrics")
    assert _media(r.headers["content-type"]) == "text/plain"
    conforms(spec, "GET", "/metrics", r)
    r = shared_root.client().get("/usage")
    assert _media(r.headers["content-type"]) == "text/html"
    conforms(spec, "GET", "/usage", r)
    for path in ("/usage/static/usage.js", "/usage/static/usage.css"):
        conforms(spec, "GET", "/usage/static/{path}", shared_root.client().get(path))
    for path in ("/healthz", "/v1/status"):
        conforms(spec, "GET", path, shared_root.client().get(path))


def test_range_and_bulk_on_the_root_declare_their_421(
    spec: dict[str, Any], shared_root: Root
) -> None:
    admin = shared_root.admin()
    for method, path, r in (
        ("GET", "/v1/range", admin.get("/v1/range", params={"prefix": "a"})),
        ("POST", "/v1/get_bulk", admin.post("/v1/get_bulk", json={"keys": ["a"]})),
    ):
        assert r.status_code == 421
        conforms(spec, method, path, r)
        assert not [s for s in spec["paths"][path][method.lower()]["responses"] if s < "400"]


def test_error_statuses_are_declared_as_problems(spec: dict[str, Any], shared_root: Root) -> None:
    admin = shared_root.admin()
    anon = shared_root.client()
    free, ftok = _producer(shared_root)
    n, tok = _producer(shared_root, quota={"ops_per_s": 0.001, "burst": 1, "max_delay_ms": 0})
    full, fulltok = _producer(shared_root, quota={"max_bytes_stored": 64})

    cases: list[tuple[str, str, int, httpx.Response]] = [
        ("GET", "/v1/admin/producers/{name}", 404, admin.get("/v1/admin/producers/nope-x")),
        ("PUT", "/v1/admin/acl", 428, admin.put("/v1/admin/acl", json={"producers": {}})),
        ("PUT", "/v1/kv/{key}", 403, ftok.put(f"/v1/kv/{n}/x", content=b"v")),
        ("PUT", "/v1/kv/{key}", 401, anon.put(f"/v1/kv/{free}/x", content=b"v")),
        ("POST", "/v1/admin/token", 403, ftok.post("/v1/admin/token")),
        ("GET", "/v1/usage/{producer}", 404, admin.get("/v1/usage/nobody-x")),
        ("GET", "/v1/usage/{producer}", 403, ftok.get(f"/v1/usage/{n}")),
        ("GET", "/v1/kv/{key}", 404, ftok.get(f"/v1/kv/{free}/absent")),
        ("GET", "/v1/admin/audit", 400, admin.get("/v1/admin/audit", params={"limit": 0})),
        ("GET", "/v1/usage/series", 400, admin.get("/v1/usage/series", params={"step": "2m"})),
        (
            "PUT",
            "/v1/admin/producers/{name}",
            409,
            admin.put("/v1/admin/producers/overlap-x", json={"keyspaces": [f"{free}/x/"]}),
        ),
        ("POST", "/v1/batch", 400, ftok.post("/v1/batch", content=b"{", headers=_JSON)),
        ("DELETE", "/v1/kv", 400, ftok.delete("/v1/kv")),
    ]
    # conditions, idempotency keys, quota and storage cap
    ftok.put(f"/v1/kv/{free}/c", content=b"v")
    cases.append(
        (
            "PUT",
            "/v1/kv/{key}",
            412,
            ftok.put(f"/v1/kv/{free}/c", content=b"w", headers={"If-None-Match": "*"}),
        )
    )
    idem = {"Idempotency-Key": uuid.uuid4().hex}
    assert ftok.put(f"/v1/kv/{free}/i", content=b"1", headers=idem).status_code == 200
    cases.append(
        ("PUT", "/v1/kv/{key}", 422, ftok.put(f"/v1/kv/{free}/i", content=b"2", headers=idem))
    )
    r = fulltok.put(f"/v1/kv/{full}/big", content=b"x" * 100)
    cases.append(("PUT", "/v1/kv/{key}", 507, r))
    assert tok.put(f"/v1/kv/{n}/a", content=b"v").status_code == 200  # spends the burst
    r = tok.put(f"/v1/kv/{n}/b", content=b"v")
    assert "Retry-After" in r.headers
    cases.append(("PUT", "/v1/kv/{key}", 429, r))
    for method, path, want, resp in cases:
        assert resp.status_code == want, (method, path, resp.status_code, resp.text)
        assert _media(resp.headers["content-type"]) == "application/problem+json"
        conforms(spec, method, path, resp)


_JSON = {"Content-Type": "application/json"}


def _producer(root: Root, **config: Any) -> tuple[str, httpx.Client]:
    """A new producer (keyspace ``<name>/``) and a client with its token."""
    name = "oa" + uuid.uuid4().hex[:8]
    admin = root.admin()
    r = admin.put(f"/v1/admin/producers/{name}", json={"keyspaces": [f"{name}/"], **config})
    assert r.status_code == 201, r.text
    token = admin.post(f"/v1/admin/producers/{name}/tokens").json()["token"]
    return name, root.client(token)


def _params(op: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["in"] for p in op.get("parameters", [])}


def test_the_parameters_the_handlers_read_are_declared(spec: dict[str, Any]) -> None:
    paths = spec["paths"]
    assert _params(paths["/v1/usage/series"]["get"]) == dict.fromkeys(
        ("producer", "keyspace", "since", "until", "step"), "query"
    )
    assert _params(paths["/v1/admin/audit"]["get"]) == {"since": "query", "limit": "query"}
    assert _params(paths["/v1/admin/producers/{name}"]["delete"]) == {
        "name": "path",
        "purge": "query",
    }
    assert _params(paths["/v1/admin/acl"]["put"]) == {"If-Match": "header", "dry_run": "query"}
    assert _params(paths["/v1/usage/unused"]["get"]) == dict.fromkeys(
        ("producer", "keyspace", "days", "limit", "cursor"), "query"
    )
    writes = {"Idempotency-Key": "header", "async": "query"}
    conditions = {"If-Match": "header", "If-None-Match": "header"}
    expiry = {"ttl": "query", "expires_at": "query"}  # a PUT's deadline
    assert _params(paths["/v1/kv/{key}"]["put"]) == {
        "key": "path",
        **conditions,
        **writes,
        **expiry,
    }
    assert _params(paths["/v1/kv/{key}"]["delete"]) == {"key": "path", **conditions, **writes}
    assert _params(paths["/v1/kv"]["delete"]) == {"prefix": "query", **writes}
    assert _params(paths["/v1/batch"]["post"]) == {**writes, "results": "query"}
