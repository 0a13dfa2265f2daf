"""The pure keyspace rules of filtered replicas (`replicator/filter.py`)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator import filter as keyspace
from store import filtered
from store.filtered import past

ALPHABET = [b"a", b"b", b"/", b"\xff", b"\x00"]
prefix_lists = st.lists(
    st.sampled_from([b"a", b"a/", b"a/b", b"b/", b"\xff", b"\xff\xff", b"a\xff"]), min_size=1
)
short = st.binary(max_size=4).filter(lambda b: all(bytes([c]) in ALPHABET for c in b))
#: Every key of 1 to 4 bytes over ALPHABET.
ALL_KEYS = [b"".join(t) for n in range(1, 5) for t in itertools.product(ALPHABET, repeat=n)]


def test_normalize_sorts_dedupes_and_drops_covered_prefixes() -> None:
    assert keyspace.normalize([b"b/", b"a/x/", b"a/", b"b/"]) == (b"a/", b"b/")
    for bad in ([], [b""], [b"x" * 501], [b"%03d" % i for i in range(65)]):
        with pytest.raises(ValueError):
            keyspace.normalize(bad)


@given(prefix_lists, st.binary(min_size=1, max_size=6))
def test_a_normalized_list_holds_exactly_the_keys_the_given_one_does(ps, key) -> None:
    held = keyspace.normalize(ps)
    assert keyspace.holds_key(held, key) == any(key.startswith(p) for p in ps)


def test_who_may_feed_whom() -> None:
    assert keyspace.refusal(None, None) is None  # full -> full
    assert keyspace.refusal(None, (b"a/",)) is None  # full -> any subset
    assert keyspace.refusal((b"a/", b"b/"), (b"a/x/", b"b/")) is None  # a subset of its own
    full = keyspace.refusal((b"a/",), None)
    assert full is not None and "a full replica needs a full source" in full
    wider = keyspace.refusal((b"a/",), (b"a/x", b"c/"))
    assert wider is not None and wider.startswith("keyspaces 'c/' are not held")
    assert keyspace.refusal((b"a/",), (b"a",)) is not None  # "a" reaches "ab", not held


@settings(max_examples=200)
@given(prefix_lists, short, st.one_of(st.none(), short.filter(bool)))
def test_a_range_is_held_only_when_every_key_in_it_is(ps, start, end) -> None:
    held = keyspace.normalize(ps)
    if end is not None and end <= start:
        return
    if filtered.holds_range(held, start, end):
        inside = [k for k in ALL_KEYS if start <= k and (end is None or k < end)]
        assert all(keyspace.holds_key(held, k) for k in inside)
    # A prefix's own range (`reads.ranges.make_spec(prefix=...)`) is held.
    for p in held:
        assert filtered.holds_range(held, p, past(p))
