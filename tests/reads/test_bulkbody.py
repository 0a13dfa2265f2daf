"""`reads/bulkbody.py`: the get_bulk body's bounds, as pure logic and through the read
token middleware (in-process ASGI: the refusal must come before the body is received)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidReadError
from reads import bulkbody
from reads.auth import ReadAuth

# Keys full of what could fool a separator count: commas, quotes, backslashes, controls.
_nasty = st.text(alphabet=st.sampled_from(',"\\\x01a é[]{}:'), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(_nasty, min_size=2, max_size=40), indent=st.sampled_from([None, 2]))
def test_separators_are_counted_outside_strings_only(keys: list[str], indent: int | None) -> None:
    body = json.dumps({"keys": keys}, indent=indent).encode()
    n = len(keys) - 1  # commas between the keys; none elsewhere in this body
    assert bulkbody.too_many_items(body, limit=n) is None
    assert bulkbody.too_many_items(body, limit=n - 1) == n


def test_the_default_bound_admits_the_largest_honest_body() -> None:
    worst = "\x01" * 500  # every byte a \u0001 escape in JSON
    body = json.dumps({"keys": [worst] * 5_000, "keys_b64": ["QQ=="] * 5_000}, indent=1).encode()
    assert len(body) <= bulkbody.MAX_BULK_BODY
    assert bulkbody.too_many_items(body) is None
    tiny = b'{"keys": [' + b",".join([b'"a"'] * 1_000_000) + b"]}"
    assert bulkbody.too_many_items(tiny) == bulkbody.MAX_SEPARATORS + 1  # stopped early


def _receive(*msgs: dict[str, Any], then: BaseException | None = None) -> Any:
    """An ASGI `receive` that hands out `msgs`, then raises `then` (by default: the body
    was read past what the client sent)."""
    left = list(msgs)

    async def receive() -> dict[str, Any]:
        if left:
            return left.pop(0)
        raise then if then is not None else AssertionError("read past the body sent")

    return receive


_PIECE = 1 << 20
_OVER = [{"type": "http.request", "body": b" " * _PIECE, "more_body": True}] * (
    bulkbody.MAX_BULK_BODY // _PIECE + 1
)


@pytest.mark.parametrize(
    ("content_length", "receive", "status", "detail"),
    [
        ("12x", _receive(), 400, "Content-Length is not a number"),
        (str(bulkbody.MAX_BULK_BODY + 1), _receive(), 413, "10000 keys of at most 500 bytes"),
        (None, _receive(*_OVER), 413, f"exceeds {bulkbody.MAX_BULK_BODY} bytes"),
        (None, _receive({"type": "http.disconnect"}), 400, "before sending the whole body"),
        # (a receive raising TimeoutError stands for the 30 s without data)
        (None, _receive(then=TimeoutError()), 408, "no data for 30 s after 0 bytes"),
    ],
    ids=["bad-length", "declared-too-large", "chunked-too-large", "client-left", "stalled"],
)
def test_a_refused_body_is_answered_with_the_read_apis_status(
    content_length: str | None, receive: Any, status: int, detail: str
) -> None:
    """`read` refuses with the read API's statuses (BodyRefused), over the one bounded body
    reader it shares with the gateway (`net/asgibody.py`)."""
    with pytest.raises(bulkbody.BodyRefused) as got:
        asyncio.run(bulkbody.read(receive, content_length))
    assert got.value.status == status
    assert detail in got.value.detail


def test_a_body_within_the_bound_is_read_whole() -> None:
    pieces = [{"type": "http.request", "body": b'{"keys": ', "more_body": True}]
    pieces.append({"type": "http.request", "body": b'["a"]}', "more_body": False})
    assert asyncio.run(bulkbody.read(_receive(*pieces), None)) == b'{"keys": ["a"]}'


class _Tokens:
    def keyspaces(self, token: str) -> tuple[bytes, ...] | None:
        return (b"app/",) if token == "good" else None


def test_read_auth_refuses_an_oversized_body_before_receiving_it() -> None:
    sent: list[MutableMapping[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app must not be reached")

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body must not be read")

    async def send(msg: MutableMapping[str, Any]) -> None:
        sent.append(msg)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/get_bulk",
        "raw_path": b"/v1/get_bulk",
        "query_string": b"",
        "headers": [
            (b"authorization", b"Bearer good"),
            (b"content-length", str(bulkbody.MAX_BULK_BODY + 1).encode()),
        ],
    }
    asyncio.run(ReadAuth(app, _Tokens())(scope, receive, send))
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert b"too-large" in sent[1]["body"]


_TRICKY = [
    b'\xef\xbb\xbf{"keys": ["b/x"]}',  # a BOM: json.loads took it, the read API does not
    b'{"keys": ["a/x"], "keys": ["b/x"]}',  # a repeated member
    b'{"keys": ["\\ud800"]}',  # a lone surrogate
    b'{"keys": "b/x"}',
    b'{"keys_b64": ["!!"]}',
    b'{"keys": [1]}',
    b"[]",
    b"",
    b'{"keys": ["a/x"]} trailing',
    b'{"keys": ["a/x"], "other": NaN}',
]


@given(st.one_of(st.sampled_from(_TRICKY), st.binary(max_size=64)))
def test_the_middleware_reads_a_get_bulk_body_as_the_read_api_does(body: bytes) -> None:
    """The read-token middleware checked the keys of a body it decoded with json.loads,
    while the read API decoded it with its pydantic model: a body the two read differently
    could pass the keyspace check naming other keys than those served. Both now use
    `bulkbody.decode`: the middleware sees keys exactly when the API accepts the body,
    and the same keys."""
    from pydantic import ValidationError

    from reads.auth import _bulk_keys

    try:
        doc = bulkbody.decode(body)
        want: list[bytes] | None = [k.encode() for k in doc.keys]
    except (ValidationError, ValueError):
        want = None
    got = _bulk_keys(body)
    if want is None:
        assert got is None
    elif got is not None:
        assert got[: len(want)] == want
    else:  # only a bad base64 key makes the middleware give up on a valid model
        assert doc.keys_b64


@pytest.mark.parametrize(
    "body",
    [
        b'{"keys": ["a/x"], "keys": ["b/x"]}',
        b'{"keys_b64": ["YQ=="], "keys": ["a/x"], "keys_b64": ["Yg=="]}',
        b'{"keys": ["a:x"], "other": {"n": 1, "n": 2}}',  # in an ignored member too
    ],
)
def test_a_member_named_twice_is_refused_by_the_api_and_the_middleware(body: bytes) -> None:
    """pydantic keeps the last ``keys``; a reader keeping the first would see other keys.
    The body is refused (the read API's 400) and the middleware checks no keys of it."""
    from reads.auth import _bulk_keys
    from reads.http_app import _bulk_body

    with pytest.raises(ValueError, match="appears more than once"):
        bulkbody.decode(body)
    assert _bulk_keys(body) is None
    with pytest.raises(InvalidReadError, match="appears more than once"):
        _bulk_body(body, "application/json")
