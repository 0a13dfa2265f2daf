"""Usage over time: `GET /v1/usage/series` (JSON), unused keys (`GET /v1/usage/unused`,
`GET /v1/usage/unused/summary`) and the page `GET /usage` with its
static files (`gateway/static/`: the page, its script and the vendored uPlot chart
library, served by the root itself — nodes have no internet).

The page holds no data and no token: it asks for the token in a form, keeps it in the
tab's `sessionStorage` and sends it only as an ``Authorization`` header from `fetch`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import math
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import FileResponse, Response

from core.errors import BadRequestError, ForbiddenError, NotFoundError
from gateway import openapi_doc as doc
from gateway import usage_reads
from gateway.auth import ADMIN
from gateway.http import json_response
from gateway.usage_series import parse_range, query
from gateway.writes import Gateway

router = APIRouter()

STATIC = Path(__file__).parent / "static"
#: Files the page may load, with their media types (nothing else is served).
_FILES = {
    "usage.js": "text/javascript; charset=utf-8",
    "usage.css": "text/css; charset=utf-8",
    "vendor/uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "vendor/uPlot.min.css": "text/css; charset=utf-8",
    "vendor/LICENSE": "text/plain; charset=utf-8",
}
#: The page needs nothing from elsewhere; a strict policy keeps it that way.
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gw
    return gw


_PRODUCER_Q = doc.query(
    "producer",
    {"type": "string"},
    "the producer (default: the token's own; the admin may name any, or omit it)",
)
_KEYSPACE_Q = doc.query("keyspace", {"type": "string"}, "one keyspace of the producer")
_DAYS_Q = doc.query(
    "days",
    {"type": "number", "exclusiveMinimum": 0, "maximum": usage_reads.KEEP_DAYS},
    "the window in days (default 30, fractions allowed)",
)
_USAGE_ERRORS: tuple[int | tuple[int, str], ...] = (
    (400, "a malformed query parameter (the detail names it)"),
    401,
    (403, "neither the admin nor that producer"),
    (404, "no such producer (or keyspace), or unused-key analytics are off"),
)


@router.get(
    "/v1/usage/series",
    tags=["producer"],
    summary="Usage over time of a producer (or all)",
    responses=doc.answers(
        {200: doc.json_body("the points of the range", {"type": "object"})}, *_USAGE_ERRORS
    ),
    openapi_extra={
        "parameters": [
            _PRODUCER_Q,
            _KEYSPACE_Q,
            doc.query(
                "since",
                {"type": "string"},
                "RFC 3339 with a zone, or relative (`-24h`, `-30m`, `-7d`, `now`); "
                "default 24 h ago",
            ),
            doc.query("until", {"type": "string"}, "as `since`; default now"),
            doc.query(
                "step",
                {"type": "string", "enum": ["1m", "1h", "1d"]},
                "default: the finest giving at most 5,000 points",
            ),
        ]
    },
)
async def usage_series(request: Request) -> Response:
    """`?producer=&keyspace=&since=&until=&step=` -> `{"producer", "keyspace", "step",
    "since", "until", "max_bytes_stored", "start": {"keys", "bytes"}, "points": [{"t",
    "writes", "bytes_written", "deletes", "duplicates", "held", "refused", "refused_429",
    "refused_413", "expiries", "keys", "bytes"}]}`; `start` is the state the range began with (at
    minute resolution, whatever the step).

    since/until are RFC 3339 or relative (``-24h``, ``-7d``); step is ``1m``, ``1h`` or
    ``1d`` (default: the finest giving at most 5,000 points). A producer's token reads only
    its own series (403 otherwise); the admin reads any, or with no `producer` the sum of
    every producer (keys/bytes summed too)."""
    gw = _gw(request)
    who = gw.authenticate(request.headers.get("authorization"))
    q = request.query_params
    producer = q.get("producer") or (None if who == ADMIN else who)
    if who not in (ADMIN, producer):
        raise ForbiddenError(f"only the admin or producer {producer!r} may read its usage")
    series = gw.series
    try:
        now = series.clock()
        rng = parse_range(q.get("since"), q.get("until"), q.get("step"), now)
    except ValueError as err:
        raise BadRequestError(str(err)) from None
    keyspace = q.get("keyspace")
    usage = gw.usage
    if producer is not None:
        if producer not in usage and producer not in gw.acl.producers:
            raise NotFoundError(f"no producer {producer!r}")
        names = [producer]
    else:
        names = sorted(n for n in set(usage) | set(gw.acl.producers) if n)

    start: dict[str, int | None] = {"keys": None, "bytes": None}

    def run() -> list[dict[str, int | None]]:
        total: list[dict[str, int | None]] = []
        for n in names:
            u = usage.get(n)
            first: dict[str, int | None] = {}
            now_usage = None if u is None else (u.keys, u.bytes)
            pts = query(series, n, keyspace, rng, now_usage, first, now)
            for k, v in first.items():
                a = start[k]
                start[k] = None if a is None and v is None else (a or 0) + (v or 0)
            if not total:
                total = pts
                continue
            for acc, p in zip(total, pts, strict=True):
                for k, v in p.items():
                    if k == "t":
                        continue
                    a = acc[k]
                    acc[k] = None if a is None and v is None else (a or 0) + (v or 0)
        return total

    # Many documents to decode for the admin's sum: off the event loop.
    points = await asyncio.to_thread(run) if len(names) > 4 else run()
    p = gw.acl.producers.get(producer or "")
    cap = p.quota.max_bytes_stored if p is not None else None
    step_name = {60: "1m", 3600: "1h", 86400: "1d"}[rng.step]
    return json_response(
        {
            "producer": producer,
            "keyspace": keyspace,
            "step": step_name,
            "since": rng.since,
            "until": rng.until,
            "max_bytes_stored": cap,
            "start": start,
            "points": points,
        }
    )


#: Seconds a summary of unused keys is answered again without a new scan.
SUMMARY_TTL_S = 60.0


def _ledger(request: Request) -> usage_reads.ReadLedger:
    ledger: usage_reads.ReadLedger | None = getattr(request.app.state, "read_ledger", None)
    if ledger is None:
        raise NotFoundError("unused-key analytics are not enabled on this node")
    return ledger


def _days(raw: str | None) -> float:
    try:
        days = float(raw) if raw is not None else 30.0
    except ValueError:
        raise BadRequestError("days must be a number (fractions allowed)") from None
    if not (math.isfinite(days) and 0 < days <= usage_reads.KEEP_DAYS):
        raise BadRequestError(f"days must be more than 0 and at most {usage_reads.KEEP_DAYS}")
    return days


def _window_doc(ledger: usage_reads.ReadLedger, w: usage_reads.Window) -> dict[str, Any]:
    return {
        "days": w.days,
        "cutoff": w.cutoff,
        "tracked_since": ledger.meta.since,
        "complete": w.complete,
    }


@router.get(
    "/v1/usage/unused",
    tags=["producer"],
    summary="A producer's keys nobody reads",
    responses=doc.answers(
        {200: doc.json_body("one page of unused keys", {"type": "object"})}, *_USAGE_ERRORS
    ),
    openapi_extra={
        "parameters": [
            _PRODUCER_Q,
            _KEYSPACE_Q,
            _DAYS_Q,
            doc.query(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": 10_000},
                "keys per page (default 1,000)",
            ),
            doc.query("cursor", {"type": "string"}, "the previous page's `next_cursor`"),
        ]
    },
)
async def usage_unused(request: Request) -> Response:
    """`?producer=&keyspace=&days=&limit=&cursor=` -> `{"producer", "keyspace", "days",
    "cutoff", "tracked_since", "complete", "keys": [{"key" | "key_b64", "bytes",
    "version"}], "bytes", "scanned", "next_cursor"}`: the producer's keys (in one keyspace,
    or all of its keyspaces) that no node read on any day overlapping the last `days` days
    (default 30, fractions allowed) and that were written before that window, in key order,
    `limit` per page (default 1,000, at most 10,000); `bytes` is what the page's keys hold.
    `complete` is false when the window starts before tracking began or some node dropped
    reads on one of its days (a listed key may then have been read). A producer's token
    reads only itself; the admin names any producer."""
    gw = _gw(request)
    who = gw.authenticate(request.headers.get("authorization"))
    q = request.query_params
    producer = q.get("producer") or (None if who == ADMIN else who)
    if producer is None:
        raise BadRequestError("name the producer: ?producer=NAME")
    if who not in (ADMIN, producer):
        raise ForbiddenError(f"only the admin or producer {producer!r} may read its unused keys")
    p = gw.acl.producers.get(producer)
    if p is None:
        raise NotFoundError(f"no producer {producer!r}")
    keyspace = q.get("keyspace")
    if keyspace is not None and keyspace not in p.keyspaces:
        raise NotFoundError(f"producer {producer!r} has no keyspace {keyspace!r}")
    prefixes = [keyspace.encode()] if keyspace is not None else list(p.prefixes())
    try:
        limit = int(q.get("limit", "1000"))
    except ValueError:
        raise BadRequestError("limit must be an integer") from None
    if not 1 <= limit <= 10_000:
        raise BadRequestError("limit must be 1 to 10000")
    after = None
    if q.get("cursor"):
        try:
            after = base64.urlsafe_b64decode(q["cursor"].encode())
        except (binascii.Error, ValueError):
            raise BadRequestError("cursor is not one this endpoint returned") from None
    ledger = _ledger(request)
    days = _days(q.get("days"))

    def run() -> dict[str, Any]:
        w = usage_reads.window(ledger, days)
        page = usage_reads.unused_page(ledger, prefixes, w, after=after, limit=limit)
        nxt = page.pop("next")
        return {
            "producer": producer,
            "keyspace": keyspace,
            **_window_doc(ledger, w),
            **page,
            "next_cursor": None if nxt is None else base64.urlsafe_b64encode(nxt).decode(),
        }

    return json_response(await asyncio.to_thread(run))


@router.get(
    "/v1/usage/unused/summary",
    tags=["producer"],
    summary="Unused keys and bytes per keyspace",
    responses=doc.answers(
        {200: doc.json_body("unused keys and bytes per keyspace", {"type": "object"})},
        *_USAGE_ERRORS,
    ),
    openapi_extra={"parameters": [_DAYS_Q, _PRODUCER_Q]},
)
async def usage_unused_summary(request: Request) -> Response:
    """`?days=&producer=` -> `{"days", "cutoff", "tracked_since", "complete", "truncated",
    "rows": [{"producer", "keyspace", "keys", "unused_keys", "unused_bytes", "too_new"}]}`
    sorted by unused bytes (most first); `too_new` counts keys written within the window.
    The admin sees every producer (or the one named), a producer itself."""
    gw = _gw(request)
    who = gw.authenticate(request.headers.get("authorization"))
    q = request.query_params
    producer = q.get("producer") or (None if who == ADMIN else who)
    if who not in (ADMIN, producer):
        raise ForbiddenError(f"only the admin or producer {producer!r} may read its unused keys")
    producers = gw.acl.producers
    if producer is not None and producer not in producers:
        raise NotFoundError(f"no producer {producer!r}")
    names = [producer] if producer is not None else sorted(producers)
    ledger = _ledger(request)
    days = _days(q.get("days"))
    # A summary scans every key of the producers named, in a thread that still holds the
    # GIL the commit thread needs: the same question within a minute gets the same answer.
    cache: dict[tuple[Any, ...], tuple[float, dict[str, Any]]] | None = getattr(
        request.app.state, "unused_summaries", None
    )
    if cache is None:
        cache = request.app.state.unused_summaries = {}
    ck = (tuple(names), days, tuple((n, producers[n].keyspaces) for n in names))
    hit = cache.get(ck)
    if hit is not None and time.monotonic() - hit[0] < SUMMARY_TTL_S:
        return json_response(hit[1])

    def run() -> dict[str, Any]:
        w = usage_reads.window(ledger, days)
        owner = {ks.encode(): (n, ks) for n in names for ks in producers[n].keyspaces}
        got = usage_reads.unused_totals(ledger, list(owner), w)
        rows = [
            {"producer": owner[p][0], "keyspace": owner[p][1], **row}
            for p, row in got["rows"].items()
        ]
        rows.sort(key=lambda r: (-r["unused_bytes"], r["producer"], r["keyspace"]))
        return {**_window_doc(ledger, w), "truncated": got["truncated"], "rows": rows}

    doc = await asyncio.to_thread(run)
    for k in [k for k, (t, _) in cache.items() if time.monotonic() - t >= SUMMARY_TTL_S]:
        del cache[k]
    cache[ck] = (time.monotonic(), doc)
    return json_response(doc)


@router.get(
    "/usage",
    tags=["info"],
    summary="The usage page (plots over time)",
    response_class=Response,  # HTML, declared below (not FastAPI's JSON)
    responses={200: doc.body("text/html", "the page", {"type": "string"})},
)
async def usage_page() -> Response:
    """The HTML page; it fetches `/v1/usage` and `/v1/usage/series` with the token the
    user enters."""
    return FileResponse(
        STATIC / "usage.html",
        media_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-cache"},
    )


@router.get(
    "/usage/static/{path:path}",
    tags=["info"],
    summary="The usage page's files",
    response_class=Response,  # the file's own type, declared below (not FastAPI's JSON)
    responses=doc.answers(
        {
            200: {
                "description": "the file",
                "content": {
                    m.split(";", 1)[0]: {"schema": {"type": "string"}}
                    for m in sorted(set(_FILES.values()))
                },
            }
        },
        (404, "not one of the page's files"),
    ),
)
async def usage_static(path: str) -> Response:
    """One of the page's own files (a fixed list; anything else is 404)."""
    media = _FILES.get(path)
    if media is None:
        raise NotFoundError(f"no file {path!r}")
    return FileResponse(STATIC / path, media_type=media, headers={"Cache-Control": "no-cache"})
