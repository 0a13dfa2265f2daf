"""Small HTTP helpers shared by the routes: bounded body reads, JSON responses."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from core.errors import BadRequestError, TooLargeError
from gateway.answers import Answer


async def read_body(request: Request, limit: int, what: str) -> bytes:
    """The request body, refused with 413 as soon as it exceeds `limit` bytes (before
    reading anything when Content-Length already says so)."""
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError as err:
            raise BadRequestError("Content-Length is not a number") from err
        if n > limit:
            raise TooLargeError(f"{what} is {n} bytes; at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLargeError(f"{what} exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response serialised with orjson."""
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def answer_response(a: Answer) -> Response:
    """An `Answer` of the write path as a response (problem+json for errors)."""
    media = "application/problem+json" if a.status >= 400 else "application/json"
    return Response(orjson.dumps(a.body), status_code=a.status, headers=a.headers, media_type=media)
