"""The compiled per-request counting of the usage series (`gateway/_usagecount.pyx`)
agrees with its pure-Python reference (`usage_series._count_one_py`) on any ops and
results: every status, statuses given as plain strings, empty and binary keys/values."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import usage_series as us
from store.ops import DELETE, SET, Op, Result, Status

try:
    from gateway._usagecount import count_one
except ImportError:  # pragma: no cover - before `make build`
    if os.environ.get("MERCURY_REQUIRE_CYTHON") == "1":
        raise
    pytest.skip("gateway/_usagecount.pyx not built", allow_module_level=True)

statuses = st.one_of(st.sampled_from(list(Status)), st.sampled_from([s.value for s in Status]))
pairs = st.lists(
    st.tuples(
        st.sampled_from([SET, DELETE]),
        st.binary(min_size=1, max_size=40),
        st.binary(max_size=200),
        statuses,
        st.integers(min_value=0, max_value=2**40),
    ),
    max_size=60,
)


@given(pairs)
def test_compiled_counting_agrees_with_the_reference(
    items: list[tuple[int, bytes, bytes, Status | str, int]],
) -> None:
    ops = [Op(kind, key, value, "owner") for kind, key, value, _, _ in items]
    results = [Result(status, seq) for *_, status, seq in items]  # type: ignore[arg-type]
    want = us._count_one_py(ops, results)
    got = count_one(ops, results, Status.WRITTEN, Status.DELETED, Status.DUPLICATE)
    assert got == want


def test_the_series_uses_it_and_refuses_what_is_not_a_tuple() -> None:
    # The pure pass (MERCURY_PURE=1) runs the series on the reference on purpose.
    assert us._fast_count is (None if os.environ.get("MERCURY_PURE") == "1" else count_one)
    with pytest.raises(ValueError):
        count_one([], [Result(Status.WRITTEN, 1)], Status.WRITTEN, Status.DELETED, Status.DUPLICATE)
    with pytest.raises(TypeError):
        count_one([1], [1], Status.WRITTEN, Status.DELETED, Status.DUPLICATE)  # type: ignore[list-item]
