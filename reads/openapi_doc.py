"""What the read API's OpenAPI document (`GET /openapi.json` of a replica, a consumer node,
`python -m mercury.readserve`) declares each route answers.

Built like the root's (`core/openapi.py`): success bodies with their real content types
and headers, every error status as problem+json with the shared `Problem` schema. Two
things FastAPI cannot see are added by `finish`: the point get (`GET|HEAD /v1/kv/{key}`),
answered by raw ASGI and the protocol fast path before any route, and, on a node started
with `--read-auth`, the bearer scheme with the 401 and 403 its middleware answers in front
of the key reads. `GET /v1/watch` is not in it: an endless stream is no request a
schema-driven client or fuzzer can complete (docs/api.md describes it). When each status is
answered is docs/api.md's.
"""

from __future__ import annotations

from typing import Any

from core import openapi
from core.openapi import RETRY_AFTER, VERSION_HEADERS, Doc, body, header, json_body, query
from reads import bulkbody
from store import setaside
from store.format import MAX_KEY

NDJSON = "application/x-ndjson"

#: Generic meaning of each error status on the read API.
_WHEN: dict[int, str] = {
    400: "malformed read (the detail names what)",
    401: "`--read-auth`: no bearer token, or an unknown one",
    403: "`--read-auth`: outside the token's keyspaces",
    404: "no such key",
    405: "this node is read-only: write through the root",
    408: "the request body stopped arriving",
    413: "the request or its answer is larger than allowed",
    421: "not served by the root",
    431: "the request head (request line and headers) is over the node's "
    "--http-max-header-bytes; answered before routing, then the connection closes",
    500: "a stored value failed its CRC (never retried into success)",
    503: "the bodies arriving at once would pass --http-max-body-bytes-held",
}
METRICS: dict[int | str, Doc] = {
    200: body("text/plain", "Prometheus text exposition", {"type": "string"})
}
_FACE = openapi.Face(_WHEN, {503: {"Retry-After": {**RETRY_AFTER, "required": True}}})
answers = _FACE.answers

_SEQ_HEADERS: Doc = {
    "X-Mercury-Applied-Seq": {
        "description": "the node's applied seq: the answer is this state, exactly",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    },
    "X-Mercury-Seq": {
        "description": "alias of X-Mercury-Applied-Seq",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    },
}

_STRING_OR_NULL: Doc = {"anyOf": [{"type": "string"}, {"type": "null"}]}
_BULK_ANSWER: Doc = {
    "type": "object",
    "required": ["values"],
    "properties": {
        "values": {"type": "object", "additionalProperties": _STRING_OR_NULL},
        "values_b64": {
            "type": "object",
            "description": "values that are not UTF-8, and those of keys asked as keys_b64",
            "additionalProperties": _STRING_OR_NULL,
        },
    },
    "additionalProperties": False,
}
_ITEM: Doc = {
    "type": "object",
    "description": "`key` or `key_b64`; `value` or `value_b64` (absent with keys_only)",
    "properties": {
        "key": {"type": "string"},
        "key_b64": {"type": "string"},
        "value": {"type": "string"},
        "value_b64": {"type": "string"},
    },
    "additionalProperties": False,
}
_PAGE: Doc = {
    "type": "object",
    "required": ["items", "next_cursor"],
    "properties": {
        "items": {"type": "array", "items": _ITEM},
        "next_cursor": _STRING_OR_NULL,
    },
    "additionalProperties": False,
}
_HEALTH: Doc = {
    "type": "object",
    "required": ["status", "role", "seq"],
    "properties": {
        "status": {"type": "string", "enum": ["ok"]},
        "role": {"type": "string"},
        "seq": {"type": "integer", "minimum": 0},
    },
}
_STATUS: Doc = {
    "type": "object",
    "required": ["db_id", "role", "seq", "hash_head", *setaside.NODE_FACTS_SCHEMA],
    "properties": {
        "db_id": {"type": "string"},
        "role": {"type": "string"},
        "seq": {"type": "integer", "minimum": 0},
        "hash_head": {"type": "string", "pattern": "^[0-9a-f]*$"},
        "source": _STRING_OR_NULL,
        "lag_seconds": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "replication_state": {"type": "string"},
        **setaside.NODE_FACTS_SCHEMA,
    },
}

HEALTHZ: dict[int | str, Doc] = {
    200: json_body('`{"status": "ok", "role", "seq"}` (every node\'s shape)', _HEALTH)
}
STATUS: dict[int | str, Doc] = {
    200: json_body('`{"db_id", "role", "seq", "hash_head"}` and the node\'s facts', _STATUS)
}
GET_BULK = answers(
    {200: json_body("the values, null for absent keys", _BULK_ANSWER, _SEQ_HEADERS)},
    (400, "not a JSON get_bulk body, more than 10,000 keys, a key not 1 to 500 bytes"),
    (408, "the body stopped arriving for 30 s"),
    (413, "a body over what 10,000 keys need, or values over 64 MiB"),
    503,
)
GET_BULK_BODY: Doc = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    **bulkbody.GetBulkBody.model_json_schema(),
                    "description": f"at most {bulkbody.MAX_BULK_KEYS} keys in all",
                }
            }
        },
    }
}


def range_answers(role: str) -> dict[int | str, Doc]:
    """`GET /v1/range`'s answers: a page, or the whole range as NDJSON; the root's is 421."""
    if role == "root":
        return answers({}, (421, "always: range reads belong to consumer nodes"))
    # A stream reads each chunk in its own transaction: no one seq to name, no header.
    page_only = {
        name: {**h, "required": False, "description": h["description"] + " (pages only)"}
        for name, h in _SEQ_HEADERS.items()
    }
    page = json_body("one page (`Accept: application/json`)", _PAGE, page_only)
    page["content"][NDJSON] = {"schema": {"type": "string"}}
    page["description"] += "; with `Accept: application/x-ndjson` every item, a line each"
    return answers(
        {200: page},
        (400, "bad query: prefix with start/end, end <= start, limit, an invalid cursor"),
        (500, "a value of the page failed its CRC"),
    )


_KEY_PARAM: Doc = {
    "name": "key",
    "in": "path",
    "required": True,
    "description": f"1 to {MAX_KEY} bytes, percent-encoded",
    "schema": {"type": "string"},
}
RANGE_PARAMS: Doc = {
    "parameters": [
        query("prefix", {"type": "string"}, "keys starting with it (not with start/end)"),
        query("start", {"type": "string"}, "first key of [start, end)"),
        query("end", {"type": "string"}, "end of [start, end), excluded"),
        query("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}, "items per page"),
        query("cursor", {"type": "string"}, "the previous page's next_cursor"),
        query("keys_only", {"type": "boolean"}, "keys without their values"),
    ]
}


def _point_get(head: bool) -> Doc:
    ok = body(
        "application/octet-stream",
        "the value's bytes" + (" (no body: HEAD)" if head else ""),
        {"type": "string", "format": "binary"},
        {**VERSION_HEADERS, **_SEQ_HEADERS},
    )
    errors: list[int | tuple[int, str]] = [
        (400, f"the key is not 1 to {MAX_KEY} bytes"),
        (404, "no such key"),
        (500, "the stored value failed its CRC"),
    ]
    return {
        "summary": "one value" + (", headers only" if head else ""),
        "operationId": "head_value" if head else "get_value",
        "parameters": [
            _KEY_PARAM,
            header("If-None-Match", 'an ETag (`"17"`, a list of them) or `*`: 304 when it matches'),
        ],
        "responses": {
            **{str(status): r for status, r in answers({200: ok}, *errors).items()},
            "304": {
                "description": "Not Modified: the ETag matches If-None-Match",
                "headers": {**VERSION_HEADERS, **_SEQ_HEADERS},
            },
        },
    }


def _write_refused(method: str) -> Doc:
    refused = _FACE.problem(405, "always: this node serves reads only")
    refused["headers"] = {
        "Allow": {"description": "`GET, HEAD`", "required": True, "schema": {"type": "string"}}
    }
    return {
        "summary": "refused: this node is read-only (write through the root)",
        "operationId": f"write_refused_{method}",
        "parameters": [_KEY_PARAM],
        "responses": {"405": refused},
    }


#: The operations a read token guards (`reads/auth.py`): (path, method).
_GUARDED = (
    ("/v1/kv/{key}", "get"),
    ("/v1/kv/{key}", "head"),
    ("/v1/get_bulk", "post"),
    ("/v1/range", "get"),
)


def finish(doc: Doc, *, role: str, read_auth: bool) -> Doc:
    """FastAPI's document of the read app of a node of `role` made true (module doc)."""
    paths = doc.setdefault("paths", {})
    for ranged in paths.get("/v1/range", {}).values():
        ranged["responses"] = {str(status): r for status, r in range_answers(role).items()}
    kv = paths.setdefault("/v1/kv/{key}", {})
    kv["get"] = _point_get(False)
    kv["head"] = _point_get(True)
    for method in ("put", "post", "delete", "patch"):
        kv[method] = _write_refused(method)
    if read_auth:
        doc.setdefault("components", {})["securitySchemes"] = {
            "read_token": {"type": "http", "scheme": "bearer", "description": "a read token"}
        }
        for path, method in _GUARDED:
            op: Any = paths.get(path, {}).get(method)
            if op is None:
                continue
            op["security"] = [{"read_token": []}]
            for status in (401, 403):
                op["responses"].setdefault(str(status), _FACE.problem(status))
    return openapi.finish(doc, {"431": _FACE.problem(431)})
