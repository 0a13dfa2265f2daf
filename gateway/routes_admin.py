"""Admin routes: the ACL document, producers, consumers, tokens, audit (docs/api.md).

Every call needs the admin token. Every change commits the whole ACL as the replicated
document ``acl`` with its audit record, through the log (`gateway/aclstore.py`), and
changes are serialised by one lock per gateway: a change is computed from the ACL in force
and committed before the next one reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import weakref
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from acl import audit
from acl.doc import check_document, document_diff
from acl.model import (
    CONSUMER,
    PRODUCER,
    Acl,
    Consumer,
    Producer,
    TokenInfo,
    consumer_from_config,
    producer_from_config,
)
from acl.tokens import hash_token, new_token
from core.errors import BadRequestError, PreconditionFailedError
from core.problems import problem_document
from gateway import aclstore
from gateway import openapi_doc as doc
from gateway.bodies import parse_body
from gateway.http import body_reader, json_response
from gateway.writes import Gateway
from store.batchwrite import now_us
from store.ops import DELETE, Op, Status

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


ADMIN_WHO = "admin"
#: Keys purged per transaction when no guard of the producer caps deletes lower.
PURGE_CHUNK = 10_000
_locks: weakref.WeakKeyDictionary[Gateway, asyncio.Lock] = weakref.WeakKeyDictionary()


_CONSUMER_SCHEMA = {
    "type": "object",
    "properties": {"keyspaces": {"type": "array", "items": {"type": "string"}}},
}
_ACL_SCHEMA = {
    "type": "object",
    "properties": {
        "producers": {"type": "object", "additionalProperties": _PRODUCER_SCHEMA},
        "consumers": {"type": "object", "additionalProperties": _CONSUMER_SCHEMA},
    },
}
_TOKEN_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string"}, "expires_in_s": {"type": "integer"}},
}


#: Every admin call: the admin token, or 401 / 403.
_ADMIN: tuple[int | tuple[int, str], ...] = (401, (403, "not the admin token"))
#: A call with a JSON body (at most 1 MiB).
_BODY: tuple[int | tuple[int, str], ...] = (
    (400, "the body is not a JSON object of the documented fields"),
    (408, "the body stopped arriving"),
    (413, "the body is over 1 MiB"),
)
#: A change commits the ACL through the log.
_CHANGE: tuple[int, ...] = (503, 507)
_CONFIG = {"type": "object", "description": "the configuration (never tokens or hashes)"}


def _answers(ok: dict[int, dict[str, Any]], *errors: int | tuple[int, str]) -> dict[Any, Any]:
    """`doc.answers` with the admin token's 401 / 403."""
    return doc.answers(ok, *_ADMIN, *errors)


def _body_doc(schema: Any, required: bool = True) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": schema}},
        }
    }


def _admin(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gw
    gw.require_admin(request.headers.get("authorization"))
    return gw


def _lock(gw: Gateway) -> asyncio.Lock:
    lock = _locks.get(gw)
    if lock is None:
        lock = _locks[gw] = asyncio.Lock()
    return lock


async def _body(request: Request, what: str, *, empty_ok: bool = False) -> Any:
    read = body_reader(request.receive, request.headers.get("content-length"))
    raw = await read(1 << 20, what)
    if empty_ok and not raw.strip():
        return {}
    doc = parse_body(raw, None)
    if not isinstance(doc, dict):
        raise BadRequestError("body must be a JSON object")
    return doc


async def _commit(gw: Gateway, acl: Acl, action: str, target: str, diff: list[str]) -> int:
    return await gw.set_acl(acl, aclstore.Change(ADMIN_WHO, action, target, tuple(diff)))


async def _commit_if_changed(gw: Gateway, new: Acl, action: str, target: str) -> None:
    """Commit `new` with its audit record, unless it leaves the document as it is (an
    idempotent PUT writes nothing to the log). Call under `_lock(gw)`."""
    diff = document_diff(gw.acl.document(), new.document())
    if diff:
        await _commit(gw, new, action, target, diff)


def _problem(status: int, title: str, detail: str, **extra: Any) -> Response:
    """A problem+json answer for the statuses no error class carries (422, 428)."""
    slug = title.lower().replace(" ", "-")
    doc = problem_document(status, detail, slug=slug, title=title, **extra)
    return Response(orjson.dumps(doc), status_code=status, media_type="application/problem+json")


# --- the ACL as one document -------------------------------------------------------------


@router.get(
    "/v1/admin/acl",
    summary="The whole ACL as one document (no secrets)",
    responses=_answers(
        {
            200: doc.json_body(
                '`{"version", "producers", "consumers"}`',
                {"type": "object", "required": ["version", "producers", "consumers"]},
                {
                    "ETag": {
                        "description": '`"<version>"`',
                        "required": True,
                        "schema": {"type": "string", "pattern": '^"[0-9]+"$'},
                    }
                },
            )
        }
    ),
)
async def get_acl(request: Request) -> Response:
    """`{"version", "producers", "consumers"}` with `ETag: "<version>"`; the version is the
    seq of the log entry that last wrote the ACL (0 before any)."""
    gw = _admin(request)
    async with _lock(gw):
        version = aclstore.version(gw.store)
        body = {"version": version, **gw.acl.document()}
    return json_response(body, headers={"ETag": f'"{version}"'})


def _if_match(request: Request) -> int | None:
    raw = request.headers.get("if-match")
    if raw is None:
        return None
    v = raw.strip().removeprefix("W/").strip('"')
    if not v.isdigit():
        raise BadRequestError(f'If-Match must be the ACL version as "<seq>", got {raw!r}')
    return int(v)


@router.put(
    "/v1/admin/acl",
    summary="Replace the whole ACL document, all or nothing",
    responses=_answers(
        {200: doc.json_body('`{"version", "dry_run", "changes", "committed"}`')},
        (400, 'the body is not a JSON object, or If-Match is not `"<version>"`'),
        *_BODY[1:],
        (412, "the ACL moved on (`current_version`)"),
        (422, "the document is invalid: `errors` lists every problem; nothing changed"),
        (428, "no If-Match"),
        *_CHANGE,
    ),
    openapi_extra={
        **_body_doc(_ACL_SCHEMA),
        "parameters": [
            doc.header(
                "If-Match",
                '`"<version>"`: the ETag of GET /v1/admin/acl (428 without it)',
                required=True,
            ),
            doc.query("dry_run", {"type": "boolean"}, "check and diff only, commit nothing"),
        ],
    },
)
async def put_acl(request: Request) -> Response:
    """Needs `If-Match: "<version>"` (428 without, 412 when the ACL changed meanwhile).
    Validates the whole document and answers 422 with every problem in `errors`, changing
    nothing; otherwise commits it in one transaction (tokens of producers and consumers
    that stay are kept). `?dry_run=true`: the same checks and the diff, nothing committed."""
    gw = _admin(request)
    dry = request.query_params.get("dry_run", "false").lower() in ("1", "true", "yes")
    want = _if_match(request)
    body = await _body(request, "ACL document")
    if want is None:
        return _problem(
            428,
            "Precondition Required",
            'PUT /v1/admin/acl needs If-Match: "<version>" (the ETag of GET /v1/admin/acl)',
        )
    async with _lock(gw):
        version = aclstore.version(gw.store)
        if want != version:
            raise PreconditionFailedError(
                f"the ACL is at version {version}, not {want}",
                current_version=version,
                hint="GET /v1/admin/acl, reapply your change, PUT again",
            )
        producers, consumers, errors = check_document(body)
        if errors:
            return _problem(
                422, "Invalid ACL document", f"{len(errors)} problem(s); nothing changed",
                errors=errors,
            )  # fmt: skip
        new = gw.acl.with_document(producers, consumers)
        changes = document_diff(gw.acl.document(), new.document())
        if dry or not changes:
            return json_response(
                {"version": version, "dry_run": dry, "changes": changes, "committed": False}
            )
        version = await _commit(gw, new, "put_acl", "acl", changes)
    return json_response(
        {"version": version, "dry_run": False, "changes": changes, "committed": True},
        headers={"ETag": f'"{version}"'},
    )


@router.get(
    "/v1/admin/audit",
    summary="Audit records of admin changes",
    responses=_answers(
        {200: doc.json_body('`{"records": [...]}` in time order', {"type": "object"})},
        (400, "a malformed `since`, or `limit` not 1 to 1000"),
    ),
    openapi_extra={
        "parameters": [
            doc.query(
                "since",
                {"type": "string"},
                "a seq (records after it) or an RFC 3339 time (records at or after it)",
            ),
            doc.query(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": 1000},
                "most records (default 1000)",
            ),
        ]
    },
)
async def get_audit(request: Request) -> Response:
    """`{"records": [{"seq", "time", "time_us", "who", "action", "target", "diff"}]}` in
    time order; `since` = a seq (records after it) or an RFC 3339 time (records at or
    after it); `limit` (default and max 1000)."""
    gw = _admin(request)
    since = audit.parse_since(request.query_params.get("since"))
    try:
        limit = int(request.query_params.get("limit", "1000"))
    except ValueError as err:
        raise BadRequestError("limit must be an integer from 1 to 1000") from err
    if not 1 <= limit <= 1000:  # refused, not clamped: the caller asked for something else
        raise BadRequestError(f"limit must be an integer from 1 to 1000, got {limit}")
    after = audit.name(since.time_us, "") if since.time_us else ""
    out: list[dict[str, Any]] = []
    while len(out) < limit:
        page = await asyncio.to_thread(gw.store.scan_docs, audit.PREFIX, after=after, limit=1000)
        for _name, d in page:
            if audit.selected(d.seq, d.body, since) and len(out) < limit:
                out.append(audit.view(d.seq, d.body))
        if len(page) < 1000:
            break
        after = page[-1][0]
    return json_response({"records": out})


# --- producers ---------------------------------------------------------------------------


@router.put(
    "/v1/admin/producers/{name}",
    summary="Create or update a producer (keyspaces, shared, quota, guards)",
    responses=_answers(
        {
            200: doc.json_body("updated: the producer's configuration", _CONFIG),
            201: doc.json_body("created: the producer's configuration", _CONFIG),
        },
        *_BODY,
        (409, "a keyspace overlaps another producer's and is not shared by both"),
        *_CHANGE,
    ),
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
    doc = await _body(request, "producer body")
    unknown = set(doc) - {"keyspaces", "shared", "quota", "guards", "name"}
    if unknown:
        raise BadRequestError(f"unknown fields {sorted(unknown)}")
    p = producer_from_config(name, doc)
    async with _lock(gw):
        old = gw.acl
        created = name not in old.producers
        await _commit_if_changed(gw, old.put(p), "put_producer", name)
    return json_response(gw.acl.producers[name].config(), 201 if created else 200)


@router.get(
    "/v1/admin/producers",
    summary="List producers",
    responses=_answers({200: doc.json_body('`{"producers": [configuration, ...]}`')}),
)
async def list_producers(request: Request) -> Response:
    """`{"producers": [config...]}` (token ids, never tokens or hashes)."""
    gw = _admin(request)
    return json_response({"producers": [p.config() for _, p in sorted(gw.acl.producers.items())]})


@router.get(
    "/v1/admin/producers/{name}",
    summary="One producer's configuration",
    responses=_answers(
        {200: doc.json_body("the configuration", _CONFIG)}, (404, "no such producer")
    ),
)
async def get_producer(name: str, request: Request) -> Response:
    """The producer's configuration; 404 when unknown."""
    gw = _admin(request)
    return json_response(gw.acl.get(name).config())


@router.delete(
    "/v1/admin/producers/{name}",
    summary="Remove a producer and its tokens",
    responses=_answers(
        {200: doc.json_body('`{"removed": name, "purged": n}`')},
        (404, "no such producer"),
        *_CHANGE,
    ),
    openapi_extra={
        "parameters": [
            doc.query(
                "purge",
                {"type": "boolean"},
                "delete every key it owns first (its tokens revoked before)",
            )
        ]
    },
)
async def delete_producer(name: str, request: Request) -> Response:
    """200 `{"removed": name, "purged": n}`; 404 when unknown. Its keys stay (and keep its
    usage) unless `?purge=true`: then every key it owns in its keyspaces is deleted through
    the log first, in transactions no larger than its delete guards allow, one per batch
    window, and the producer is removed only when all are gone. Its tokens are revoked
    before the purge starts (so it cannot write behind the purge's cursor: a request
    authenticated before, still reading its body or held by its quota, is refused at its
    submit) and the writes it had submitted are let commit first: a failed purge leaves the
    producer, tokenless, for a retry."""
    gw = _admin(request)
    purge = request.query_params.get("purge", "false").lower() in ("1", "true", "yes")
    async with _lock(gw):
        p = gw.acl.get(name)
        purged = 0
        with gw.fence(name) if purge else contextlib.nullcontext():
            if purge:
                if p.tokens:
                    gone = [f"- token {tid}" for tid in sorted(p.tokens)]
                    await _commit(gw, gw.acl.without_tokens(name), "revoke_token", name, gone)
                # Requests submitted before the fence commit first; any other request of
                # this producer (a slow body, a quota hold) is refused at its submit.
                await gw.settled(name)
                purged = await _purge(gw, name)
            old = gw.acl
            new = old.remove(name)
            diff = document_diff(old.document(), new.document())
            if purged:
                diff.append(f"purged {purged} key(s)")
            await _commit(gw, new, "delete_producer", name, diff)
    return json_response({"removed": name, "purged": purged})


async def _purge(gw: Gateway, name: str) -> int:
    """Delete every key `name` owns in its keyspaces; return how many were deleted."""
    p = gw.acl.get(name)
    caps = [
        g.max_deletes_per_batch
        for g in p.guards.values()
        if g.max_deletes_per_batch is not None and g.max_deletes_per_batch > 0
    ]
    chunk = min([PURGE_CHUNK, gw.settings.batch_max_ops, *caps])
    window = gw.settings.batch_window_ms / 1000.0
    total = 0
    for prefix in p.prefixes():
        start = prefix
        while True:
            ops = await asyncio.to_thread(_owned_keys, gw, name, prefix, start, chunk)
            if not ops:
                break
            # Conditional deletes: a key rewritten since the scan is not this purge's.
            # Through the batcher, as any write: counted in the usage series, refreshed
            # in the usage counters, and (HA) acknowledged only once the standbys hold it.
            nbytes = sum(len(op.key) for op in ops)
            await gw.batcher.wait_room(len(ops), nbytes, name)
            results = await gw.batcher.submit(ops, nbytes, name)
            total += sum(r.status == Status.DELETED for r in results)
            start = ops[-1].key + b"\x00"
            if len(ops) < chunk:
                break
            await asyncio.sleep(window)  # one transaction per batch window
    return total


def _owned_keys(gw: Gateway, name: str, prefix: bytes, start: bytes, limit: int) -> list[Op]:
    out: list[Op] = []
    with gw.store.reader() as r:
        for k, v in r.scan(start=start, prefix=prefix):
            if v is not None and v.owner == name:
                out.append(Op(DELETE, bytes(k), owner=name, expect_seq=v.seq))
                if len(out) >= limit:
                    break
    return out


# --- consumers ---------------------------------------------------------------------------


@router.put(
    "/v1/admin/consumers/{name}",
    summary="Create or update a consumer (keyspaces)",
    responses=_answers(
        {
            200: doc.json_body("updated: the consumer's configuration", _CONFIG),
            201: doc.json_body("created: the consumer's configuration", _CONFIG),
        },
        *_BODY,
        *_CHANGE,
    ),
    openapi_extra=_body_doc(_CONSUMER_SCHEMA),
)
async def put_consumer(name: str, request: Request) -> Response:
    """Body `{"keyspaces": [...]}` (the prefixes it may read on replicas); 201 created,
    200 updated, with its configuration."""
    gw = _admin(request)
    doc = await _body(request, "consumer body")
    if set(doc) - {"keyspaces", "name"}:
        raise BadRequestError(f"unknown fields {sorted(set(doc) - {'keyspaces', 'name'})}")
    c = consumer_from_config(name, doc)
    async with _lock(gw):
        old = gw.acl
        created = name not in old.consumers
        await _commit_if_changed(gw, old.put_consumer(c), "put_consumer", name)
    return json_response(gw.acl.consumers[name].config(), 201 if created else 200)


@router.get(
    "/v1/admin/consumers",
    summary="List consumers",
    responses=_answers({200: doc.json_body('`{"consumers": [configuration, ...]}`')}),
)
async def list_consumers(request: Request) -> Response:
    """`{"consumers": [config...]}` (token ids, never tokens or hashes)."""
    gw = _admin(request)
    return json_response({"consumers": [c.config() for _, c in sorted(gw.acl.consumers.items())]})


@router.get(
    "/v1/admin/consumers/{name}",
    summary="One consumer's configuration",
    responses=_answers(
        {200: doc.json_body("the configuration", _CONFIG)}, (404, "no such consumer")
    ),
)
async def get_consumer(name: str, request: Request) -> Response:
    """The consumer's configuration; 404 when unknown."""
    gw = _admin(request)
    return json_response(gw.acl.get_consumer(name).config())


@router.delete(
    "/v1/admin/consumers/{name}",
    summary="Remove a consumer and its tokens",
    responses=_answers(
        {200: doc.json_body('`{"removed": name}`')}, (404, "no such consumer"), *_CHANGE
    ),
)
async def delete_consumer(name: str, request: Request) -> Response:
    """200 `{"removed": name}`; 404 when unknown."""
    gw = _admin(request)
    async with _lock(gw):
        old = gw.acl
        new = old.remove_consumer(name)
        diff = document_diff(old.document(), new.document())
        await _commit(gw, new, "delete_consumer", name, diff)
    return json_response({"removed": name})


# --- tokens (producers and consumers alike) ----------------------------------------------


_NEW_TOKEN = _answers(
    {
        201: doc.json_body(
            '`{"token_id", "token", "label", "created", "expires"}`: the token, shown once',
            {"type": "object", "required": ["token_id", "token"]},
        )
    },
    *_BODY,
    (404, "no such holder"),
    *_CHANGE,
)
_LIST_TOKENS = _answers(
    {200: doc.json_body('`{"tokens": [...]}`, never a secret')}, (404, "no such holder")
)
_REVOKE = _answers(
    {200: doc.json_body('`{"revoked": token_id}`')}, (404, "no such holder or token"), *_CHANGE
)


def _token_view(gw: Gateway, tid: str, t: TokenInfo) -> dict[str, Any]:
    used = gw.auth.last_used.get(tid)
    return {
        "token_id": tid,
        "label": t.label,
        "created": audit.rfc3339(t.created_us) if t.created_us else None,
        "expires": audit.rfc3339(t.expires_us) if t.expires_us is not None else None,
        "last_used": audit.rfc3339(used) if used else None,
    }


async def _new_token(kind: str, name: str, request: Request) -> Response:
    gw = _admin(request)
    doc = await _body(request, "token body", empty_ok=True)
    if set(doc) - {"label", "expires_in_s"}:
        raise BadRequestError(f"unknown fields {sorted(set(doc) - {'label', 'expires_in_s'})}")
    label = doc.get("label", "")
    exp = doc.get("expires_in_s")
    if not isinstance(label, str) or len(label) > 200:
        raise BadRequestError("label must be a string of at most 200 characters")
    if exp is not None and (isinstance(exp, bool) or not isinstance(exp, int) or exp <= 0):
        raise BadRequestError("expires_in_s must be a positive integer (seconds) or null")
    token_id = "tok_" + secrets.token_hex(6)
    token = new_token()
    t = now_us()
    async with _lock(gw):
        new = gw.acl.add_token(
            name, token_id, token, kind=kind, label=label, created_us=t,
            expires_us=None if exp is None else t + exp * 1_000_000,
        )  # fmt: skip
        line = f"+ token {token_id} of {kind} {name}" + (f" ({label})" if label else "")
        await _commit(gw, new, "create_token", f"{kind}/{name}", [line])
    view = _token_view(gw, token_id, _holder(new, kind, name).tokens[token_id])
    view.pop("last_used")
    return json_response({**view, "token": token}, 201)


def _holder(acl: Acl, kind: str, name: str) -> Producer | Consumer:
    return acl.get_consumer(name) if kind == CONSUMER else acl.get(name)


def _list_tokens(kind: str, name: str, request: Request) -> Response:
    gw = _admin(request)
    holder = _holder(gw.acl, kind, name)
    return json_response(
        {"tokens": [_token_view(gw, tid, t) for tid, t in sorted(holder.tokens.items())]}
    )


async def _revoke(kind: str, name: str, token_id: str, request: Request) -> Response:
    gw = _admin(request)
    async with _lock(gw):
        new = gw.acl.revoke_token(name, token_id, kind=kind)
        await _commit(gw, new, "revoke_token", f"{kind}/{name}", [f"- token {token_id}"])
    return json_response({"revoked": token_id})


@router.post(
    "/v1/admin/producers/{name}/tokens",
    summary="Issue a new token (shown once)",
    status_code=201,  # its only success: FastAPI then declares no 200
    responses=_NEW_TOKEN,
    openapi_extra=_body_doc(_TOKEN_SCHEMA, required=False),
)
async def new_producer_token(name: str, request: Request) -> Response:
    """Optional body `{"label", "expires_in_s"}`. 201 `{"token_id", "token", "label",
    "created", "expires"}`: the token is never shown again (only its hash is kept)."""
    return await _new_token(PRODUCER, name, request)


@router.get(
    "/v1/admin/producers/{name}/tokens",
    summary="List a producer's tokens",
    responses=_LIST_TOKENS,
)
async def list_producer_tokens(name: str, request: Request) -> Response:
    """`{"tokens": [{"token_id", "label", "created", "expires", "last_used"}]}`, never a
    secret; `last_used` is when this root process last accepted it (null: not since it
    started)."""
    return _list_tokens(PRODUCER, name, request)


@router.delete(
    "/v1/admin/producers/{name}/tokens/{token_id}",
    summary="Revoke one token of a producer",
    responses=_REVOKE,
)
async def revoke_token(name: str, token_id: str, request: Request) -> Response:
    """200 `{"revoked": token_id}`; 404 when unknown. Takes effect on the next request."""
    return await _revoke(PRODUCER, name, token_id, request)


@router.post(
    "/v1/admin/consumers/{name}/tokens",
    summary="Issue a consumer token (shown once)",
    status_code=201,  # its only success: FastAPI then declares no 200
    responses=_NEW_TOKEN,
    openapi_extra=_body_doc(_TOKEN_SCHEMA, required=False),
)
async def new_consumer_token(name: str, request: Request) -> Response:
    """As for producers: optional `{"label", "expires_in_s"}`; 201 `{"token_id", "token",
    ...}`."""
    return await _new_token(CONSUMER, name, request)


@router.get(
    "/v1/admin/consumers/{name}/tokens",
    summary="List a consumer's tokens",
    responses=_LIST_TOKENS,
)
async def list_consumer_tokens(name: str, request: Request) -> Response:
    """As for producers."""
    return _list_tokens(CONSUMER, name, request)


@router.delete(
    "/v1/admin/consumers/{name}/tokens/{token_id}",
    summary="Revoke one token of a consumer",
    responses=_REVOKE,
)
async def revoke_consumer_token(name: str, token_id: str, request: Request) -> Response:
    """200 `{"revoked": token_id}`; 404 when unknown."""
    return await _revoke(CONSUMER, name, token_id, request)


# --- the admin token -----------------------------------------------------------------


@router.post(
    "/v1/admin/token",
    summary="Rotate the admin token (the new one shown once)",
    status_code=201,  # its only success: FastAPI then declares no 200
    responses=_answers(
        {
            201: doc.json_body(
                '`{"token", "created"}`: the new admin token, shown once',
                {"type": "object", "required": ["token", "created"]},
            )
        },
        *_CHANGE,
    ),
)
async def rotate_admin_token(request: Request) -> Response:
    """201 `{"token", "created"}`: a new admin token, whose hash replaces the old one's
    through the log (every candidate holds it: a failover keeps it). The old token is
    refused from the next request on; keep the new one, it is never shown again."""
    gw = _admin(request)
    token = new_token()
    t = now_us()
    async with _lock(gw):
        change = aclstore.Change(ADMIN_WHO, "rotate_admin_token", "admin", ("~ admin token",))
        await gw.set_admin_hash(hash_token(token), change)
    return json_response({"token": token, "created": audit.rfc3339(t)}, 201)
