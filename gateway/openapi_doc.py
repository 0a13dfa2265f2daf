"""What the root's OpenAPI document (`GET /openapi.json`) declares each route answers.

The routes name their statuses with `answers` (success bodies with their real content
types, every error status the route can give); errors are ``application/problem+json``
and all point at the one `Problem` schema component, which `finish` adds to the document
FastAPI generates. `finish` also drops FastAPI's default ``422 HTTPValidationError``: the
gateway never sends it (a request that fails FastAPI's validation is answered 400 by
`gateway/app.py`, and no route's typed parameters can fail it). The statuses themselves
come from `core/problems.py`'s table; when each is answered is docs/api.md's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from core.problems import PROBLEM_TYPE, TITLES
from gateway.problems import PROBLEM_JSON

Doc = dict[str, Any]

PROBLEM_REF: Doc = {"$ref": "#/components/schemas/Problem"}

#: The one problem+json body shape (`core.problems.problem_document`): the four RFC 9457
#: members, and the extension members whose type is fixed wherever they appear.
PROBLEM_SCHEMA: Doc = {
    "type": "object",
    "description": "RFC 9457 problem details; extension members name what was wrong.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "pattern": "^" + re.escape(PROBLEM_TYPE)},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "hint": {"type": "string", "description": "what to do about it"},
        "producer": {"type": "string"},
        "key": {"type": "string", "description": "the key concerned (bytes as text)"},
        "keyspaces": {"type": "array", "items": {"type": "string"}},
        "current_seq": {"type": "integer", "description": "412: the key's current version"},
        "current_version": {"type": "integer", "description": "412: the ACL's version"},
        "retry_after": {"type": "integer", "description": "429: seconds, as Retry-After"},
        "max_ops": {"type": "integer", "description": "413: most ops the quota admits"},
        "max_bytes": {"type": "integer", "description": "413: most bytes the quota admits"},
        "consumer_nodes": {"type": "array", "items": {"type": "string"}},
        "errors": {"type": "array", "description": "422: every problem of an ACL document"},
    },
    "additionalProperties": True,
}

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

#: Retry-After as the gateway sends it: whole seconds, at least 1.
RETRY_AFTER: Doc = {
    "description": "seconds after which the same request may be admitted",
    "schema": {"type": "integer", "minimum": 1},
}
_RATE_HEADERS: Doc = {
    "RateLimit-Policy": {
        "description": 'the producer\'s quotas (IETF draft syntax: `"ops";q=N;w=1`)',
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


def problem(status: int, when: str | None = None) -> Doc:
    """The response object of one error status: problem+json with the shared schema."""
    out: Doc = {
        "description": f"{TITLES.get(status, 'Error')}: {when or _WHEN.get(status, 'refused')}",
        "content": {PROBLEM_JSON: {"schema": PROBLEM_REF}},
    }
    if status in _ERROR_HEADERS:
        out["headers"] = _ERROR_HEADERS[status]
    return out


def body(
    media: str, description: str, schema: Doc | None = None, headers: Doc | None = None
) -> Doc:
    """A success (or non-problem) response of one content type."""
    out: Doc = {"description": description, "content": {media: {"schema": schema or {}}}}
    if headers:
        out["headers"] = headers
    return out


def json_body(description: str, schema: Doc | None = None, headers: Doc | None = None) -> Doc:
    """An ``application/json`` response."""
    return body("application/json", description, schema, headers)


def answers(ok: Mapping[int, Doc], *errors: int | tuple[int, str]) -> dict[int | str, Doc]:
    """A route's ``responses``: its success answers and its error statuses (an int, or
    ``(status, when)`` to say when this route gives it)."""
    out: dict[int | str, Doc] = {status: r for status, r in ok.items()}
    for e in errors:
        status, when = e if isinstance(e, tuple) else (e, None)
        out[status] = problem(status, when)
    return out


def query(name: str, schema: Doc, description: str, *, required: bool = False) -> Doc:
    """A query parameter as the handler reads it (declared only: FastAPI parses nothing)."""
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": schema,
        "description": description,
    }


def header(
    name: str, description: str, *, required: bool = False, schema: Doc | None = None
) -> Doc:
    """A request header parameter (declared only, as `query`)."""
    return {
        "name": name,
        "in": "header",
        "required": required,
        "schema": schema or {"type": "string"},
        "description": description,
    }


def finish(doc: Doc) -> Doc:
    """The generated document made true: the `Problem` component added, FastAPI's
    default 422 (HTTPValidationError, never sent) removed with its schemas, and the 431
    every operation can get (the listener answers it before any route) declared."""
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.setdefault("431", problem(431))
            r422 = responses.get("422", {})
            schema = r422.get("content", {}).get("application/json", {}).get("schema", {})
            if schema.get("$ref", "").endswith("/HTTPValidationError"):
                del responses["422"]
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Problem"] = PROBLEM_SCHEMA
    return doc
