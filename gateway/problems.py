"""Errors to HTTP: the ONE table from error class to status, and problem+json bodies.

Every refusal leaves the gateway as ``application/problem+json`` (RFC 9457) with a precise
`detail`; anything unexpected becomes a 500 problem without a stack trace (and a log line).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from mercury import errors as e

PROBLEM_TYPE = "https://mercury.invalid/problems/"

#: Most specific class first: the first match wins.
STATUS_TABLE: tuple[tuple[type[e.MercuryError], int], ...] = (
    (e.WriteGuardError, 400),
    (e.BadRequestError, 400),
    (e.InvalidOpError, 400),
    (e.AuthError, 401),
    (e.ForbiddenError, 403),
    (e.NotFoundError, 404),
    (e.KeyspaceOverlapError, 409),
    (e.PreconditionFailedError, 412),
    (e.TooLargeError, 413),
    (e.MisdirectedError, 421),
    (e.QuotaExceededError, 429),
    (e.ShuttingDownError, 503),
    (e.StorageQuotaError, 507),
    (e.StoreFullError, 507),
    (e.AclDocError, 400),
    (e.StoreError, 503),
)

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    412: "Precondition Failed",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    421: "Misdirected Request",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}


def status_of(err: e.MercuryError) -> int:
    """HTTP status of a Mercury error (500 for one the table does not know)."""
    for cls, status in STATUS_TABLE:
        if isinstance(err, cls):
            return status
    return 500


def _slug(err: e.MercuryError) -> str:
    name = type(err).__name__.removesuffix("Error")
    return "".join("-" + c.lower() if c.isupper() else c for c in name).lstrip("-")


def problem(
    status: int,
    detail: str,
    *,
    kind: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    """A problem+json response."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + (kind or str(status)),
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    body.update({k: v for k, v in extra.items() if v is not None})
    return Response(
        orjson.dumps(body, default=str),
        status_code=status,
        headers=headers,
        media_type="application/problem+json",
    )


def from_error(err: e.MercuryError, headers: dict[str, str] | None = None) -> Response:
    """The problem+json response for a Mercury error (fields become extension members)."""
    extra: dict[str, Any] = {}
    headers = {**(headers or {}), **err.fields.get("headers", {})}
    for k, v in err.fields.items():
        if k == "headers":
            continue
        extra[k] = v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v
    if err.hint:
        extra["hint"] = err.hint
    return problem(status_of(err), err.message, kind=_slug(err), headers=headers, **extra)
