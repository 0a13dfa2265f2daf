"""Small HTTP helpers shared by the routes and the fast path: the one bounded body reader,
JSON responses, and an `Answer` as a response."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from starlette.responses import Response

from core.errors import BadRequestError, RequestTimeoutError, TooLargeError
from gateway.answers import Answer

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
#: Longest wait for the next piece of a request body: a client that stops sending mid-body
#: is answered 408 instead of holding its connection and buffer for ever.
BODY_IDLE_TIMEOUT_S = 30.0
#: `read(limit, what)`: the request body, 413 beyond `limit` bytes (see `body_reader`).
BodyReader = Callable[[int, str], Awaitable[bytes]]


async def read_body(
    receive: Receive,
    content_length: str | None,
    limit: int,
    what: str,
    idle_timeout_s: float = BODY_IDLE_TIMEOUT_S,
) -> bytes:
    """The request body from ASGI `receive`, refused with 413 as soon as it exceeds `limit`
    bytes (before reading anything when Content-Length already says so).

    The one body reader of the gateway: the FastAPI routes (``request.receive``) and the
    raw-ASGI fast path call it alike, so both refuse the same bodies the same way.
    """
    if content_length is not None:
        try:
            n = int(content_length)
        except ValueError as err:
            raise BadRequestError("Content-Length is not a number") from err
        if n > limit:
            raise TooLargeError(f"{what} is {n} bytes; at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    try:
        # One timeout for the whole body, pushed back after every piece (cheaper than
        # one per receive on the hot path, where a body is one piece).
        async with asyncio.timeout(idle_timeout_s) as deadline:
            while True:
                msg = await receive()
                chunk, more = _piece(msg, size, limit, what)
                size += len(chunk)
                chunks.append(chunk)
                if not more:
                    break
                deadline.reschedule(loop.time() + idle_timeout_s)
    except TimeoutError as err:
        raise RequestTimeoutError(
            f"{what}: no data for {idle_timeout_s:g} s after {size} bytes"
        ) from err
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _piece(msg: MutableMapping[str, Any], size: int, limit: int, what: str) -> tuple[bytes, bool]:
    """One ``http.request`` message's bytes and whether more follow (413 past `limit`)."""
    if msg["type"] != "http.request":
        raise BadRequestError("the client disconnected before sending the whole body")
    chunk: bytes = msg.get("body", b"")
    if size + len(chunk) > limit:
        raise TooLargeError(f"{what} exceeds {limit} bytes")
    return chunk, bool(msg.get("more_body", False))


def body_reader(receive: Receive, content_length: str | None) -> BodyReader:
    """A `BodyReader` over one request's `receive` (what the kv handlers are given)."""

    async def read(limit: int, what: str) -> bytes:
        return await read_body(receive, content_length, limit, what)

    return read


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response serialised with orjson."""
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def answer_response(a: Answer) -> Response:
    """An `Answer` of the write path as a response (problem+json for errors)."""
    media = "application/problem+json" if a.status >= 400 else "application/json"
    return Response(orjson.dumps(a.body), status_code=a.status, headers=a.headers, media_type=media)
