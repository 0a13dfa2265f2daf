"""Terms recorded in the log (pure).

A leader writes the replicated document `TERM_DOC` (its term, node and URL) through the log
before it acknowledges its first write, so every standby and replica holds the history of
leaderships at the seqs where they began. `TermGuard` is the rule every node applies: once
it has seen term T, a record of an older term is refused (it can only come from a deposed
leader).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Replicated document holding the current leadership.
TERM_DOC = "ha.term"


class StaleTermError(Exception):
    """A record or a leader of an older term than one already seen."""


def encode_term(term: int, node: str, url: str) -> bytes:
    """The body of `TERM_DOC`."""
    return json.dumps({"term": term, "node": node, "url": url}, sort_keys=True).encode()


def decode_term(body: bytes) -> int:
    """The term in a `TERM_DOC` body (ValueError when malformed)."""
    try:
        term = json.loads(body)["term"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"malformed {TERM_DOC} document: {err}") from err
    if not isinstance(term, int) or term < 0:
        raise ValueError(f"malformed {TERM_DOC} document: term {term!r}")
    return term


@dataclass(slots=True)
class TermGuard:
    """The highest term a node has seen; refuses older ones."""

    highest: int = 0

    def check(self, term: int, what: str = "record") -> None:
        """Accept `term` (raising the highest seen) or raise StaleTermError."""
        if term < self.highest:
            raise StaleTermError(
                f"{what} of term {term} refused: term {self.highest} was already seen "
                "(a deposed leader's history)"
            )
        self.highest = term
