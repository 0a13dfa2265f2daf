"""Producer routes: PUT/DELETE/GET /v1/kv/{key}, POST /v1/batch (SPEC §3.2)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway import bodies
from gateway.http import answer_response, flag, read_body
from gateway.writes import ADMIN, Gateway, batch_answer, kv_answer
from mercury.errors import BadRequestError, NotFoundError
from store.ops import DELETE, SET, Op

router = APIRouter(tags=["producer"])

_KV_PARAMS = [
    {
        "name": "If-Match",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": 'write only if the key\'s current seq is this one: `"<seq>"`',
    },
    {
        "name": "If-None-Match",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "`*`: create only (the key must be absent)",
    },
    {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"}},
    {
        "name": "async",
        "in": "query",
        "required": False,
        "schema": {"type": "boolean"},
        "description": "answer 202 on enqueue, before the commit",
    },
]

_KEY_PARAM = {
    "name": "key",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 500},
    "description": "the key, percent-encoded (any bytes)",
}

_BATCH_SCHEMA = {
    "type": "object",
    "required": ["ops"],
    "properties": {
        "ops": {
            "type": "array",
            "maxItems": 10000,
            "items": {
                "type": "object",
                "required": ["op"],
                "properties": {
                    "op": {"type": "string", "enum": ["set", "delete"]},
                    "key": {"type": "string"},
                    "key_b64": {"type": "string"},
                    "value": {"type": "string"},
                    "value_b64": {"type": "string"},
                },
            },
        }
    },
}


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gw
    return gw


def _key(request: Request, gw: Gateway) -> bytes:
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    return bodies.key_from_path(raw.split(b"?", 1)[0][len(b"/v1/kv/") :], gw.settings.max_key)


def _condition(request: Request) -> int | None:
    """expect_seq from If-Match / If-None-Match (None when unconditional)."""
    h = request.headers
    im = h.get("if-match")
    inm = h.get("if-none-match")
    if im is not None and inm is not None:
        raise BadRequestError("send If-Match or If-None-Match, not both")
    if inm is not None:
        if inm.strip() != "*":
            raise BadRequestError('If-None-Match supports only "*" (create only)')
        return 0
    if im is not None:
        tag = im.strip()
        if tag.startswith("W/"):
            tag = tag[2:]
        tag = tag.strip('"')
        if not tag.isdigit() or len(tag) > 19:
            raise BadRequestError(f'If-Match must be "<seq>", got {im!r}')
        return int(tag)
    return None


@router.put(
    "/v1/kv/{key:path}",
    summary="Write one key (acknowledged after the durable commit)",
    openapi_extra={
        "parameters": [_KEY_PARAM, *_KV_PARAMS],
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        },
    },
)
async def put_kv(request: Request) -> Response:
    """200 `{"seq", "status": "written" | "duplicate"}`, 412 when the condition fails."""
    t0 = time.perf_counter()
    gw = _gw(request)
    p = gw.producer(request.headers.get("authorization"))
    key = _key(request, gw)
    cond = _condition(request)
    value = await read_body(request, gw.settings.max_value, "value")
    op = Op(SET, key, value, p.name, cond)
    a = await gw.write(
        p,
        [op],
        len(key) + len(value),
        kv_answer,
        idem=request.headers.get("idempotency-key"),
        is_async=flag(request.query_params.get("async")),
        t0=t0,
    )
    return answer_response(a)


@router.delete(
    "/v1/kv/{key:path}",
    summary="Delete one key (acknowledged after the durable commit)",
    openapi_extra={"parameters": [_KEY_PARAM, *_KV_PARAMS]},
)
async def delete_kv(request: Request) -> Response:
    """200 `{"seq", "status": "deleted" | "absent"}`, 412 when the condition fails."""
    t0 = time.perf_counter()
    gw = _gw(request)
    p = gw.producer(request.headers.get("authorization"))
    key = _key(request, gw)
    op = Op(DELETE, key, b"", p.name, _condition(request))
    a = await gw.write(
        p,
        [op],
        len(key),
        kv_answer,
        idem=request.headers.get("idempotency-key"),
        is_async=flag(request.query_params.get("async")),
        t0=t0,
    )
    return answer_response(a)


@router.get(
    "/v1/kv/{key:path}",
    summary="Read one key (producers: their keyspaces; admin: all)",
    openapi_extra={"parameters": [_KEY_PARAM]},
)
async def get_kv(request: Request) -> Response:
    """The value bytes with `ETag: "<seq of last change>"`; 404 when absent."""
    gw = _gw(request)
    who = gw.authenticate(request.headers.get("authorization"))
    key = _key(request, gw)
    if who != ADMIN:
        p = gw.acl.producers[who]
        gw.check_keys(p, [Op(SET, key)])
    v = gw.store.get(key)
    if v is None:
        raise NotFoundError(f"no key {key.decode('utf-8', 'backslashreplace')!r}")
    return Response(
        v.value,
        media_type="application/octet-stream",
        headers={"ETag": f'"{v.seq}"', "X-Mercury-Seq": str(v.seq)},
    )


@router.post(
    "/v1/batch",
    summary="Write many keys in one request (JSON or application/msgpack)",
    openapi_extra={
        "parameters": _KV_PARAMS[2:],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _BATCH_SCHEMA},
                "application/msgpack": {"schema": _BATCH_SCHEMA},
            },
        },
    },
)
async def post_batch(request: Request) -> Response:
    """ACL checked for every op before any applies; 200 `{"seq", "written", "deleted",
    "duplicates", "absent"}` after the durable commit."""
    t0 = time.perf_counter()
    gw = _gw(request)
    p = gw.producer(request.headers.get("authorization"))
    s = gw.settings
    body = await read_body(request, s.max_batch_body, "batch body")
    doc = bodies.parse_body(body, request.headers.get("content-type"))
    ops = bodies.batch_ops(
        doc, p.name, max_ops=s.max_batch_ops, max_key=s.max_key, max_value=s.max_value
    )
    nbytes = sum(len(op.key) + len(op.value) for op in ops)
    a = await gw.write(
        p,
        ops,
        nbytes,
        batch_answer,
        idem=request.headers.get("idempotency-key"),
        is_async=flag(request.query_params.get("async")),
        t0=t0,
    )
    return answer_response(a)
