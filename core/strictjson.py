"""JSON request bodies with every member name once per object: the one rule of both HTTP
faces (the gateway's admin and batch bodies, the read API's get_bulk body).

orjson, pydantic and Python's `json` all keep the last of repeated members:
``{"keyspaces": ["a/"], "keyspaces": ["b/"]}`` is ``["b/"]`` to them, and ``["a/"]`` to
a proxy or audit tool that keeps the first. A body whose meaning depends on the reader is
refused instead (`DuplicateMemberError`, an `AmbiguousJsonError`; each face answers it as it
answers a body that is not JSON: 400).

Detection costs little for the bodies that have no duplicates: every member of the text
has a name followed by ``:``, so the text holds at least as many colons as the decoded
document has members, and exactly as many when no colon sits inside a string and no
member is repeated. Only a body where the two counts differ (a colon or ``":`` inside a
string, or a duplicate) is scanned again by the standard library's decoder with an
``object_pairs_hook`` that sees every member, repeated or not.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


class AmbiguousJsonError(ValueError):
    """A JSON body that readers may take differently: refused."""


class DuplicateMemberError(AmbiguousJsonError):
    """A JSON object of the body names `member` more than once."""

    def __init__(self, member: str) -> None:
        super().__init__(
            f"member {member!r} appears more than once in one object; each name may "
            "appear once (which of the values would count is up to the reader)"
        )
        self.member = member


#: JSON's whitespace.
_WS = b" \t\r\n"


def loads(body: bytes) -> Any:
    """``orjson.loads(body)``, refusing a repeated member name in any object of it
    (`AmbiguousJsonError`); `orjson.JSONDecodeError` for a body that is not JSON."""
    doc = orjson.loads(body)
    check(body, doc)
    return doc


def check(body: bytes, doc: Any = None) -> None:
    """Raise `DuplicateMemberError` when an object of the JSON text `body` repeats a
    member name (`AmbiguousJsonError` when that cannot be told). `body` must already be
    known to be JSON, decoded to `doc` when given; without `doc` (a caller whose decoder
    builds no plain document, e.g. a pydantic model) it is decoded here with orjson once
    the text shows two member names or more.

    Members counted in `doc` <= its members <= the text's members (equal without a
    duplicate) <= colons after a quote <= colons: when a count of the first kind equals
    one of the last, there is no duplicate.
    """
    colons = body.count(b":")
    if colons < 2:
        return  # at most one member: nothing to repeat
    ends: int | None = None
    if doc is None:
        # The text's own bound first (no decoding): a get_bulk body names one member.
        ends = _name_ends(body)
        if ends < 2:
            return
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None  # JSON to the caller's decoder, not to orjson: the scan decides
        if type(doc) is dict and len(doc) == ends:
            return  # a flat object, settled before a Python pass over its lists
    if doc is not None:
        low = _members_near_top(doc)
        if low == colons:
            return
        if ends is None:
            ends = _name_ends(body)
        if low == ends or count_members(doc) == ends:
            return
    _scan(body)


def _name_ends(body: bytes) -> int:
    """Colons after a quote: at least the text's members (colons inside strings, as in
    "user:1", over-count the plain count)."""
    if b" " in body or b"\n" in body or b"\r" in body or b"\t" in body:
        # (whitespace may sit between a name and its colon; inside a string, taking it
        # out can only make more `":`)
        return body.translate(None, _WS).count(b'":')
    return body.count(b'":')


def _members_near_top(doc: Any) -> int:
    """Members of the top object of `doc`, of its objects and of the objects in its arrays
    (at most every member of `doc`: enough for the usual bodies, at C speed per object)."""
    if type(doc) is not dict:
        return 0
    n = len(doc)
    for v in doc.values():
        if type(v) is list:
            n += sum(map(len, [x for x in v if type(x) is dict]))
        elif type(v) is dict:
            n += len(v)
    return n


def count_members(doc: Any) -> int:
    """Members of every object of the decoded document `doc`."""
    n = 0
    stack = [doc]
    pop = stack.pop
    push = stack.append
    while stack:
        x = pop()
        if type(x) is dict:
            n += len(x)
            x = x.values()
        elif type(x) is not list:
            continue
        for v in x:
            t = type(v)
            if t is dict or t is list:
                push(v)
    return n


def unique_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A msgpack map from its (key, value) pairs (msgpack's `object_pairs_hook`),
    refusing a repeated key as a JSON body's repeated member is refused: the same one
    reading of every body, whatever its encoding."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[Any] = set()
        for k, _ in pairs:  # the key the dict kept once (equal to another: 1 and 1.0 too)
            if k in seen:
                raise DuplicateMemberError(str(k))
            seen.add(k)
    return out


def _unique(pairs: list[tuple[str, Any]]) -> None:
    if len(pairs) > 1 and len({k for k, _ in pairs}) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise DuplicateMemberError(k)
            seen.add(k)


def _scan(body: bytes) -> None:
    """Decode `body` again seeing every member of every object (no document is built);
    `AmbiguousJsonError` when that decoder cannot read it (only called on bodies the
    caller's decoder has taken)."""
    try:
        json.loads(
            body.decode("utf-8"),
            object_pairs_hook=_unique,
            parse_int=len,  # (numbers are not needed: no int() of 5000 digits)
            parse_float=len,
            parse_constant=len,
        )
    except DuplicateMemberError:
        raise
    except (RecursionError, ValueError) as err:
        # JSON to the caller's decoder, not to this one (nested deeper than it goes:
        # orjson takes 1024 levels): whether a member repeats cannot be told, so the body
        # is not taken either.
        raise AmbiguousJsonError(
            f"body cannot be checked for repeated members ({type(err).__name__})"
        ) from err
