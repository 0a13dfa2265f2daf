"""Typed exceptions of the Mercury SDK, one per kind of answer a caller acts on differently.

Every server refusal is a problem+json document (``{"type", "title", "status", "detail",
...}``); `from_answer` maps its status to a class and keeps the whole body, so extension
members (``retry_after``, ``max_ops``, ``current_seq``...) stay readable. Three families
tell a caller (and `mercury kv`'s exit status) what to do next:

- `NotFound`: the key or resource is absent (`NoSuchRoute`, a 404 for a path no route
  serves, is not one: a wrong base URL must never read as "key absent");
- `Refused` (any other 4xx): the request as sent will not succeed; change it;
- `Unavailable` (connection failures, timeouts, 502/503/504) and `ServerError` (other 5xx):
  the node could not answer now.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: The problem types a client tells 404s apart by (the server's `core/problems.py` names
#: the same URIs; the SDK imports no server package, so they are spelt out here).
PROBLEM_TYPE = "https://mercury.invalid/problems/"
NO_SUCH_KEY_TYPE = PROBLEM_TYPE + "no-such-key"
NO_SUCH_ROUTE_TYPE = PROBLEM_TYPE + "no-such-route"
#: What a missing key answered before the 404s had kinds (a node of an older version).
NOT_FOUND_TYPE = PROBLEM_TYPE + "not-found"


class MercuryClientError(Exception):
    """Any failure of a Mercury request: HTTP `status` (0 when no answer came), the
    problem `title` and `detail`, the decoded `body` and the answer's `headers`."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" if status else f"{title}: {detail}")
        self.status = status
        self.title = title
        self.detail = detail
        self.body = body
        self.headers: dict[str, str] = dict(headers or {})


class Refused(MercuryClientError):
    """A 4xx answer: retrying the same request unchanged will not help (429 aside)."""


class BadRequest(Refused):
    """400: the request is malformed (key length, body, condition headers...)."""


class Unauthorized(Refused):
    """401: no token, or a token the node does not know."""


class Forbidden(Refused):
    """403: the token's producer may not touch this key (keyspace) or endpoint."""


class NotFound(Refused):
    """404: no such key (or resource)."""


class NoSuchRoute(Refused):
    """404 for a path no route of the node serves (problem type `NO_SUCH_ROUTE_TYPE`), or
    a 404 that is no Mercury problem at all (another server at that URL): the base URL is
    wrong (a missing or extra path, a proxy's prefix). Never a missing key."""


class Conflict(Refused):
    """409: the request conflicts with the node's state (e.g. overlapping keyspaces)."""


class Gone(Refused):
    """410: the requested history is no longer retained (`watch` from a collected seq)."""


class PreconditionFailed(Refused):
    """412: an If-Match / If-None-Match condition failed; `current_seq` when the node said."""

    @property
    def current_seq(self) -> int | None:
        v = self.body.get("current_seq") if isinstance(self.body, dict) else None
        return int(v) if isinstance(v, int) else None


class TooLarge(Refused):
    """413: the request can never be admitted as sent. `max_ops` / `max_bytes` give the
    largest admissible batch when the node said (None otherwise)."""

    @property
    def max_ops(self) -> int | None:
        return _int_member(self.body, "max_ops")

    @property
    def max_bytes(self) -> int | None:
        return _int_member(self.body, "max_bytes")


class Unprocessable(Refused):
    """422: well-formed but refused, e.g. an Idempotency-Key reused with another body."""


class QuotaExceeded(Refused):
    """429: over the producer's write quota. `retry_after` is the node's advice in
    seconds (the client already waited and retried as often as its policy allows)."""

    @property
    def retry_after(self) -> float | None:
        v = self.headers.get("retry-after")
        try:
            return float(v) if v is not None else None
        except ValueError:
            return None


RateLimited = QuotaExceeded


class ServerError(MercuryClientError):
    """A 5xx answer that is not a passing unavailability (500, 501, 505...)."""


class StorageFull(ServerError):
    """507: the producer's storage quota or the store's map is full; delete keys first."""


class Unavailable(MercuryClientError):
    """No usable answer now: connection refused or cut, timeout, 502/503/504, or a redirect
    not followed (an HA group whose leader keeps moving, or one leaving HTTPS)."""


_BY_STATUS: dict[int, type[MercuryClientError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    412: PreconditionFailed,
    413: TooLarge,
    422: Unprocessable,
    429: QuotaExceeded,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
    507: StorageFull,
}


def _int_member(body: Any, name: str) -> int | None:
    v = body.get(name) if isinstance(body, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def class_for(status: int) -> type[MercuryClientError]:
    """The exception class of an HTTP error `status`."""
    cls = _BY_STATUS.get(status)
    if cls is not None:
        return cls
    if 400 <= status < 500:
        return Refused
    if 300 <= status < 400:
        return Unavailable
    return ServerError


def from_answer(status: int, headers: Mapping[str, str], content: bytes) -> MercuryClientError:
    """The exception for an error answer: problem+json members when the body is one,
    otherwise the raw text as detail."""
    body: Any
    try:
        body = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        body = content.decode("utf-8", "replace")
    if isinstance(body, dict):
        title = str(body.get("title") or "")
        detail = str(body.get("detail") or "")
    else:
        title, detail = "", str(body or "")
    lower = {k.lower(): v for k, v in headers.items()}
    cls = class_for(status)
    if status == 404 and not _mercury_404(body):
        cls = NoSuchRoute
    return cls(status, title or f"HTTP {status}", detail, body, lower)


def problem_type(body: Any) -> str:
    """The ``type`` member of a problem body ("" when there is none)."""
    return str(body.get("type") or "") if isinstance(body, dict) else ""


def _mercury_404(body: Any) -> bool:
    """A 404 that names a missing key or resource, not a path no route serves."""
    t = problem_type(body)
    return t.startswith(PROBLEM_TYPE) and t != NO_SUCH_ROUTE_TYPE


def key_absent(status: int, content: bytes) -> bool:
    """Whether an answer to ``GET /v1/kv/{key}`` says the key is absent: a 404 of type
    no-such-key (or the untyped not-found of an older node). Any other 404 (no such
    route, another server's page) is an error, never "absent"."""
    if status != 404:
        return False
    try:
        body = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        return False
    return problem_type(body) in (NO_SUCH_KEY_TYPE, NOT_FOUND_TYPE)
