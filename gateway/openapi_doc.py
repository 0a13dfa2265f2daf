"""What the root's OpenAPI document (`GET /openapi.json`) declares each route answers.

The routes name their statuses with `answers` (success bodies with their real content
types, every error status the route can give); the building blocks, the one `Problem`
schema component and `finish` (which makes FastAPI's generated document true) are
`core/openapi.py`'s, shared with the read API. The gateway never sends FastAPI's default
``422 HTTPValidationError`` (a request that fails FastAPI's validation is answered 400 by
`gateway/app.py`, and no route's typed parameters can fail it). The statuses themselves
come from `core/problems.py`'s table; when each is answered is docs/api.md's.
"""

from __future__ import annotations

from core import openapi
from core.openapi import RETRY_AFTER, Doc, body, header, json_body, query

__all__ = [
    "RETRY_AFTER",
    "WRITE_HEADERS",
    "answers",
    "body",
    "finish",
    "header",
    "json_body",
    "problem",
    "query",
]

#: Generic meaning of each error status on the gateway (docs/api.md says precisely when).
_WHEN: dict[int, str] = {
    400: "malformed request (the detail names what)",
    401: "no bearer token, or an unknown, expired or revoked one",
    403: "the token may not do this",
    404: "no such resource",
    408: "the request body stopped arriving",
    409: "conflicts with the current state",
    412: "a precondition failed",
    413: "the request is larger than allowed",
    421: "not served by the root",
    422: "well-formed but refused",
    428: "a required precondition header is missing",
    429: "over the producer's write quota",
    431: "the request head (request line and headers) is over the node's "
    "--http-max-header-bytes; answered before routing, then the connection closes",
    500: "a fault of this node",
    503: "shutting down, overloaded, or the store failed",
    507: "the producer's storage cap or the store is full",
}

_RATE_HEADERS: Doc = {
    "RateLimit-Policy": {
        "description": 'the producer\'s quotas (IETF draft syntax: `"ops";q=N;w=S`, N per '
        "S seconds: the burst over the bucket's depth, so N/S is the rate)",
        "schema": {"type": "string"},
    },
    "RateLimit": {
        "description": "per quota: tokens left (`r`) and seconds until full or admitted (`t`)",
        "schema": {"type": "string"},
    },
}
#: Headers only a 429 / 503 carries; 429 always says when to retry, a 503 not always.
_ERROR_HEADERS: dict[int, Doc] = {
    429: {"Retry-After": {**RETRY_AFTER, "required": True}, **_RATE_HEADERS},
    503: {"Retry-After": RETRY_AFTER},
}

#: Headers of a write's answer: the quota's state when it held the request, and the
#: replay marker of an Idempotency-Key.
WRITE_HEADERS: Doc = {
    **_RATE_HEADERS,
    "Idempotent-Replayed": {
        "description": "`true`: the stored answer of an earlier request with this key",
        "schema": {"type": "string", "enum": ["true"]},
    },
}


_FACE = openapi.Face(_WHEN, _ERROR_HEADERS)
#: The response object of one error status (`core.openapi.Face.problem`).
problem = _FACE.problem
#: A route's ``responses`` (`core.openapi.Face.answers`).
answers = _FACE.answers


def finish(doc: Doc) -> Doc:
    """The generated document made true (`core.openapi.finish`), with the 431 every
    operation can get: the listener answers an oversized head before any route."""
    return openapi.finish(doc, {"431": problem(431)})
