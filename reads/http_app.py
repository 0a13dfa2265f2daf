"""The replica HTTP read API (docs/api.md) as a FastAPI app built by a factory.

Point gets (`GET|HEAD /v1/kv/{key}`) are the hot path of every consumer: they are answered
by a raw ASGI handler in `ReadApp.__call__`, before FastAPI's routing and middleware, which
otherwise cost about as much again as the whole raw request (see docs/reads.md); so is the
405 to any other method on a key. Every other route is ordinary FastAPI; the OpenAPI
document declares all of them (reads/openapi_doc.py). Each request uses one short LMDB read
transaction; none is held across an await.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qsl, quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from core import openapi, strictjson, ttl
from core.allow import allowed_methods
from core.errors import (
    CRCError,
    InvalidReadError,
    MercuryError,
    RangeOnRootError,
    ReadTooLargeError,
)
from core.problems import NO_SUCH_ROUTE, PROBLEM_JSON, no_route_detail
from reads import (
    bulkbody,
    jsonkv,
    keyspaces,
    openapi_doc,
    pointget,
    ranges,
    readstats,
    watch,
    workermetrics,
)
from reads.metrics import READ_ERRORS, READ_SECONDS
from reads.problems import problem, problem_body, problem_for
from store import setaside
from store.format import MAX_KEY
from store.ops import Value
from store.store import Store

KV_PREFIX = b"/v1/kv/"
NDJSON = "application/x-ndjson"
#: Keys per `POST /v1/get_bulk` (its body's bounds: reads/bulkbody.py), and bytes of values
#: in one answer.
MAX_BULK_KEYS = bulkbody.MAX_BULK_KEYS
MAX_BULK_BYTES = 64 << 20
#: Items read per transaction while streaming NDJSON (bounds memory and txn length)...
STREAM_CHUNK = 512
#: ... and bytes of keys and values per chunk (large values).
STREAM_CHUNK_BYTES = 4 << 20

log = logging.getLogger(__name__)


GetBulkBody = bulkbody.GetBulkBody


class ReadApp(FastAPI):
    """FastAPI app whose point gets skip the framework (see module docstring)."""

    store: Store
    #: Whether a `reads.auth.ReadAuth` guards the app (`--read-auth`): its document says so.
    read_auth: bool = False

    def openapi(self) -> dict[str, Any]:
        # FastAPI's document made true (reads/openapi_doc.py); built once, at the first ask.
        if self.openapi_schema is None:
            self.openapi_schema = openapi_doc.finish(
                openapi.generated(self),
                role=self.state.role,
                read_auth=self.read_auth,
            )
        return self.openapi_schema

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or quote(scope["path"]).encode()
            if raw.startswith(KV_PREFIX):
                if scope["method"] in ("GET", "HEAD"):
                    await self._point_get(scope, raw, send)
                else:  # any key, even one no route pattern matches (a newline in it)
                    await self._write_refused(pointget.key_of(raw), send)
                return
        await super().__call__(scope, receive, send)

    async def _write_refused(self, key: bytes, send: Send) -> None:
        """405 to every other method on a key: every node but the root's gateway is
        read-only. The body, if any, is not read."""
        text = key.decode("utf-8", "backslashreplace")
        body = problem_body(
            405,
            "read-only",
            f"{self.state.role} nodes serve reads only; key {text!r} was not changed",
            title="This node is read-only",
            hint="write through the gateway on the root (PUT /v1/kv/{key} there)",
        )
        headers = [
            (b"content-type", PROBLEM_JSON.encode()),
            (b"allow", b"GET, HEAD"),  # what a 405 must name (RFC 9110)
            (b"content-length", b"%d" % len(body)),
        ]
        await send({"type": "http.response.start", "status": 405, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _point_get(self, scope: Scope, raw_path: bytes, send: Send) -> None:
        # The answer is reads.pointget's, shared with the protocol fast path (reads/fasthttp.py).
        status, headers, body = pointget.point_get(
            self.store,
            pointget.key_of(raw_path),
            pointget.if_none_match(scope["headers"]),
            scope["method"] == "HEAD",
        )
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def create_read_app(
    store: Store,
    *,
    role: str,
    status: Callable[[], dict[str, object]],
    read_auth: bool = False,
) -> FastAPI:
    """The read API over `store` for a node of `role` ("replica", "consumer" or "root");
    `read_auth`: the caller puts a `reads.auth.ReadAuth` in front of it (its OpenAPI
    document then declares the token and the middleware's refusals).

    `status()` adds node facts to `GET /v1/status` (a replica gives "source" and
    "lag_seconds"). The root refuses range reads (421 problem+json pointing to consumer
    nodes). The app never writes to `store` and never closes it. The routes are this
    module's functions; they reach the store, role and status through ``app.state``.
    """
    app = ReadApp(
        title=f"Mercury {role} reads", docs_url=None, redoc_url=None, redirect_slashes=False
    )
    app.store = store
    app.read_auth = read_auth
    app.state.store = store
    app.state.role = role
    app.state.status = status
    app.add_exception_handler(MercuryError, _mercury_error)
    app.add_exception_handler(Exception, _unexpected)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.include_router(router)
    watch.install(app, store)  # GET /v1/watch (reads/watch.py)
    return app


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _role(request: Request) -> str:
    role: str = request.app.state.role
    return role


async def _mercury_error(_request: Request, err: Exception) -> Response:
    assert isinstance(err, MercuryError)
    if isinstance(err, CRCError):
        READ_ERRORS.labels("http", "crc").inc()
    return problem_for(err)


async def _unexpected(_request: Request, err: Exception) -> Response:
    # A bug: logged with its stack here, never shown to the client.
    log.exception("read request failed", exc_info=err)
    READ_ERRORS.labels("http", "internal").inc()
    return problem(500, "internal", "the read failed; see the node's log")


async def _http_error(request: Request, err: Exception) -> Response:
    assert isinstance(err, StarletteHTTPException)
    if err.status_code == 404:  # only routing raises it: no route serves the path
        detail = no_route_detail(request.method, request.url.path)
        return problem(404, NO_SUCH_ROUTE, detail, title="No such route")
    slug = {405: "method-not-allowed"}.get(err.status_code, "http-error")
    if err.status_code != 405:
        return problem(err.status_code, slug, str(err.detail))
    allow = allowed_methods(request.app, request.scope)  # every method the path takes
    refusal = problem(405, slug, f"{request.method} is not served here; this path takes {allow}")
    refusal.headers["allow"] = allow
    return refusal


async def _invalid_body(_request: Request, err: Exception) -> Response:
    assert isinstance(err, RequestValidationError)
    detail = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in err.errors()
    )
    return problem(400, "invalid-read", detail, title="Invalid read request")


router = APIRouter()


@router.get("/healthz", responses=openapi_doc.HEALTHZ)
async def healthz(request: Request) -> dict[str, object]:
    """The node's liveness, in the shape every node answers (`health_body`)."""
    store = _store(request)
    return health_body(_role(request), store.last_seq())


def health_body(role: str, seq: int) -> dict[str, object]:
    """`GET /healthz` of every node, root and replicas alike: ``{"status", "role", "seq"}``."""
    return {"status": "ok", "role": role, "seq": seq}


@router.get(
    "/metrics",
    response_class=Response,  # the text exposition, declared below (not FastAPI's JSON)
    responses=openapi_doc.METRICS,
)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition (of every reader process with `--read-workers`)."""
    readers: tuple[str, int, int] | None = getattr(request.app.state, "readers", None)
    body = generate_latest() if readers is None else workermetrics.render(*readers)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/status", responses=openapi_doc.STATUS)
async def get_status(request: Request) -> dict[str, object]:
    """`{"db_id", "role", "seq", "hash_head"}` and the node's own facts."""
    store = _store(request)
    seq, head = store.head()
    doc: dict[str, object] = {
        "db_id": store.db_id,
        "role": _role(request),
        "seq": seq,
        "hash_head": head.hex(),
    }
    # How much history a replica of this node can still catch up from, copies left on disk.
    doc.update(setaside.node_facts(store.path, *store.retained()))
    doc.update(request.app.state.status())
    return doc


@router.post(
    "/v1/get_bulk",
    response_class=Response,
    responses=openapi_doc.GET_BULK,
    openapi_extra=openapi_doc.GET_BULK_BODY,
)
async def get_bulk(request: Request) -> Response:
    """Values of up to `MAX_BULK_KEYS` keys, read in one transaction."""
    store = _store(request)
    try:
        raw = await bulkbody.read(request.receive, request.headers.get("content-length"))
    except bulkbody.BodyRefused as err:
        slug = {413: "too-large", 408: "request-timeout", 503: "busy"}.get(
            err.status, "invalid-read"
        )
        title = {413: "Request too large", 408: "Request body timed out", 503: "Node busy"}
        refusal = problem(err.status, slug, err.detail, title=title.get(err.status, slug))
        # The rest of the body (if any) is not wanted: the connection closes after this.
        refusal.headers["connection"] = "close"
        if err.status == 503:
            refusal.headers["retry-after"] = "1"
        return refusal
    t0 = time.perf_counter()
    body = _bulk_body(raw, request.headers.get("content-type"))
    n = len(body.keys) + len(body.keys_b64)
    if n > MAX_BULK_KEYS:
        raise InvalidReadError(f"at most {MAX_BULK_KEYS} keys per get_bulk, got {n}")
    text_keys = [k.encode() for k in body.keys]
    try:
        b64_keys = [base64.b64decode(k, validate=True) for k in body.keys_b64]
    except (binascii.Error, ValueError) as err:
        raise InvalidReadError("keys_b64 holds invalid base64") from err
    for k in (*text_keys, *b64_keys):
        if not 1 <= len(k) <= MAX_KEY:
            raise InvalidReadError(f"keys must be 1 to {MAX_KEY} bytes", key=k)
    keyspaces.check_keys((*text_keys, *b64_keys))  # a filtered replica's: 421 outside
    found: list[Value | None] = []
    size = 0
    with store.reader() as r:
        for k in (*text_keys, *b64_keys):
            v = r.get(k)
            found.append(v)
            if v is not None:
                readstats.note_read(k)
            size += len(v.value) if v is not None else 0
            if size > MAX_BULK_BYTES:
                raise ReadTooLargeError(
                    f"the values of these keys exceed {MAX_BULK_BYTES} bytes",
                    hint="ask for fewer keys per request",
                )
        applied = r.seq()  # the state these values are from, exactly
    values: dict[str, str | None] = {}
    values_b64: dict[str, str | None] = {}
    for name, v in zip(body.keys, found[: len(text_keys)], strict=True):
        if v is None:
            values[name] = None
        else:
            try:
                values[name] = v.value.decode()
            except UnicodeDecodeError:
                values_b64[name] = base64.b64encode(v.value).decode()
    for name, v in zip(body.keys_b64, found[len(text_keys) :], strict=True):
        values_b64[name] = None if v is None else base64.b64encode(v.value).decode()
    doc: dict[str, Any] = {"values": values}
    if values_b64:
        doc["values_b64"] = values_b64
    # The deadlines of the keys that have one, by the name the key was asked under.
    names = (*body.keys, *body.keys_b64)
    expires = {
        n: ttl.rfc3339(v.expires_us)
        for n, v in zip(names, found, strict=True)
        if v is not None and v.expires_us
    }
    if expires:
        doc["expires_at"] = expires
    READ_SECONDS.labels("http_get_bulk").observe(time.perf_counter() - t0)
    return JSONResponse(
        doc, headers={"X-Mercury-Seq": str(applied), "X-Mercury-Applied-Seq": str(applied)}
    )


def _bulk_body(raw: bytes, content_type: str | None) -> GetBulkBody:
    """The decoded get_bulk body; 400 (`invalid-read`) for anything else: not JSON, not
    the model, or more items than `MAX_BULK_KEYS` keys (counted before decoding)."""
    if content_type is not None:
        mime = content_type.partition(";")[0].strip().lower()
        if mime != "application/json" and not (
            mime.startswith("application/") and mime.endswith("+json")
        ):
            raise InvalidReadError(
                f"a get_bulk body is JSON (Content-Type: application/json), not {mime!r}"
            )
    seps = bulkbody.too_many_items(raw)
    if seps is not None:
        raise InvalidReadError(
            f"at most {MAX_BULK_KEYS} keys per get_bulk; this body holds at least {seps} "
            "commas outside its strings"
        )
    try:
        return bulkbody.decode(raw)
    except strictjson.AmbiguousJsonError as err:
        raise InvalidReadError(f"body: {err}") from err
    except ValidationError as err:
        # As FastAPI words a body it cannot validate (the `_invalid_body` handler).
        errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in err.errors()]
        raise RequestValidationError(errors) from err


@router.get(
    "/v1/range",
    response_class=Response,  # its answers depend on the node's role: openapi_doc.finish
    openapi_extra=openapi_doc.RANGE_PARAMS,
)
async def get_range(request: Request) -> Response:
    """One page of a key range (JSON), or the whole range as NDJSON."""
    if _role(request) == "root":
        raise RangeOnRootError(
            "the root does not serve range reads; large reads must never load the root",
            hint="send GET /v1/range to a consumer node or a replica (default :8081)",
        )
    store = _store(request)
    t0 = time.perf_counter()
    q = _raw_query(request.scope["query_string"])
    spec = ranges.make_spec(prefix=q.get("prefix"), start=q.get("start"), end=q.get("end"))
    keyspaces.check_range(spec.start, spec.end)  # a filtered replica's: 421 outside
    # A read token's keyspaces (reads/auth.py, `--read-auth`): scan only inside them.
    spaces: tuple[bytes, ...] | None = request.scope.get(ranges.READ_KEYSPACES)
    keys_only = q.get("keys_only", b"false").lower() in (b"true", b"1", b"yes")
    after = ranges.decode_cursor(spec, q["cursor"].decode("latin-1")) if q.get("cursor") else None
    limit_raw = q.get("limit")
    try:
        limit = int(limit_raw) if limit_raw is not None else None
    except ValueError as err:
        raise InvalidReadError("limit must be an integer") from err
    if NDJSON in request.headers.get("accept", ""):
        # A stream serves the whole range (or `limit` items when given).
        if limit is not None and limit < 1:
            raise InvalidReadError("limit must be at least 1 (omit it to stream every item)")
        return StreamingResponse(
            _stream(store, spec, after, limit, keys_only, spaces), media_type=NDJSON
        )
    limit = ranges.check_limit(limit)
    with store.reader() as r:
        items, more = ranges.read_page(_within(r, spaces), spec, after, limit, keys_only)
        applied = r.seq()  # the state this page is from, exactly
    if not keys_only:
        readstats.note_reads(k for k, _ in items)
    doc = {
        "items": [jsonkv.item(k, v) for k, v in items],
        "next_cursor": ranges.encode_cursor(spec, items[-1][0]) if more else None,
    }
    READ_SECONDS.labels("http_range").observe(time.perf_counter() - t0)
    return JSONResponse(
        doc, headers={"X-Mercury-Seq": str(applied), "X-Mercury-Applied-Seq": str(applied)}
    )


def _within(r: ranges.RangeReader, spaces: tuple[bytes, ...] | None) -> ranges.RangeReader:
    return r if spaces is None else ranges.KeyspaceReader(r, spaces)


def _raw_query(qs: bytes) -> dict[str, bytes]:
    """Query parameters as raw bytes (percent-decoding to bytes, so any key works)."""
    return {
        k: v.encode("latin-1")
        for k, v in parse_qsl(qs.decode("latin-1"), keep_blank_values=True, encoding="latin-1")
    }


async def _stream(
    store: Store,
    spec: ranges.RangeSpec,
    after: bytes | None,
    total: int | None,
    keys_only: bool,
    spaces: tuple[bytes, ...] | None,
) -> AsyncIterator[bytes]:
    """NDJSON lines of the range, STREAM_CHUNK items per read transaction; memory stays flat
    because each chunk is handed to the transport (which applies backpressure) before the
    next is read. A CRC failure ends the stream with an error line (headers are sent)."""
    sent = 0
    while True:
        n = STREAM_CHUNK if total is None else min(STREAM_CHUNK, total - sent)
        if n <= 0:
            return
        t0 = time.perf_counter()
        try:
            with store.reader() as r:
                items, more = ranges.read_page(
                    _within(r, spaces), spec, after, n, keys_only, max_bytes=STREAM_CHUNK_BYTES
                )
        except CRCError as err:
            READ_ERRORS.labels("http_range_stream", "crc").inc()
            yield json.dumps({"error": err.message}).encode() + b"\n"
            return
        if items:
            if not keys_only:
                readstats.note_reads(k for k, _ in items)
            chunk = "".join(json.dumps(jsonkv.item(k, v)) + "\n" for k, v in items).encode()
            READ_SECONDS.labels("http_range_stream").observe(time.perf_counter() - t0)
            yield chunk
            after = items[-1][0]
            sent += len(items)
        if not more:
            return


__all__ = ["MAX_BULK_KEYS", "ReadApp", "create_read_app", "health_body", "problem"]
