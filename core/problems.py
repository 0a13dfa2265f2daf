"""Errors to HTTP: the ONE table from Mercury error classes to statuses and problem types.

Both HTTP faces (the gateway and the replica read API) answer a Mercury error with an
``application/problem+json`` document (RFC 9457) whose status, type and title come from
here; each face only formats the body. Rows are tried in order, most specific class first.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from core import errors as e

PROBLEM_TYPE = "https://mercury.invalid/problems/"
#: The media type of every refusal, on both faces.
PROBLEM_JSON = "application/problem+json"

# The kinds of 404, told apart by their problem type so that a client can act on them: a
# missing key is an answer (the SDK returns None), a path no route serves is a mistake (a
# wrong base URL, a missing `/v1`) that must never read as "key absent".
#: A key that is not stored (`GET /v1/kv/{key}` on either face, the read fast path too).
NO_SUCH_KEY = "no-such-key"
#: A path no route serves: the request never reached a key, a producer or any resource.
NO_SUCH_ROUTE = "no-such-route"
#: A named resource that does not exist: a producer, consumer, keyspace, token or file.
NOT_FOUND = "not-found"
#: The full problem type URIs of the three (the ``type`` member a client compares).
NO_SUCH_KEY_TYPE = PROBLEM_TYPE + NO_SUCH_KEY
NO_SUCH_ROUTE_TYPE = PROBLEM_TYPE + NO_SUCH_ROUTE
NOT_FOUND_TYPE = PROBLEM_TYPE + NOT_FOUND

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    412: "Precondition Failed",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    421: "Misdirected Request",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}

#: (error class, status, type slug or None = from the class name, title or None = status's).
TABLE: tuple[tuple[type[e.MercuryError], int, str | None, str | None], ...] = (
    # reads
    (e.InvalidCursorError, 400, "invalid-cursor", "Invalid range cursor"),
    (e.InvalidReadError, 400, "invalid-read", "Invalid read request"),
    (e.ReadTooLargeError, 413, "read-too-large", "Reply too large"),
    (e.RangeOnRootError, 421, "range-on-root", "Range reads are served by consumer nodes"),
    (e.OutsideKeyspaceError, 421, "outside-keyspace", "Not held by this filtered replica"),
    # a stored value failed its CRC: a fault of this node, never retried into success
    (e.CRCError, 500, "corrupt-value", "Stored value failed its CRC"),
    # writes
    (e.WriteGuardError, 400, None, None),
    (e.RequestTimeoutError, 408, None, None),
    (e.BadRequestError, 400, None, None),
    (e.InvalidOpError, 400, None, None),
    (e.AuthError, 401, None, None),
    (e.ForbiddenError, 403, None, None),
    (e.NoSuchKeyError, 404, NO_SUCH_KEY, "No such key"),
    (e.NotFoundError, 404, NOT_FOUND, None),
    (e.KeyspaceOverlapError, 409, None, None),
    (e.PreconditionFailedError, 412, None, None),
    (e.TooLargeError, 413, None, None),
    (e.MisdirectedError, 421, None, None),
    (e.QuotaExceededError, 429, None, None),
    (e.ShuttingDownError, 503, None, None),
    (e.OverloadedError, 503, None, None),
    (e.StorageQuotaError, 507, None, None),
    (e.StoreFullError, 507, None, None),
    (e.AclDocError, 400, None, None),
    (e.StoreError, 503, None, None),
)


def no_route_detail(method: str, path: str) -> str:
    """The detail of a `NO_SUCH_ROUTE` 404: names the path, so a wrong base URL shows."""
    return (
        f"no route serves {method} {path}: check the base URL "
        "(the API is under /v1; /docs lists every path)"
    )


class Problem(NamedTuple):
    """How an error leaves over HTTP."""

    status: int
    slug: str
    title: str


def slug_of(err: e.MercuryError) -> str:
    """Problem type slug from the class name: KeyspaceOverlapError -> keyspace-overlap."""
    name = type(err).__name__.removesuffix("Error")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


def classify(err: e.MercuryError) -> Problem:
    """Status, type slug and title of `err` (500 for a class the table does not know)."""
    for cls, status, slug, title in TABLE:
        if isinstance(err, cls):
            return Problem(status, slug or slug_of(err), title or TITLES.get(status, "Error"))
    return Problem(500, slug_of(err), TITLES[500])


def problem_document(
    status: int, detail: str, *, slug: str | None = None, title: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The one problem+json body shape (RFC 9457) of both HTTP faces:
    ``{"type", "title", "status", "detail", ...extension members}``."""
    doc: dict[str, Any] = {
        "type": PROBLEM_TYPE + (slug or str(status)),
        "title": title or TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    _add_members(doc, extra)
    return doc


def error_document(err: e.MercuryError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, problem body and headers of a Mercury error: its fields become extension
    members, its hint a ``hint`` member; a ``headers`` field travels as HTTP headers."""
    p = classify(err)
    doc = problem_document(p.status, err.message, slug=p.slug, title=p.title)
    _add_members(doc, {k: v for k, v in err.fields.items() if k != "headers"})
    _add_members(doc, {"hint": err.hint})
    return p.status, doc, dict(err.fields.get("headers", {}))


def _add_members(doc: dict[str, Any], extra: dict[str, Any]) -> None:
    """Extension members: None omitted, bytes as text, the four standard members kept."""
    for k, v in extra.items():
        if v is not None and k not in ("type", "title", "status", "detail"):
            doc[k] = v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v
