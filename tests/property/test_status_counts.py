"""`store.ops.status_counts` (what batch answers and the per-batch metrics count) agrees
with `collections.Counter`, which it replaced on the bulk write path."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from store.ops import Status, status_counts


@given(st.lists(st.sampled_from(list(Status)), max_size=60))
def test_status_counts_is_a_counter(statuses: list[Status]) -> None:
    assert status_counts(statuses) == dict(Counter(statuses))
