"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from store.format import OP_DELETE, OP_EXPIRE, OP_SET, OP_SET_EXPIRING
from store.ops import DELETE, EXPIRE, SET, Op

keys = st.binary(min_size=1, max_size=500)
small_keys = st.binary(min_size=1, max_size=3)
owners = st.text(max_size=20).filter(lambda s: len(s.encode()) <= 255)
owner_bytes = st.binary(max_size=255)
# Mostly small values, sometimes past one page so chunking is exercised.
values = st.one_of(st.binary(max_size=64), st.binary(min_size=4000, max_size=9000))
seqs = st.integers(min_value=0, max_value=2**64 - 1)

entry_ops = st.tuples(
    st.sampled_from([OP_SET, OP_DELETE, OP_SET_EXPIRING, OP_EXPIRE]),
    owner_bytes,
    keys,
    st.binary(min_size=8, max_size=300),  # an op-4 value starts with its 8-byte deadline
)
#: A few deadlines (µs), so that equal and different deadlines on one key both happen.
deadlines = st.sampled_from([0, 0, 0, 5, 7, 2**63])


@st.composite
def store_ops(
    draw: st.DrawFn,
    key_strategy: st.SearchStrategy[bytes] = small_keys,
    small_values: bool = False,
) -> Op:
    """An Op on a small key space, so that overwrites, duplicates and deletes happen."""
    kind = draw(st.sampled_from([SET, SET, SET, DELETE, EXPIRE]))
    key = draw(key_strategy)
    owner = draw(st.sampled_from(["", "alice", "bob"]))
    expect = draw(st.one_of(st.none(), st.none(), st.integers(min_value=0, max_value=20)))
    value = draw(st.binary(max_size=8) if small_values else values) if kind == SET else b""
    deadline = draw(deadlines) if kind == SET else 0
    return Op(kind, key, value, owner, expect, deadline)
