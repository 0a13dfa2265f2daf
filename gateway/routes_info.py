"""Routes anyone (or the admin / a producer) may call: status, usage, health, metrics,
and the read paths the root refuses (range/bulk reads belong to consumer nodes)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from acl.model import Quota, quota_to_dict
from core.errors import ForbiddenError, MisdirectedError, NotFoundError
from gateway import openapi_doc as doc
from gateway.admission import OUTCOMES
from gateway.auth import ADMIN
from gateway.http import json_response
from gateway.writes import Gateway
from store import setaside
from store.usage import Usage

router = APIRouter()


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gw
    return gw


def usage_row(
    name: str,
    u: Usage,
    quota: dict[str, int] | None = None,
    limits: Quota | None = None,
) -> dict[str, Any]:
    """One producer's usage as `GET /v1/usage` lists it; `quota_ops` splits the ops over
    the rate quota by outcome (held, refused, too_large, shadow) since this process
    started (`throttled` is their durable total). `quota` is the producer's quota (None
    for an owner no longer in the ACL), `used_pct` its stored bytes as a percentage of
    `max_bytes_stored` (None without that cap)."""
    cap = limits.max_bytes_stored if limits is not None else None
    return {
        "quota": quota_to_dict(limits) if limits is not None else None,
        "used_pct": round(100.0 * u.bytes / cap, 3) if cap else None,
        "producer": name,
        "keys": u.keys,
        "bytes": u.bytes,
        "writes": u.writes,
        "deletes": u.deletes,
        "duplicates": u.duplicates,
        "throttled": u.throttled,
        "expiries": u.expiries,
        "quota_ops": quota or dict.fromkeys(OUTCOMES, 0),
    }


_HEALTH = {
    "type": "object",
    "required": ["status", "role", "seq"],
    "properties": {
        "status": {"type": "string", "enum": ["ok", "stopping"]},
        "role": {"type": "string"},
        "seq": {"type": "integer", "minimum": 0},
    },
}


@router.get(
    "/v1/status",
    tags=["info"],
    summary="db id, role, seq, hash head",
    responses=doc.answers(
        {
            200: doc.json_body(
                '`{"db_id", "role": "root", "seq", "hash_head", "log_first_seq", '
                '"log_retained_seconds", "set_aside"}`',
                {
                    "type": "object",
                    "required": ["db_id", "role", "seq", "hash_head", *setaside.NODE_FACTS_SCHEMA],
                    "properties": setaside.NODE_FACTS_SCHEMA,
                },
            )
        }
    ),
)
async def status(request: Request) -> Response:
    """`{"db_id", "role": "root", "seq", "hash_head"}`."""
    gw = _gw(request)
    seq, head = gw.store.head()
    doc = {"db_id": gw.store.db_id, "role": "root", "seq": seq, "hash_head": head.hex()}
    # How much history replicas can still catch up from, and copies left on the disk.
    doc.update(setaside.node_facts(gw.store.path, *gw.store.retained()))
    return json_response(doc)


@router.get(
    "/healthz",
    tags=["info"],
    summary="liveness",
    responses={
        200: doc.json_body("accepting writes", _HEALTH),
        # the same JSON shape, not a problem: every node's health answers it
        503: doc.json_body('shutting down: `"status": "stopping"`', _HEALTH),
    },
)
async def healthz(request: Request) -> Response:
    """200 `{"status": "ok", "role": "root", "seq"}` while the gateway accepts writes (the
    shape every node answers), 503 with `"status": "stopping"` while shutting down."""
    gw = _gw(request)
    seq = gw.store.last_seq()
    if gw.batcher.closing:
        return json_response({"status": "stopping", "role": "root", "seq": seq}, 503)
    return json_response({"status": "ok", "role": "root", "seq": seq})


@router.get(
    "/metrics",
    tags=["info"],
    summary="Prometheus metrics",
    response_class=Response,  # the text exposition, declared below (not FastAPI's JSON)
    responses={
        200: doc.body(
            CONTENT_TYPE_LATEST.split(";", 1)[0], "Prometheus text exposition", {"type": "string"}
        )
    },
)
async def prom_metrics() -> Response:
    """Prometheus text exposition."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/v1/usage",
    tags=["admin"],
    summary="Usage of every producer (admin)",
    responses=doc.answers(
        {200: doc.json_body('`{"producers": [row, ...]}`', {"type": "object"})},
        401,
        (403, "not the admin token"),
    ),
)
async def usage_all(request: Request) -> Response:
    """`{"producers": [{"producer", "keys", "bytes", "writes", "deletes", "duplicates",
    "throttled", "expiries", ...}]}`:
    counters maintained in the write transactions, never a scan."""
    gw = _gw(request)
    gw.require_admin(request.headers.get("authorization"))
    usage = gw.store.usage()
    names = sorted(set(usage) | set(gw.acl.producers))
    return json_response(
        {
            "producers": [
                usage_row(n, usage.get(n, Usage()), gw.admission.counts.get(n), _limits(gw, n))
                for n in names
                if n
            ]
        }
    )


@router.get(
    "/v1/usage/{producer}",
    tags=["producer"],
    summary="Usage of one producer",
    responses=doc.answers(
        {200: doc.json_body("the producer's usage row", {"type": "object"})},
        401,
        (403, "neither the admin nor that producer"),
        (404, "no such producer"),
    ),
)
async def usage_one(producer: str, request: Request) -> Response:
    """That producer's usage row (the admin or the producer itself)."""
    gw = _gw(request)
    who = gw.authenticate(request.headers.get("authorization"))
    if who not in (ADMIN, producer):
        raise ForbiddenError(f"only the admin or producer {producer!r} may read its usage")
    usage = gw.store.usage()
    if producer not in usage and producer not in gw.acl.producers:
        raise NotFoundError(f"no producer {producer!r}")
    counts = gw.admission.counts.get(producer)
    row = usage_row(producer, usage.get(producer, Usage()), counts, _limits(gw, producer))
    return json_response(row)


def _limits(gw: Gateway, producer: str) -> Quota | None:
    p = gw.acl.producers.get(producer)
    return p.quota if p is not None else None


def _misdirected(request: Request) -> None:
    nodes = list(_gw(request).settings.consumer_nodes)
    raise MisdirectedError(
        "range and bulk reads are served by consumer nodes and replicas, never by the root",
        hint="send this read to a consumer node (`mercury replica`, default :8081)",
        consumer_nodes=nodes or None,
    )


def _misdirected_doc(*read_auth: int | tuple[int, str]) -> dict[str, Any]:
    """What the root answers a range or bulk read: always 421 (the route's status is 421
    so that FastAPI declares no 200); with `--read-auth` the token is checked first."""
    return {
        "status_code": 421,
        "response_class": Response,
        "responses": doc.answers(
            {},
            (401, "`--read-auth`: no token, or an unknown one"),
            (403, "`--read-auth`: outside the token's keyspaces"),
            *read_auth,
            (421, "always: served by consumer nodes and replicas (`consumer_nodes`)"),
        ),
    }


@router.get(
    "/v1/range",
    tags=["info"],
    summary="Refused on the root: use a consumer node",
    **_misdirected_doc(),
)
async def range_read(request: Request) -> Response:
    """Always 421: large range reads must never load the root."""
    _misdirected(request)
    raise AssertionError("unreachable")


@router.post(
    "/v1/get_bulk",
    tags=["info"],
    summary="Refused on the root: use a consumer node",
    **_misdirected_doc((413, "`--read-auth`: a body over 16 MiB")),
)
async def get_bulk(request: Request) -> Response:
    """Always 421: bulk reads are served by replicas and consumer nodes."""
    _misdirected(request)
    raise AssertionError("unreachable")
