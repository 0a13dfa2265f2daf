"""The pure head comparisons of `replicator/divergence.py`."""

from __future__ import annotations

from replicator.divergence import Point, RecentPoints, heartbeat_shows_divergence, holds

A, B = b"\x0a" * 32, b"\x0b" * 32


def test_the_same_head_at_the_same_seq_is_the_same_history() -> None:
    assert not heartbeat_shows_divergence(70, A, 2_000, Point(70, A, 1_000))


def test_another_head_at_the_same_seq_is_divergence() -> None:
    assert heartbeat_shows_divergence(70, B, 2_000, Point(70, A, 1_000))


def test_a_record_ending_elsewhere_is_divergence() -> None:
    # The root's seq ends one of its records; ours holding that seq ends later.
    assert heartbeat_shows_divergence(57, A, 2_000, Point(60, A, 1_000))


def test_a_heartbeat_older_than_our_record_tells_nothing() -> None:
    # A stale relayed heartbeat (a deposed leader's last) against a newer record.
    assert not heartbeat_shows_divergence(70, B, 1_000, Point(70, A, 2_000))
    # Commit time unknown (a snapshot's head): compared.
    assert heartbeat_shows_divergence(70, B, 1_000, Point(70, A, 0))


def test_holding_evidence_needs_the_same_seq_and_head() -> None:
    assert holds(Point(70, A, 1), 70, A)
    assert not holds(Point(70, A, 1), 70, B)
    assert not holds(Point(80, A, 1), 70, A)
    assert not holds(None, 70, A)


def test_recent_points_forget_the_oldest_past_their_size() -> None:
    recent = RecentPoints(size=3)
    for s in (10, 20, 30, 40):
        recent.add(Point(s, A, s))
    assert recent.get(10) is None
    assert [recent.get(s) for s in (20, 30, 40)] == [Point(s, A, s) for s in (20, 30, 40)]
    assert recent.get(35) is None  # only record ends are remembered
