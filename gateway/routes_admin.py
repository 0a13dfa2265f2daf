"""Admin routes: producers, tokens (docs/api.md). Every call needs the admin token."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from starlette.responses import Response

from acl.model import producer_from_config
from acl.tokens import new_token
from core.errors import BadRequestError
from gateway.bodies import parse_body
from gateway.http import body_reader, json_response
from gateway.writes import Gateway

router = APIRouter(tags=["admin"])

_PRODUCER_SCHEMA = {
    "type": "object",
    "properties": {
        "keyspaces": {"type": "array", "items": {"type": "string"}},
        "shared": {"type": "array", "items": {"type": "string"}},
        "quota": {
            "type": "object",
            "properties": {
                "ops_per_s": {"type": "number"},
                "burst": {"type": "number"},
                "bytes_per_s": {"type": "number"},
                "bytes_burst": {"type": "number"},
                "max_delay_ms": {"type": "integer"},
                "max_bytes_stored": {"type": "integer"},
                "shadow": {"type": "boolean"},
            },
        },
        "guards": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "refuse_empty": {"type": "boolean"},
                    "max_deletes_per_batch": {"type": "integer"},
                },
            },
        },
    },
}


def _admin(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gw
    gw.require_admin(request.headers.get("authorization"))
    return gw


@router.put(
    "/v1/admin/producers/{name}",
    summary="Create or update a producer (keyspaces, shared, quota, guards)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _PRODUCER_SCHEMA}},
        }
    },
)
async def put_producer(name: str, request: Request) -> Response:
    """200 with the producer's configuration; 409 when a keyspace overlaps another
    producer's and is not shared by both."""
    gw = _admin(request)
    read = body_reader(request.receive, request.headers.get("content-length"))
    doc = parse_body(await read(1 << 20, "producer body"), None)
    if not isinstance(doc, dict):
        raise BadRequestError("body must be a JSON object")
    unknown = set(doc) - {"keyspaces", "shared", "quota", "guards", "name"}
    if unknown:
        raise BadRequestError(f"unknown fields {sorted(unknown)}")
    p = producer_from_config(name, doc)
    created = name not in gw.acl.producers
    await gw.set_acl(gw.acl.put(p))
    return json_response(gw.acl.producers[name].config(), 201 if created else 200)


@router.get("/v1/admin/producers", summary="List producers")
async def list_producers(request: Request) -> Response:
    """`{"producers": [config...]}` (token ids, never tokens or hashes)."""
    gw = _admin(request)
    return json_response({"producers": [p.config() for _, p in sorted(gw.acl.producers.items())]})


@router.get("/v1/admin/producers/{name}", summary="One producer's configuration")
async def get_producer(name: str, request: Request) -> Response:
    """The producer's configuration; 404 when unknown."""
    gw = _admin(request)
    return json_response(gw.acl.get(name).config())


@router.delete("/v1/admin/producers/{name}", summary="Remove a producer and its tokens")
async def delete_producer(name: str, request: Request) -> Response:
    """200 `{"removed": name}`; 404 when unknown. Its keys stay (and keep its usage)."""
    gw = _admin(request)
    await gw.set_acl(gw.acl.remove(name))
    return json_response({"removed": name})


@router.post("/v1/admin/producers/{name}/tokens", summary="Issue a new token (shown once)")
async def new_producer_token(name: str, request: Request) -> Response:
    """201 `{"token_id", "token"}`: the token is never shown again (only its hash is kept)."""
    gw = _admin(request)
    gw.acl.get(name)
    token_id = "tok_" + secrets.token_hex(6)
    token = new_token()
    await gw.set_acl(gw.acl.add_token(name, token_id, token))
    return json_response({"token_id": token_id, "token": token}, 201)


@router.delete(
    "/v1/admin/producers/{name}/tokens/{token_id}", summary="Revoke one token of a producer"
)
async def revoke_token(name: str, token_id: str, request: Request) -> Response:
    """200 `{"revoked": token_id}`; 404 when unknown. Takes effect on the next request."""
    gw = _admin(request)
    await gw.set_acl(gw.acl.revoke_token(name, token_id))
    return json_response({"revoked": token_id})
