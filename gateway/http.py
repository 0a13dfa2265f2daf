"""Small HTTP helpers shared by the routes and the fast path: a request's body reader (over
the one bounded body reader, `net/asgibody.py`: the FastAPI routes and the raw-ASGI fast
path refuse the same bodies the same way), JSON responses, and an `Answer` as a response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from starlette.responses import Response

from acl.principals import bearer_token
from gateway.answers import Answer
from net.asgibody import Receive, read_body
from net.budget import token_principal
from net.http_bounds import authenticated

#: `read(limit, what)`: the request body, 413 beyond `limit` bytes (see `body_reader`).
BodyReader = Callable[[int, str], Awaitable[bytes]]


def body_reader(
    receive: Receive, content_length: str | None, scope: MutableMapping[str, Any] | None = None
) -> BodyReader:
    """A `BodyReader` over one request's `receive` (what the kv handlers are given): the
    FastAPI routes (``request.receive``) and the raw-ASGI fast path both read bodies here.

    With `scope`, its connection holds its slot for the request's bearer token from the
    first read on (`net.http_bounds.authenticated`): a kv handler reads only after it has
    authenticated the token, so the listener's per-principal share and its eviction order
    (unauthenticated first) count a body arriving as that producer's, not an anonymous
    peer's."""

    async def read(limit: int, what: str) -> bytes:
        if scope is not None:
            _tag(scope)
        return await read_body(receive, content_length, limit, what)

    return read


def _tag(scope: MutableMapping[str, Any]) -> None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            token = bearer_token(bytes(value))
            if token:
                authenticated(scope, token_principal(token))
            return


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response serialised with orjson."""
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def answer_response(a: Answer) -> Response:
    """An `Answer` of the write path as a response (problem+json for errors)."""
    media = "application/problem+json" if a.status >= 400 else "application/json"
    return Response(orjson.dumps(a.body), status_code=a.status, headers=a.headers, media_type=media)
