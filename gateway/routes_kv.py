"""Producer routes: PUT/DELETE/GET /v1/kv/{key}, POST /v1/batch (docs/api.md)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.responses import Response

from core import ttl
from core.errors import NoSuchKeyError
from core.openapi import VERSION_HEADERS
from gateway import kv_handlers
from gateway import openapi_doc as doc
from gateway.auth import ADMIN
from gateway.http import answer_response, body_reader
from gateway.writes import Gateway
from store.ops import SET, Op


class _AnyKey(PathConvertor):
    """A `{key:anykey}` path parameter: any characters, line breaks too. Starlette's own
    ``path`` (``.*``) stops at a line break, so a stored key holding one (keys are any
    bytes) matched no route: its read was a routing 404 while the key existed. The
    handlers take the key from the raw path (`kv_handlers.key_of`), not from this."""

    regex = "(?s:.*)"


register_url_convertor("anykey", _AnyKey())

router = APIRouter(tags=["producer"])

_ACCEPTED = doc.json_body(
    '`?async=true`: `{"status": "accepted", "ops"}` once queued, before the commit',
    {
        "type": "object",
        "required": ["status", "ops"],
        "properties": {
            "status": {"const": "accepted"},
            "ops": {"type": "integer", "minimum": 0},
        },
    },
    doc.WRITE_HEADERS,
)


def _one_key(*statuses: str) -> dict[str, Any]:
    """A single-key write's answer (`gateway.answers.kv_answer`)."""
    return {
        "type": "object",
        "required": ["seq", "status"],
        "properties": {
            "seq": {"type": "integer", "minimum": 0},
            "status": {"type": "string", "enum": list(statuses)},
        },
    }


_TOTALS = ("written", "deleted", "duplicates", "absent", "superseded", "precondition_failed")


def _batch(**more: Any) -> dict[str, Any]:
    """A batch's answer (`gateway.answers.batch_answer`): the seq and one total per
    status, adding up to the request's ops; `more` adds properties."""
    count = {"type": "integer", "minimum": 0}
    return {
        "type": "object",
        "required": ["seq", *_TOTALS, *more],
        "properties": {"seq": count, **dict.fromkeys(_TOTALS, count), **more},
    }


#: Refusals every write can meet on its way to the commit: the token, the idempotency key,
#: the quota, the batcher, the store.
_WRITE_ERRORS: tuple[int, ...] = (401, 403, 413, 422, 429, 503, 507)

#: The scope key `reads.auth.ReadAuth` sets on a read it authorized (the gateway does not
#: import `reads`; `mercury/root.py` puts that middleware in front with `--read-auth`).
READ_KEYSPACES = "mercury.read_keyspaces"

_IDEMPOTENCY_KEY = doc.header(
    "Idempotency-Key",
    "1-200 bytes: a retry of the same request gets the first answer, not applied again",
    schema={"type": "string", "minLength": 1, "maxLength": 200},
)
_ASYNC = doc.query("async", {"type": "boolean"}, "answer 202 on enqueue, before the commit")
_KV_PARAMS = [
    doc.header("If-Match", 'write only if the key\'s current version is this one: `"<seq>"`'),
    doc.header("If-None-Match", "`*`: create only (the key must be absent)"),
    _IDEMPOTENCY_KEY,
    _ASYNC,
]

_TTL_PARAMS = [
    doc.query(
        "ttl",
        {"type": "string"},
        "the key expires this long after the write: `90s`, `5m`, `1h`, `1h30m`, `2d` or a "
        "number of seconds (1 s to one year); a write without ttl or expires_at clears it",
    ),
    doc.query(
        "expires_at",
        {"type": "string", "format": "date-time"},
        "the key expires at this RFC 3339 time (1 s to one year ahead)",
    ),
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

    read = body_reader(request.receive, request.headers.get("content-length"), request.scope)
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    headers = {k: v for k, v in request.headers.items()}
    a = await handler(_gw(request), headers, raw, request.scope["query_string"], read, t0)
    return answer_response(a)


@router.put(
    "/v1/kv/{key:anykey}",
    summary="Write one key (acknowledged after the durable commit)",
    responses=doc.answers(
        {
            200: doc.json_body(
                '`{"seq", "status": "written" | "duplicate" | "superseded"}` after the commit',
                _one_key("written", "duplicate", "superseded"),
                doc.WRITE_HEADERS,
            ),
            202: _ACCEPTED,
        },
        400,
        *_WRITE_ERRORS,
        (408, "the value stopped arriving"),
        (412, "the If-Match / If-None-Match condition failed (`current_seq`)"),
    ),
    openapi_extra={
        "parameters": [_KEY_PARAM, *_KV_PARAMS, *_TTL_PARAMS],
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
    "/v1/kv/{key:anykey}",
    summary="Delete one key (acknowledged after the durable commit)",
    responses=doc.answers(
        {
            200: doc.json_body(
                '`{"seq", "status": "deleted" | "absent"}` after the commit',
                _one_key("deleted", "absent"),
                doc.WRITE_HEADERS,
            ),
            202: _ACCEPTED,
        },
        400,
        *_WRITE_ERRORS,
        (412, "the If-Match / If-None-Match condition failed (`current_seq`)"),
    ),
    openapi_extra={"parameters": [_KEY_PARAM, *_KV_PARAMS]},
)
async def delete_kv(request: Request) -> Response:
    """200 `{"seq", "status": "deleted" | "absent"}`, 412 when the condition fails."""
    return await _call(request, kv_handlers.delete_kv)


@router.delete(
    "/v1/kv",
    summary="Delete the keys under a prefix, one batch per request",
    responses=doc.answers(
        {
            200: doc.json_body(
                'the batch totals plus `"more"`: repeat while it is true',
                _batch(more={"type": "boolean"}),
                doc.WRITE_HEADERS,
            ),
            202: _ACCEPTED,
        },
        (400, "no `prefix`, a key condition sent, or a delete guard of 0"),
        *_WRITE_ERRORS,
    ),
    openapi_extra={
        "parameters": [
            doc.query(
                "prefix",
                {"type": "string", "minLength": 1, "maxLength": 500},
                "the prefix, inside the producer's keyspaces",
                required=True,
            ),
            _IDEMPOTENCY_KEY,
            _ASYNC,
        ]
    },
)
async def delete_prefix(request: Request) -> Response:
    """200 `{"seq", "deleted", ..., "more"}`: at most one batch's worth of keys (the request
    limit and the keyspace's mass-delete guard); repeat while `more` is true."""
    return await _call(request, kv_handlers.delete_prefix)


_GET_ANSWERS = doc.answers(
    {
        200: doc.body(
            "application/octet-stream",
            "the value's bytes",
            {"type": "string", "format": "binary"},
            {
                **VERSION_HEADERS,
                "X-Mercury-Seq": {
                    "description": "alias of X-Mercury-Version on the root",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1},
                },
            },
        )
    },
    (400, "the key is empty or the route is spelt with percent-escapes"),
    401,
    (403, "the key is outside the token's keyspaces, or a consumer token"),
    (404, "no such key"),
    (413, "the key is over 500 bytes"),
    (500, "the stored value failed its CRC (`corrupt-value`)"),
)


@router.get(
    "/v1/kv/{key:anykey}",
    summary="Read one key (producers: their keyspaces; admin: all)",
    response_class=Response,  # the value's bytes, declared below (not FastAPI's JSON)
    responses=_GET_ANSWERS,
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
        raise NoSuchKeyError(f"no key {key.decode('utf-8', 'backslashreplace')!r}")
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
            **ttl.headers(v.expires_us),
        },
    )


# HEAD: the same answer without its body (the server drops it), as a GET-able resource owes.
router.add_api_route(
    "/v1/kv/{key:anykey}",
    get_kv,
    methods=["HEAD"],
    operation_id="head_kv",
    summary="Read one key's headers (as GET, without the body)",
    response_class=Response,
    responses=_GET_ANSWERS,
    openapi_extra={"parameters": [_KEY_PARAM]},
)


@router.post(
    "/v1/batch",
    summary="Write many keys in one request (JSON or application/msgpack)",
    responses=doc.answers(
        {
            200: doc.json_body(
                '`{"seq", "written", "deleted", "duplicates", "absent", "superseded", '
                '"precondition_failed"}` (+ `results`) after the commit',
                _batch(),
                doc.WRITE_HEADERS,
            ),
            202: _ACCEPTED,
        },
        (400, "a malformed body or op, or If-Match / If-None-Match sent"),
        *_WRITE_ERRORS,
        (408, "the body stopped arriving"),
    ),
    openapi_extra={
        "parameters": [
            _IDEMPOTENCY_KEY,
            _ASYNC,
            doc.query(
                "results",
                {"type": "boolean"},
                "list each op's key, status and seq (always with conditions)",
            ),
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
