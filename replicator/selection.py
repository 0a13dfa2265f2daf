"""Which source to use next, and how long to wait first (pure; time passed in).

Sources are tried in the configured order. A failed connection moves on to the next source
at once; only after a whole round has failed does the replica wait, with a backoff that
doubles from `base` up to `cap` (bounded, and per node: a replica reconnecting upstream
keeps its own downstream connections, so backoffs never compound down the tiers). A
source that went stale (no new entry nor new root heartbeat for `staleness` seconds) is
left for the next one. A session that stayed up long enough resets the backoff.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Selector:
    """State of the source choice of one replica."""

    sources: list[tuple[str, int]]
    base: float = 0.1
    cap: float = 5.0
    index: int = 0
    failures_in_round: int = 0
    rounds_failed: int = 0

    @property
    def current(self) -> tuple[str, int]:
        """The source to try now."""
        return self.sources[self.index]

    def connected(self) -> None:
        """A handshake succeeded: the round starts over (the backoff stays until data flows)."""
        self.failures_in_round = 0

    def progressed(self) -> None:
        """The session delivered a record or a new heartbeat: the backoff starts over."""
        self.rounds_failed = 0

    def failed(self) -> float:
        """The current source failed (refused, unreachable, broken stream): move to the
        next one and return how many seconds to wait before trying it."""
        self.index = (self.index + 1) % len(self.sources)
        self.failures_in_round += 1
        if self.failures_in_round < len(self.sources):
            return 0.0
        self.failures_in_round = 0
        self.rounds_failed += 1
        return float(min(self.cap, self.base * 2.0 ** (self.rounds_failed - 1)))

    def stale(self) -> float:
        """The current source went stale: move on (no wait unless a whole round failed)."""
        return self.failed()

    def retry_same(self) -> float:
        """The stream broke (gap, bad frame) on a healthy source: retry it, after a short
        bounded wait that grows if it keeps breaking."""
        self.rounds_failed += 1
        return float(min(self.cap, self.base * 2.0 ** min(self.rounds_failed - 1, 10)))
