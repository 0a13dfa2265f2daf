"""Properties of range paging and cursors (pure logic, an in-memory reader double)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidCursorError, InvalidReadError
from reads import ranges
from store.ops import Value

keys = st.binary(min_size=1, max_size=6)


class DictReader:
    """The store Reader's scan contract over a dict (sorted on every scan)."""

    def __init__(self, data: dict[bytes, bytes]) -> None:
        self.data = data

    def scan(
        self,
        *,
        start: bytes = b"",
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> Iterator[tuple[bytes, Value | None]]:
        n = 0
        for k in sorted(self.data):
            if k < start or (end is not None and k >= end):
                continue
            if prefix is not None and not k.startswith(prefix):
                continue
            if limit is not None and n >= limit:
                return
            n += 1
            yield k, None if keys_only else Value(self.data[k], 1, "")


@given(st.binary(max_size=5))
def test_prefix_end_bounds_exactly_the_prefixed_keys(prefix: bytes) -> None:
    end = ranges.prefix_end(prefix)
    for k in (prefix, prefix + b"\x00", prefix + b"\xff\xff", prefix[:-1] + b"\xff"):
        inside = k.startswith(prefix)
        below = end is None or k < end
        if inside:
            assert below
    if end is not None:
        assert end > prefix and not end.startswith(prefix)


@given(
    st.sets(keys, max_size=60),
    st.one_of(st.none(), st.binary(min_size=1, max_size=2)),
    st.integers(1, 7),
    st.lists(st.tuples(st.booleans(), keys), max_size=40),
    st.integers(1, 40),
    st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_pages_return_every_stable_key_once_in_order_under_writes(
    initial: set[bytes],
    prefix: bytes | None,
    limit: int,
    writes: list[tuple[bool, bytes]],
    max_bytes: int,
    keys_only: bool,
) -> None:
    data = {k: b"v" * len(k) for k in initial}
    spec = ranges.make_spec(prefix=prefix)
    touched: set[bytes] = set()
    seen: list[bytes] = []
    after: bytes | None = None
    step = 0
    while True:
        items, more = ranges.read_page(
            DictReader(data), spec, after, limit, keys_only, max_bytes=max_bytes
        )
        assert len(items) <= limit
        if more:
            assert items  # a page that says "more" always makes progress
        sizes = [len(k) + (0 if keys_only else len(data.get(k, b""))) for k, _ in items]
        assert sum(sizes[:-1]) < max_bytes  # only the last item may cross the bound
        seen += [k for k, _ in items]
        if not more:
            break
        after = ranges.decode_cursor(spec, ranges.encode_cursor(spec, items[-1][0]))
        # writes land between pages
        for is_set, k in writes[step : step + 3]:
            touched.add(k)
            if is_set:
                data[k] = b"w"
            else:
                data.pop(k, None)
        step += 3
    assert seen == sorted(set(seen))
    stable = {k for k in initial - touched if prefix is None or k.startswith(prefix)}
    assert stable <= set(seen)
    assert all(prefix is None or k.startswith(prefix) for k in seen)


@given(st.binary(min_size=1, max_size=20), st.binary(min_size=1, max_size=20))
def test_cursor_round_trips_and_is_bound_to_its_range(last: bytes, other: bytes) -> None:
    spec = ranges.make_spec(prefix=b"p")
    assert ranges.decode_cursor(spec, ranges.encode_cursor(spec, last)) == last
    if other != b"p":
        with pytest.raises(InvalidCursorError):
            ranges.decode_cursor(ranges.make_spec(prefix=other), ranges.encode_cursor(spec, last))


@given(st.text(max_size=30))
def test_garbage_cursors_are_refused_not_crashing(text: str) -> None:
    spec = ranges.make_spec(start=b"a", end=b"b")
    with contextlib.suppress(InvalidCursorError):
        ranges.decode_cursor(spec, text)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(InvalidReadError):
        ranges.make_spec(prefix=b"a", end=b"b")
    with pytest.raises(InvalidReadError):
        ranges.make_spec(start=b"b", end=b"b")
    with pytest.raises(InvalidReadError):
        ranges.make_spec(prefix=b"")
    with pytest.raises(InvalidReadError):
        ranges.check_limit(ranges.MAX_LIMIT + 1)
