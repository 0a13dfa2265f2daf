"""The one error -> HTTP table serves both faces (gateway and replica reads)."""

from __future__ import annotations

import orjson

from core import errors as e
from core.problems import TABLE, classify, slug_of


def test_most_specific_class_wins_and_slugs_follow_class_names() -> None:
    assert classify(e.InvalidCursorError("x")) == (400, "invalid-cursor", "Invalid range cursor")
    assert classify(e.KeyspaceOverlapError("x")).slug == "keyspace-overlap"
    assert classify(e.StoreFullError("x")).status == 507  # before its parent StoreError
    assert classify(e.CRCError("x")).status == 500  # a corrupt value is not "try later"
    assert classify(e.StoreError("x")) == (503, "store", "Service Unavailable")
    assert classify(e.MercuryError("x")).status == 500
    assert slug_of(e.DbIdMismatchError("x")) == "db-id-mismatch"


def test_no_row_is_shadowed_by_an_earlier_parent() -> None:
    for i, (cls, *_rest) in enumerate(TABLE):
        for parent, *_ in TABLE[:i]:
            assert not issubclass(cls, parent), f"{cls.__name__} is unreachable after {parent}"


ERRORS = [
    e.ForbiddenError("outside", producer="p", key=b"k\xff", keyspaces=["a/"]),
    e.QuotaExceededError("slow down", retry_after=2, headers={"Retry-After": "2"}),
    e.RangeOnRootError("no ranges here", hint="ask a replica"),
    e.CRCError("bad bytes"),
    e.InvalidCursorError("bad cursor"),
]


def test_gateway_and_read_api_answer_an_error_with_the_same_document() -> None:
    """One body builder: same status, headers and bytes on both faces, the four standard
    members first and structured fields as extension members (never the headers field)."""
    from gateway.problems import from_error
    from reads.problems import problem_for

    for err in ERRORS:
        gw, rd = from_error(err), problem_for(err)
        assert (gw.status_code, gw.body) == (rd.status_code, rd.body)
        assert gw.headers.get("retry-after") == rd.headers.get("retry-after")
        assert gw.media_type == rd.media_type == "application/problem+json"
        doc = orjson.loads(gw.body)
        assert list(doc)[:4] == ["type", "title", "status", "detail"]
        assert doc["status"] == classify(err).status and doc["detail"] == err.message
        assert "headers" not in doc
    forbidden = orjson.loads(from_error(ERRORS[0]).body)
    assert forbidden["key"] == "k\\xff" and forbidden["keyspaces"] == ["a/"]
    assert orjson.loads(problem_for(ERRORS[2]).body)["hint"] == "ask a replica"


def test_a_precondition_answer_has_the_same_shape() -> None:
    from gateway.answers import kv_answer
    from store.ops import Result, Status

    a = kv_answer([Result(Status.PRECONDITION_FAILED, 7)])
    assert a.status == 412 and list(a.body)[:4] == ["type", "title", "status", "detail"]
    assert a.body["current_seq"] == 7 and a.headers == {"ETag": '"7"'}
