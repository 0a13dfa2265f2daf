"""What an HTTP face's OpenAPI document is made of, shared by both faces.

The root's gateway (`gateway/openapi_doc.py`) and the read API of replicas and consumer
nodes (`reads/openapi_doc.py`) declare each route's answers with these: success bodies with
their real content types, and every error status as ``application/problem+json`` pointing
at the one `Problem` schema component, which `finish` adds to the document FastAPI
generates. Each face keeps its own table of when it answers each status (`Face`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from core.problems import PROBLEM_JSON, PROBLEM_TYPE, TITLES

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
        "log_first_seq": {"type": "integer", "description": "410: the oldest retained seq"},
    },
    "additionalProperties": True,
}

#: Retry-After as both faces send it: whole seconds, at least 1.
RETRY_AFTER: Doc = {
    "description": "seconds after which the same request may be admitted",
    "schema": {"type": "integer", "minimum": 1},
}


#: A stored value's version headers, wherever a value is answered (the root, every reader).
VERSION_HEADERS: Doc = {
    "ETag": {
        "description": '`"<version>"`: the seq of the key\'s last change, quoted',
        "required": True,
        "schema": {"type": "string", "pattern": '^"[0-9]+"$'},
    },
    "X-Mercury-Version": {
        "description": "the seq of the key's last change",
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
    },
}


def generated(app: FastAPI) -> Doc:
    """The document FastAPI generates for `app`'s routes (each face then makes it true)."""
    return get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        description=app.description,
        routes=app.routes,
    )


class Face:
    """One HTTP face's error answers: what each status means there (`when`), and the
    headers some statuses carry (`headers`, by status)."""

    def __init__(self, when: Mapping[int, str], headers: Mapping[int, Doc]) -> None:
        self.when = when
        self.headers = headers

    def problem(self, status: int, when: str | None = None) -> Doc:
        """The response object of one error status: problem+json with the shared schema."""
        meaning = when or self.when.get(status, "refused")
        out: Doc = {
            "description": f"{TITLES.get(status, 'Error')}: {meaning}",
            "content": {PROBLEM_JSON: {"schema": PROBLEM_REF}},
        }
        if status in self.headers:
            out["headers"] = self.headers[status]
        return out

    def answers(
        self, ok: Mapping[int, Doc], *errors: int | tuple[int, str]
    ) -> dict[int | str, Doc]:
        """A route's ``responses``: its success answers and its error statuses (an int, or
        ``(status, when)`` to say when this route gives it)."""
        out: dict[int | str, Doc] = {status: r for status, r in ok.items()}
        for e in errors:
            status, when = e if isinstance(e, tuple) else (e, None)
            out[status] = self.problem(status, when)
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


def finish(doc: Doc, every_operation: Mapping[str, Doc]) -> Doc:
    """The generated document made true: the `Problem` component added, FastAPI's default
    422 (HTTPValidationError: neither face sends it, a request FastAPI cannot validate is a
    400 problem) removed with its schemas, and the answers `every_operation` can get
    (those the listener gives before any route, by status) declared on each operation."""
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            for status, answer in every_operation.items():
                responses.setdefault(status, answer)
            r422 = responses.get("422", {})
            schema = r422.get("content", {}).get("application/json", {}).get("schema", {})
            if schema.get("$ref", "").endswith("/HTTPValidationError"):
                del responses["422"]
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Problem"] = PROBLEM_SCHEMA
    return doc
