"""The one error -> HTTP table serves both faces (gateway and replica reads)."""

from __future__ import annotations

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
