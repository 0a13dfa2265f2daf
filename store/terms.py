"""Terms recorded in the log (pure).

A leader records its promotion through the log before it acknowledges its first write: the
replicated document `TERM_DOC` (``promotion``, written by `store/promotion.py`) carrying
its term, node and URL, so every standby and replica holds the latest leadership and the
seq where it began. `TermGuard` is the rule every node applies: once
it has seen term T, a record of an older term is refused (it can only come from a deposed
leader).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Replicated document holding the current leadership (`store.promotion.PROMOTION_DOC`).
TERM_DOC = "promotion"


class StaleTermError(Exception):
    """A record or a leader of an older term than one already seen."""


def term_fields(term: int, node: str, url: str) -> dict[str, object]:
    """The fields a leader adds to its `TERM_DOC`."""
    return {"term": term, "node": node, "url": url}


def decode_term(body: bytes) -> int:
    """The term in a `TERM_DOC` body (ValueError when malformed; 0 for a promotion by hand,
    which names no term)."""
    try:
        term = json.loads(body).get("term", 0)
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
