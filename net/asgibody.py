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

from core.errors import BadRequestError, OverloadedError, RequestTimeoutError, TooLargeError

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
#: Longest wait for the next piece of a request body: a client that stops sending mid-body
#: is answered 408 instead of holding its connection and buffer for ever.
BODY_IDLE_TIMEOUT_S = 30.0


class BodyBudget:
    """Request body bytes a process holds at once while they arrive, at most.

    Each body is bounded (`limit` of `read_body`) and each connection's wait for its next
    piece; but a client sending most of a large body on each of many connections and then
    pausing would hold all of them at once. A body takes each piece from the budget as it
    arrives (what it holds, not what its Content-Length announces: a head alone, which
    costs a client nothing to send, takes nothing) and gives it all back when it has been
    read, refused or abandoned; a piece the budget cannot take now refuses its body 503 with
    Retry-After (a Content-Length that could never fit, 413, before anything is read).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int, what: str) -> None:
        """Hold `n` more bytes, or refuse the body (`OverloadedError`, retryable)."""
        if self.held + n > self.limit:
            raise OverloadedError(
                f"this node holds {self.held} bytes of request bodies arriving; {what} "
                f"would pass its bound of {self.limit}",
                hint="retry after a second",
                headers={"Retry-After": "1"},
            )
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n


#: This process's budget (`net.http_bounds` sets its limit from ``--http-max-body-bytes-held``).
BODIES = BodyBudget(1 << 30)


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
    budget = BODIES
    if content_length is not None:
        try:
            n = int(content_length)
        except ValueError as err:
            raise BadRequestError("Content-Length is not a number") from err
        if n > limit:
            raise TooLargeError(f"{what} is {n} bytes; at most {limit} bytes")
        if n > budget.limit:
            raise TooLargeError(
                f"{what} is {n} bytes; this node holds at most {budget.limit} bytes of "
                "request bodies at once"
            )
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    try:
        # One timeout for the whole body, pushed back after every piece (cheaper than
        # one per receive on the hot path, where a body is one piece).
        async with asyncio.timeout(idle_timeout_s) as deadline:
            while True:
                msg = await receive()
                chunk, more = _piece(msg, size, min(limit, budget.limit), what)
                budget.take(len(chunk), what)  # `size` is what this body holds of it
                size += len(chunk)
                chunks.append(chunk)
                if not more:
                    break
                deadline.reschedule(loop.time() + idle_timeout_s)
    except TimeoutError as err:
        raise RequestTimeoutError(
            f"{what}: no data for {idle_timeout_s:g} s after {size} bytes"
        ) from err
    finally:
        budget.give(size)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _piece(msg: MutableMapping[str, Any], size: int, limit: int, what: str) -> tuple[bytes, bool]:
    """One ``http.request`` message's bytes and whether more follow (413 past `limit`)."""
    if msg["type"] != "http.request":
        raise BadRequestError("the client disconnected before sending the whole body")
    chunk: bytes = msg.get("body", b"")
    if size + len(chunk) > limit:
        raise TooLargeError(f"{what} exceeds {limit} bytes")
    return chunk, bool(msg.get("more_body", False))
