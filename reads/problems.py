"""problem+json (RFC 9457) answers of the read API; the error → status table is
`core/problems.py`."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from core.errors import MercuryError
from core.problems import PROBLEM_TYPE, classify

PROBLEM_JSON = "application/problem+json"


def problem_body(status: int, slug: str, title: str, detail: str, **extra: Any) -> bytes:
    """The JSON bytes of one problem document."""
    doc: dict[str, Any] = {"type": PROBLEM_TYPE + slug, "title": title, "status": status}
    doc["detail"] = detail
    doc.update({k: v for k, v in extra.items() if v is not None})
    return json.dumps(doc).encode()


def problem(status: int, slug: str, title: str, detail: str, **extra: Any) -> Response:
    """A problem+json response."""
    return Response(
        problem_body(status, slug, title, detail, **extra), status, media_type=PROBLEM_JSON
    )


def problem_for(err: MercuryError) -> Response:
    """The problem+json response of a Mercury error (never a stack trace)."""
    status, slug, title = classify(err)
    return problem(status, slug, title, err.message, hint=err.hint)
