"""The compiled JSON batch decoder agrees with the reference path.

Whenever `decode_json_ops` returns ops they equal what `parse_body` + `batch_ops` give
for the same body; whenever the reference refuses a body (or would refuse it), the
compiled decoder declines it. Bodies of the common shape are actually taken by the
compiled decoder (otherwise it would be dead code that always declines).
"""

from __future__ import annotations

import json
import os
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from core.errors import BadRequestError, MercuryError
from gateway import bodies
from store.ops import Op

try:
    from gateway._jsonops import decode_json_ops
except ImportError:  # pragma: no cover - before `make build`
    if os.environ.get("MERCURY_REQUIRE_CYTHON") == "1":
        raise
    pytest.skip("gateway/_jsonops.pyx not built", allow_module_level=True)

Limits = tuple[int, int, int]  # max_ops, max_key, max_value
DEFAULT: Limits = (10_000, 500, 25 << 20)

# Text that exercises every escape: quotes, backslashes, controls, non-ASCII, astral.
texts = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(['"', "\\", "/", "\n", "\t", "\x00", "\x7f", "é", "😀", "\u2028"]),
    ),
    max_size=40,
)
plain = st.text(alphabet="abcdefghijklmnop/_-.0123456789", min_size=1, max_size=30)
limits = st.one_of(
    st.just(DEFAULT),
    st.tuples(
        st.integers(min_value=1, max_value=5),
        st.integers(min_value=1, max_value=20),
        st.integers(min_value=0, max_value=30),
    ),
)


def reference(body: bytes, lim: Limits) -> tuple[list[Op], int] | None:
    try:
        return bodies.reference_batch_body_ops(
            body, "application/json", "p", max_ops=lim[0], max_key=lim[1], max_value=lim[2]
        )
    except MercuryError:
        return None


def agree(body: bytes, lim: Limits = DEFAULT) -> tuple[list[Op], int] | None:
    """Assert agreement; return what the compiled decoder gave."""
    fast = decode_json_ops(body, "p", *lim)
    ref = reference(body, lim)
    if fast is not None:
        assert ref is not None, f"compiled accepted what the reference refuses: {body!r}"
        assert fast == ref
        assert all(type(op) is Op for op in fast[0])
    return fast


@st.composite
def common_ops(draw: st.DrawFn, text: st.SearchStrategy[str] = texts) -> list[dict[str, str]]:
    """Ops of the common shape: set with key and value, delete with key only."""
    out: list[dict[str, str]] = []
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        key = draw(text.filter(bool))
        if draw(st.booleans()):
            fields = [("op", "set"), ("key", key), ("value", draw(text))]
        else:
            fields = [("op", "delete"), ("key", key)]
        out.append(dict(draw(st.permutations(fields))))
    return out


def dumps(doc: Any, style: int) -> bytes:
    """JSON as different clients write it: compact, ASCII-escaped, indented."""
    if style == 0:
        return orjson.dumps(doc)
    if style == 1:
        return json.dumps(doc).encode()  # \\uXXXX for everything non-ASCII
    if style == 2:
        return json.dumps(doc, ensure_ascii=False, indent=2).encode()
    return (" \r\n\t" + json.dumps(doc, separators=(" , ", " : ")) + "\n ").encode()


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(common_ops(), st.integers(min_value=0, max_value=3))
def test_common_shape_is_taken_and_equal(ops: list[dict[str, str]], style: int) -> None:
    body = dumps({"ops": ops}, style)
    assume(all(len(op["key"].encode()) <= 500 for op in ops))
    fast = agree(body)
    assert fast is not None, f"the compiled decoder declined a common body: {body!r}"


@settings(max_examples=300)
@given(common_ops(plain), limits)
def test_limits_agree(ops: list[dict[str, str]], lim: Limits) -> None:
    agree(orjson.dumps({"ops": ops}), lim)


# Shapes the compiled decoder must leave to the reference (which may accept them).
odd_op = st.one_of(
    st.fixed_dictionaries({"op": st.just("set"), "key_b64": st.just("YQ=="), "value": texts}),
    st.fixed_dictionaries({"op": st.just("set"), "key": texts, "value_b64": st.just("YQ==")}),
    st.fixed_dictionaries({"op": st.just("delete"), "key": plain, "value": texts}),
    st.fixed_dictionaries({"op": st.just("set"), "key": plain}),
    st.fixed_dictionaries({"op": st.just("put"), "key": plain, "value": texts}),
    st.fixed_dictionaries({"op": st.just("set"), "key": plain, "value": st.integers()}),
    st.fixed_dictionaries({"op": st.just("set"), "key": st.just(""), "value": texts}),
    st.fixed_dictionaries({"op": st.just("set"), "key": plain, "value": texts, "x": st.none()}),
    st.fixed_dictionaries({"key": plain, "value": texts}),
    st.none(),
    st.integers(),
    st.lists(plain, max_size=2),
)


@settings(max_examples=300)
@given(st.lists(st.one_of(odd_op, common_ops().map(lambda o: o[0])), max_size=6), limits)
def test_odd_shapes_agree(ops: list[Any], lim: Limits) -> None:
    agree(json.dumps({"ops": ops}).encode(), lim)


@given(st.dictionaries(st.sampled_from(["ops", "x", "Ops"]), st.lists(st.none(), max_size=2)))
def test_odd_documents_agree(doc: dict[str, Any]) -> None:
    agree(orjson.dumps(doc))


@settings(max_examples=500)
@given(common_ops(), st.data())
def test_mutated_bodies_agree(ops: list[dict[str, str]], data: st.DataObject) -> None:
    """Bytes flipped, inserted or cut anywhere: never accepted unless the reference agrees."""
    body = bytearray(orjson.dumps({"ops": ops}))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        i = data.draw(st.integers(min_value=0, max_value=len(body)))
        how = data.draw(st.sampled_from(["flip", "insert", "cut"]))
        b = data.draw(st.sampled_from([0x22, 0x5C, 0x7B, 0x7D, 0x2C, 0x3A, 0x00, 0x80, 0xED, 0x20]))
        if how == "insert":
            body[i:i] = bytes([b])
        elif i < len(body):
            if how == "flip":
                body[i] = b
            else:
                del body[i]
    agree(bytes(body))


@given(st.binary(max_size=300))
def test_arbitrary_bytes_agree(body: bytes) -> None:
    agree(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"ops":[{"op":"set","key":"\\ud800","value":""}]}',  # lone high surrogate
        b'{"ops":[{"op":"set","key":"\\udc00","value":""}]}',  # lone low surrogate
        b'{"ops":[{"op":"set","key":"\xed\xa0\x80","value":""}]}',  # UTF-8 surrogate
        b'{"ops":[{"op":"set","key":"\xc0\xaf","value":""}]}',  # overlong
        b'{"ops":[{"op":"set","key":"\xf4\x90\x80\x80","value":""}]}',  # past U+10FFFF
        b'{"ops":[{"op":"set","key":"a\tb","value":""}]}',  # raw control byte
        b'{"ops":[{"op":"set","key":"a","value":"\\x"}]}',  # bad escape
        b'{"ops":[{"op":"set","key":"a","value":""}]} x',  # trailing bytes
        b'\xef\xbb\xbf{"ops":[{"op":"set","key":"a","value":""}]}',  # BOM
        b'{"ops":[]}',
        b'{"ops":[{"op":"set","key":"a","key":"b","value":""}]}',  # repeated field
        b'{"ops":[{"op":"set","key":"a","value":""},]}',  # trailing comma
        b'{"o\\u0070s":[{"op":"set","key":"a","value":""}]}',  # escaped name
    ],
)
def test_refused_or_declined(body: bytes) -> None:
    assert decode_json_ops(body, "p", *DEFAULT) is None
    agree(body)


def test_large_body_scanned_without_gil_equals_reference() -> None:
    ops = [{"op": "set", "key": f"k/{i:08d}", "value": "é" * 50} for i in range(2000)]
    body = orjson.dumps({"ops": ops})
    from gateway._jsonops import NOGIL_MIN

    assert len(body) > NOGIL_MIN
    fast = agree(body)
    assert fast is not None and len(fast[0]) == 2000


# Values full of brackets and escapes: the structure bound counts brackets first (which
# over-counts those inside strings) and then scans exactly; neither may refuse a body the
# compiled decoder takes, whatever the escapes around the brackets.
bracey = st.text(alphabet='{}[]"\\/abu0', max_size=30)


@settings(max_examples=300)
@given(common_ops(bracey), limits, st.integers(min_value=0, max_value=3))
def test_brackets_inside_strings_never_count_as_structure(
    ops: list[dict[str, str]], lim: Limits, style: int
) -> None:
    assume(len(ops) <= lim[0])
    body = dumps({"ops": ops}, style)
    bodies.check_json_structure(body, lim[0])  # exact: the strings hold every bracket
    agree(body, lim)


@settings(max_examples=200)
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), texts),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(plain, inner, max_size=4)
        ),
        max_leaves=30,
    ),
    st.integers(min_value=1, max_value=5),
)
def test_nested_documents_agree_and_stay_bounded(doc: Any, max_ops: int) -> None:
    """Any JSON document: the compiled decoder and the reference agree, and the reference
    either decodes it or refuses it with a Mercury error (never a bare exception)."""
    body = orjson.dumps({"ops": doc})
    agree(body, (max_ops, 500, 1000))


def _orjson_or_refusal(body: bytes) -> Any:
    try:
        return ("ok", orjson.loads(body))
    except orjson.JSONDecodeError:
        return ("refused",)


def _lean_or_refusal(body: bytes) -> Any:
    try:
        return ("ok", bodies.loads_json_lean(body))
    except MercuryError:
        return ("refused",)


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)


@settings(max_examples=300)
@given(
    st.recursive(
        json_scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner)),
        max_leaves=20,
    ),
    st.integers(min_value=0, max_value=3),
)
def test_the_lean_json_decoder_gives_orjsons_document(doc: Any, style: int) -> None:
    """Big JSON bodies are decoded by `loads_json_lean` (orjson's parse buffer is ~13x the
    body): same document for every body orjson writes or clients write."""
    body = dumps(doc, style)
    assert _lean_or_refusal(body) == _orjson_or_refusal(body)


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [b"\\ud800", b"\\udc00", b"\\ud83d\\ude00", b"\\uDBFF\\uDFFF", b"\\\\ud800"]
            ),
            st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"18446744073709551616"]),
            st.binary(max_size=6),
            st.sampled_from([b'"', b"[", b"]", b",", b"{", b"}", b":", b"1", b"\xff"]),
        ),
        max_size=10,
    )
)
def test_the_lean_json_decoder_refuses_what_orjson_refuses(parts: list[bytes]) -> None:
    """Odd texts (lone surrogates, NaN, huge numbers, invalid UTF-8) inside or outside
    strings: both decoders accept the same bodies and give the same documents."""
    for body in (b"".join(parts), b'["' + b"".join(parts) + b'"]'):
        assert _lean_or_refusal(body) == _orjson_or_refusal(body), body


def _with_repeat(ops: list[dict[str, str]], at: int, field: str, again: str, top: bool) -> bytes:
    """The body of `ops` with op `at` naming `field` a second time (value `again`), or with
    a second ``"ops"`` member when `top`: written by hand (a dict cannot repeat a name)."""
    texts = []
    for i, op in enumerate(ops):
        members = [f"{json.dumps(k)}:{json.dumps(v)}" for k, v in op.items()]
        if i == at:
            members.insert(len(members) // 2, f"{json.dumps(field)}:{json.dumps(again)}")
        texts.append("{" + ",".join(members) + "}")
    body = '{"ops":[' + ",".join(texts) + "]"
    if top:
        body += ',"ops":[{"op":"delete","key":"other"}]'
    return (body + "}").encode()


@settings(max_examples=300)
@given(common_ops(), st.data())
def test_a_repeated_member_is_declined_and_refused_naming_it(
    ops: list[dict[str, str]], data: st.DataObject
) -> None:
    """An op naming a field twice (``"key"`` then ``"key"``: last wins to orjson, first to
    another reader), or the body naming ``"ops"`` twice: the compiled decoder declines it
    (it takes each of its fields once) and the reference refuses it, naming the member,
    instead of writing what the last one says."""
    at = data.draw(st.integers(min_value=0, max_value=len(ops) - 1))
    top = data.draw(st.booleans())
    field = "ops" if top else data.draw(st.sampled_from(sorted(ops[at])))
    body = _with_repeat(ops, -1 if top else at, field, data.draw(plain), top)
    assert decode_json_ops(body, "p", *DEFAULT) is None
    with pytest.raises(BadRequestError, match=f"member '{field}' appears more than once"):
        bodies.batch_body_ops(
            body, "application/json", "p", max_ops=10_000, max_key=500, max_value=25 << 20
        )


def test_a_repeated_member_is_refused_by_the_lean_decoder_too() -> None:
    """Bodies over `ORJSON_MAX_BODY` are decoded by the standard library: same refusal."""
    ops = [{"op": "set", "key": f"k:{i}", "value": "v" * 100} for i in range(12_000)]
    body = _with_repeat(ops, 11_000, "value", "w", False)
    assert len(body) > bodies.ORJSON_MAX_BODY
    with pytest.raises(BadRequestError, match="member 'value' appears more than once"):
        bodies.batch_body_ops(
            body, "application/json", "p", max_ops=20_000, max_key=500, max_value=1000
        )
    fine = orjson.dumps({"ops": ops})
    assert (
        len(
            bodies.reference_batch_body_ops(
                fine, None, "p", max_ops=20_000, max_key=500, max_value=1000
            )[0]
        )
        == 12_000
    )
