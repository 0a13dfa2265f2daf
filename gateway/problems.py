"""problem+json responses of the gateway. The error → status table and the body shape are
`core/problems.py` (shared with the read API); this module only makes them responses.

Every refusal leaves the gateway as ``application/problem+json`` (RFC 9457) with a precise
`detail`; anything unexpected becomes a 500 problem without a stack trace (and a log line).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from core import errors as e
from core.problems import PROBLEM_JSON, error_document, problem_document


def problem(
    status: int,
    detail: str,
    *,
    slug: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    """A problem+json response."""
    return _response(status, problem_document(status, detail, slug=slug, **extra), headers)


def from_error(err: e.MercuryError) -> Response:
    """The problem+json response for a Mercury error (fields become extension members)."""
    status, doc, headers = error_document(err)
    return _response(status, doc, headers)


def _response(status: int, doc: dict[str, Any], headers: dict[str, str] | None) -> Response:
    return Response(
        orjson.dumps(doc, default=str),
        status_code=status,
        headers=headers,
        media_type=PROBLEM_JSON,
    )
