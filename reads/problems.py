"""problem+json (RFC 9457) answers of the read API. The error → status table and the body
shape are `core/problems.py` (shared with the gateway); this module only makes them bytes
and responses."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from core.errors import MercuryError
from core.problems import PROBLEM_JSON, error_document, problem_document


def problem_body(status: int, slug: str, detail: str, **extra: Any) -> bytes:
    """The JSON bytes of one problem document (for the raw-ASGI point get)."""
    return orjson.dumps(problem_document(status, detail, slug=slug, **extra), default=str)


def problem(status: int, slug: str, detail: str, **extra: Any) -> Response:
    """A problem+json response."""
    return Response(problem_body(status, slug, detail, **extra), status, media_type=PROBLEM_JSON)


def problem_for(err: MercuryError) -> Response:
    """The problem+json response of a Mercury error (never a stack trace)."""
    status, doc, headers = error_document(err)
    return Response(
        orjson.dumps(doc, default=str), status, headers=headers, media_type=PROBLEM_JSON
    )
