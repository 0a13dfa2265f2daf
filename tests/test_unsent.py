"""`net.unsent.to_drop`: the one rule both kinds of listener follow when the answers their
clients have not taken pass the cap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from net.unsent import Held, to_drop


def test_under_the_cap_nothing_is_dropped() -> None:
    held = [Held("a", 10, 1.0, 10), Held("b", 20, 2.0, 30)]
    assert to_drop(held, 30) == []


def test_clients_taking_nothing_go_first_longest_waiting_first() -> None:
    reading_old = Held("reading-old", 50, 1.0, 80)  # took 30 bytes since its pause
    stalled_new = Held("stalled-new", 50, 3.0, 50)
    stalled_old = Held("stalled-old", 50, 2.0, 50)
    order = [h.conn for h in to_drop([reading_old, stalled_new, stalled_old], 0)]
    assert order == ["stalled-old", "stalled-new", "reading-old"]
    # Just enough to get under the cap: the oldest stalled one alone.
    assert [h.conn for h in to_drop([reading_old, stalled_new, stalled_old], 100)] == [
        "stalled-old"
    ]


@given(
    st.lists(
        st.tuples(st.integers(0, 1 << 30), st.floats(0, 1e6), st.integers(0, 1 << 30)),
        max_size=50,
    ),
    st.integers(0, 1 << 32),
)
def test_what_stays_fits_the_cap_and_no_more_is_dropped_than_needed(
    rows: list[tuple[int, float, int]], cap: int
) -> None:
    held = [Held(i, u, at, pu) for i, (u, at, pu) in enumerate(rows)]
    dropped = to_drop(held, cap)
    left = sum(h.unsent for h in held) - sum(h.unsent for h in dropped)
    assert left <= cap
    if dropped:  # the last one dropped was needed: without it the rest were over the cap
        assert left + dropped[-1].unsent > cap
    assert len({h.conn for h in dropped}) == len(dropped)
