"""The one bounded reader of an ASGI request body, for every HTTP face: the gateway's
routes and fast path (`gateway/http.py`'s `body_reader`) and the read API's get_bulk with
its read-token middleware (`reads/bulkbody.py`).

A body is refused 413 from its Content-Length before a byte of it is read when that
already says it is too large, else as soon as what arrived passes the bound (a chunked
body); a client that stops sending mid-body is answered 408 instead of holding its
connection and buffer for ever; one that leaves mid-body, 400. The refusals are
`core.errors` exceptions (`TooLargeError`, `RequestTimeoutError`, `BadRequestError`): the
gateway answers them through `core/problems.py`'s table, the read API with its own answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from core.errors import BadRequestError, RequestTimeoutError, TooLargeError

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
#: Longest wait for the next piece of a request body: a client that stops sending mid-body
#: is answered 408 instead of holding its connection and buffer for ever.
BODY_IDLE_TIMEOUT_S = 30.0


async def read_body(
    receive: Receive,
    content_length: str | None,
    limit: int,
    what: str,
    idle_timeout_s: float = BODY_IDLE_TIMEOUT_S,
) -> bytes:
    """The request body from ASGI `receive`, refused with 413 as soon as it exceeds `limit`
    bytes (before reading anything when Content-Length already says so); `what` names it
    in the refusals."""
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
