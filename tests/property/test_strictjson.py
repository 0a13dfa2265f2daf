"""`core/strictjson.py`: a JSON body without repeated member names decodes exactly as
orjson decodes it; a body with an object that names a member twice, at any depth, is
refused naming that member.

Documents are drawn as trees whose objects are lists of (name, value) pairs (so a name
may repeat), with names full of what could fool the counts (colons, quotes, escapes,
whitespace), written the ways clients write JSON (compact, spaced, indented, whitespace
before the colon, names escaped so that two different spellings decode to one name).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import strictjson


class Obj:
    """A JSON object as written: its pairs in order, names possibly repeated."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


names = st.one_of(
    st.sampled_from(["a", "b", "keys", "ops", "key", "value", "a:b", '"', '":', " ", "é"]),
    st.text(alphabet='ab:" \\\n{}[],', max_size=6),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet='ab:" \\\n{}[],é', max_size=8),
)
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(st.tuples(names, inner), max_size=5).map(Obj),
    ),
    max_leaves=25,
)


def has_duplicate(t: Any) -> bool:
    if isinstance(t, Obj):
        keys = [k for k, _ in t.pairs]
        return len(set(keys)) != len(keys) or any(has_duplicate(v) for _, v in t.pairs)
    if isinstance(t, list):
        return any(has_duplicate(v) for v in t)
    return False


def duplicated_names(t: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(t, Obj):
        keys = [k for k, _ in t.pairs]
        out |= {k for k in keys if keys.count(k) > 1}
        for _, v in t.pairs:
            out |= duplicated_names(v)
    elif isinstance(t, list):
        for v in t:
            out |= duplicated_names(v)
    return out


def name_text(name: str, escape_first: bool) -> str:
    """A name as JSON text; `escape_first` writes its first character as \\uXXXX."""
    if escape_first and name:
        return '"' + f"\\u{ord(name[0]):04x}" + json.dumps(name[1:])[1:]
    return json.dumps(name, ensure_ascii=False)


def write(t: Any, style: int, escape: bool) -> str:
    """JSON text of tree `t`: style 0 compact, 1 `, ` and `: `, 2 ` : ` (whitespace before
    the colon), 3 newlines and tabs around everything."""
    comma, colon = [(",", ":"), (", ", ": "), (" , ", " : "), ("\n\t,\r\n", "\t:\n ")][style]
    if isinstance(t, Obj):
        members = [name_text(k, escape) + colon + write(v, style, escape) for k, v in t.pairs]
        return "{" + comma.join(members) + "}"
    if isinstance(t, list):
        return "[" + comma.join(write(v, style, escape) for v in t) + "]"
    return json.dumps(t, ensure_ascii=False)


def refusal(body: bytes) -> str | None:
    try:
        strictjson.loads(body)
    except strictjson.DuplicateMemberError as err:
        return err.member
    return None


@settings(max_examples=500)
@given(trees, st.integers(min_value=0, max_value=3), st.booleans())
def test_without_duplicates_the_document_is_orjsons_and_with_one_it_is_refused(
    t: Any, style: int, escape: bool
) -> None:
    body = write(t, style, escape).encode()
    if has_duplicate(t):
        assert refusal(body) in duplicated_names(t), body
        with pytest.raises(strictjson.DuplicateMemberError):
            strictjson.check(body)  # the read API's call: no document given
    else:
        assert strictjson.loads(body) == orjson.loads(body)
        strictjson.check(body)


@settings(max_examples=300)
@given(st.lists(st.tuples(names, scalars), min_size=1, max_size=6), st.data())
def test_a_name_repeated_anywhere_in_an_object_is_named(
    pairs: list[tuple[str, Any]], data: st.DataObject
) -> None:
    """One pair of an object written again (another value) at any position, the object
    at any depth of the document."""
    k, _ = data.draw(st.sampled_from(pairs))
    at = data.draw(st.integers(min_value=0, max_value=len(pairs)))
    obj = Obj([*pairs[:at], (k, data.draw(scalars)), *pairs[at:]])
    depth = data.draw(st.integers(min_value=0, max_value=3))
    t: Any = obj
    for _ in range(depth):
        t = data.draw(st.sampled_from([[t], Obj([("x", t)]), [1, Obj([("y", 2), ("z", t)])]]))
    body = write(t, data.draw(st.integers(min_value=0, max_value=3)), data.draw(st.booleans()))
    assert refusal(body.encode()) in duplicated_names(t)


@pytest.mark.parametrize(
    ("body", "member"),
    [
        (b'{"keyspaces": ["a/"], "keyspaces": ["b/"]}', "keyspaces"),
        (b'{"a":1,"\\u0061":2}', "a"),  # two spellings of one name
        (b'{"ops":[{"op":"set","key":"a:1","value":"x","value":"y"}]}', "value"),
        (b'{"x":"\\":\\":\\":","a":{"b":[{"c":1,"c":2}]}}', "c"),  # `":` in a string
        (b'{"a" :1, "a"\n:2}', "a"),
        (b"[" * 500 + b'{"d":1,"d":2}' + b"]" * 500, "d"),
    ],
)
def test_refused_bodies_name_the_member(body: bytes, member: str) -> None:
    assert refusal(body) == member


def test_a_body_too_deep_for_the_checking_decoder_is_refused() -> None:
    """orjson reads 1024 levels, the standard library's decoder fewer: a body that needs
    the second decoder (its counts do not settle it) and that it cannot read is refused."""
    body = b"[" * 1020 + b'{"a":"x\\":y","b":1}' + b"]" * 1020
    orjson.loads(body)
    with pytest.raises(strictjson.AmbiguousJsonError):
        strictjson.loads(body)


@pytest.mark.parametrize(
    "body",
    [b"1", b'"a:b"', b"{}", b"[]", b'{"a":{"a":{"a":1}}}', b'[{"a":1},{"a":1}]', b'{"a":"::"}'],
)
def test_the_same_name_in_different_objects_is_fine(body: bytes) -> None:
    assert strictjson.loads(body) == orjson.loads(body)
