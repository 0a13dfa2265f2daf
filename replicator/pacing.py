"""When a replica's apply thread commits its next group of records (pure: times and sizes
in, a deadline out).

A replica keeping up with a busy root gets its records one by one, and committing each
on its own costs a commit's fixed work every time — LMDB's commit and its two
fdatasyncs — which weighs as much as applying a record of tens of KB. So while the stream
is heavy (the records of the last `span` seconds hold at least `busy_bytes`), a commit
starts no sooner than `window` seconds after the previous one began, and the records
arriving meanwhile join its group. A light stream, the usual one, is committed record by
record at once: a lone write after a quiet spell reaches readers as fast as without a
window, and only a stream heavy enough for commits to cost is held, by at most `window`.
"""

from __future__ import annotations

from collections import deque

#: Bytes of records in the last `span` seconds above which the stream counts as heavy.
BUSY_BYTES = 1 << 20


class CommitPacer:
    """Tracks the stream's recent bytes and the last commit's start (see module doc)."""

    def __init__(self, window: float, busy_bytes: int = BUSY_BYTES, span: float = 1.0) -> None:
        self.window = window
        self.busy_bytes = busy_bytes
        self.span = span
        self._recent: deque[tuple[float, int]] = deque()
        self._recent_bytes = 0
        self._last_start = float("-inf")

    def arrived(self, now: float, nbytes: int) -> None:
        """A record of `nbytes` was taken at `now`."""
        if self.window <= 0:
            return
        self._recent.append((now, nbytes))
        self._recent_bytes += nbytes

    def busy(self, now: float) -> bool:
        """Whether the records of the last `span` seconds hold `busy_bytes` or more."""
        while self._recent and self._recent[0][0] <= now - self.span:
            self._recent_bytes -= self._recent.popleft()[1]
        return self._recent_bytes >= self.busy_bytes

    def deadline(self, now: float) -> float:
        """Until when the group begun at `now` may wait for more records: `now` (commit
        what is queued) unless the stream is heavy, then the end of the window begun by the
        last commit."""
        if self.window <= 0 or not self.busy(now):
            return now
        return max(now, self._last_start + self.window)

    def started(self, now: float) -> None:
        """A commit began at `now`."""
        self._last_start = now
