"""problem+json bodies of the gateway; the error → status table is `core/problems.py`.

Every refusal leaves the gateway as ``application/problem+json`` (RFC 9457) with a precise
`detail`; anything unexpected becomes a 500 problem without a stack trace (and a log line).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from core import errors as e
from core.problems import PROBLEM_TYPE, TITLES, classify


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
    p = classify(err)
    return problem(p.status, err.message, kind=p.slug, headers=headers, **extra)
