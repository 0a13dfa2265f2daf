"""Producer routes: PUT/DELETE/GET /v1/kv/{key}, POST /v1/batch (docs/api.md)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from core.errors import NotFoundError
from gateway import kv_handlers
from gateway.auth import ADMIN
from gateway.http import answer_response, body_reader
from gateway.writes import Gateway
from store.ops import SET, Op

router = APIRouter(tags=["producer"])

#: The scope key `reads.auth.ReadAuth` sets on a read it authorized (the gateway does not
#: import `reads`; `mercury/root.py` puts that middleware in front with `--read-auth`).
READ_KEYSPACES = "mercury.read_keyspaces"

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
                    "if_seq": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "the key's current version must be this (0 = absent)",
                    },
                    "if_absent": {"type": "boolean", "description": "true: the key must be absent"},
                },
                "additionalProperties": False,
            },
        }
    },
}


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gw
    return gw


def _key(request: Request, gw: Gateway) -> bytes:
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    return kv_handlers.key_of(raw, gw.settings.max_key)


async def _call(request: Request, handler: Any) -> Response:
    """Run a framework-free handler of `kv_handlers` for a FastAPI request."""
    t0 = time.perf_counter()

    read = body_reader(request.receive, request.headers.get("content-length"))
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    headers = {k: v for k, v in request.headers.items()}
    a = await handler(_gw(request), headers, raw, request.scope["query_string"], read, t0)
    return answer_response(a)


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
    """200 `{"seq", "status": "written" | "duplicate" | "superseded"}`, 412 when the
    condition fails."""
    return await _call(request, kv_handlers.put_kv)


@router.delete(
    "/v1/kv/{key:path}",
    summary="Delete one key (acknowledged after the durable commit)",
    openapi_extra={"parameters": [_KEY_PARAM, *_KV_PARAMS]},
)
async def delete_kv(request: Request) -> Response:
    """200 `{"seq", "status": "deleted" | "absent"}`, 412 when the condition fails."""
    return await _call(request, kv_handlers.delete_kv)


@router.delete(
    "/v1/kv",
    summary="Delete the keys under a prefix, one batch per request",
    openapi_extra={
        "parameters": [
            {
                "name": "prefix",
                "in": "query",
                "required": True,
                "schema": {"type": "string", "minLength": 1, "maxLength": 500},
                "description": "the prefix, inside the producer's keyspaces",
            },
            *_KV_PARAMS[2:],
        ]
    },
)
async def delete_prefix(request: Request) -> Response:
    """200 `{"seq", "deleted", ..., "more"}`: at most one batch's worth of keys (the request
    limit and the keyspace's mass-delete guard); repeat while `more` is true."""
    return await _call(request, kv_handlers.delete_prefix)


@router.get(
    "/v1/kv/{key:path}",
    summary="Read one key (producers: their keyspaces; admin: all)",
    openapi_extra={"parameters": [_KEY_PARAM]},
)
async def get_kv(request: Request) -> Response:
    """The value bytes with `ETag: "<seq of last change>"`; 404 when absent."""
    gw = _gw(request)
    # With `--read-auth`, reads.auth.ReadAuth checked the token (consumers' too) and the key
    # and marks the request with the token's keyspaces (`reads.ranges.READ_KEYSPACES`).
    if request.scope.get(READ_KEYSPACES) is not None:
        key = _key(request, gw)
    else:  # without it: a producer's token (its keyspaces) or the admin token
        who = gw.authenticate(request.headers.get("authorization"))
        key = _key(request, gw)
        if who != ADMIN:
            gw.check_keys(gw.acl.producers[who], [Op(SET, key)])
    v = gw.store.get(key)
    if v is None:
        raise NotFoundError(f"no key {key.decode('utf-8', 'backslashreplace')!r}")
    note_read = getattr(request.app.state, "note_read", None)  # unused-key analytics
    if note_read is not None:
        note_read(key)
    return Response(
        v.value,
        media_type="application/octet-stream",
        # X-Mercury-Version names what it is (the key's version); X-Mercury-Seq is its
        # documented alias on the root (on a replica X-Mercury-Seq is the applied seq).
        headers={
            "ETag": f'"{v.seq}"',
            "X-Mercury-Version": str(v.seq),
            "X-Mercury-Seq": str(v.seq),
        },
    )


@router.post(
    "/v1/batch",
    summary="Write many keys in one request (JSON or application/msgpack)",
    openapi_extra={
        "parameters": [
            *_KV_PARAMS[2:],
            {
                "name": "results",
                "in": "query",
                "required": False,
                "schema": {"type": "boolean"},
                "description": "list each op's key, status and seq (always with conditions)",
            },
        ],
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
    "duplicates", "absent", "superseded", "precondition_failed"}` (+ `results`) after the
    durable commit; If-Match / If-None-Match refused (per-op `if_seq` / `if_absent`)."""
    return await _call(request, kv_handlers.post_batch)
