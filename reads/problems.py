"""problem+json (RFC 9457) answers of the read API, and the one table mapping read-side
errors to HTTP statuses."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from mercury.errors import (
    CRCError,
    InvalidCursorError,
    InvalidReadError,
    MercuryError,
    RangeOnRootError,
    ReadTooLargeError,
)

PROBLEM_JSON = "application/problem+json"
_BASE = "https://mercury.invalid/problems/"

#: error class -> (HTTP status, problem type slug, title); first match wins (subclasses first).
STATUS_OF: tuple[tuple[type[MercuryError], int, str, str], ...] = (
    (InvalidCursorError, 400, "invalid-cursor", "Invalid range cursor"),
    (InvalidReadError, 400, "invalid-read", "Invalid read request"),
    (ReadTooLargeError, 413, "read-too-large", "Reply too large"),
    (RangeOnRootError, 421, "range-on-root", "Range reads are served by consumer nodes"),
    (CRCError, 500, "corrupt-value", "Stored value failed its CRC"),
)


def problem_body(status: int, slug: str, title: str, detail: str, **extra: Any) -> bytes:
    """The JSON bytes of one problem document."""
    doc: dict[str, Any] = {"type": _BASE + slug, "title": title, "status": status}
    doc["detail"] = detail
    doc.update({k: v for k, v in extra.items() if v is not None})
    return json.dumps(doc).encode()


def problem(status: int, slug: str, title: str, detail: str, **extra: Any) -> Response:
    """A problem+json response."""
    return Response(
        problem_body(status, slug, title, detail, **extra), status, media_type=PROBLEM_JSON
    )


def status_of(err: MercuryError) -> tuple[int, str, str]:
    """(status, type slug, title) of a Mercury error; unknown ones are 500 internal."""
    for cls, status, slug, title in STATUS_OF:
        if isinstance(err, cls):
            return status, slug, title
    return 500, "internal", "Internal error"


def problem_for(err: MercuryError) -> Response:
    """The problem+json response of a Mercury error (never a stack trace)."""
    status, slug, title = status_of(err)
    return problem(status, slug, title, err.message, hint=err.hint)
