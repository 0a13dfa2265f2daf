"""What the write path answers: status, JSON body and headers, before any HTTP framework.

`kv_answer` and `batch_answer` turn a request's store results into its answer; the same
function also produces the answer stored for an Idempotency-Key, so a replay is identical.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from core.problems import problem_document
from store.ops import Result, Status


@dataclass(slots=True)
class Answer:
    """An HTTP answer of the write path: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def kv_answer(results: list[Result]) -> Answer:
    """Answer of a single-key PUT/DELETE from its one result (412 on a failed condition)."""
    r = results[0]
    if r.status is Status.PRECONDITION_FAILED:
        body = problem_document(
            412,
            f"condition failed: the key's current seq is {r.seq}",
            slug="precondition-failed",
            current_seq=r.seq,
        )
        return Answer(412, body, {"ETag": f'"{r.seq}"'} if r.seq else {})
    return Answer(200, {"seq": r.seq, "status": r.status.value}, {})


def batch_answer(results: list[Result]) -> Answer:
    """Answer of POST /v1/batch: counts and the highest seq it touched."""
    counts = Counter([r[0] for r in results])
    seq = max([r[1] for r in results], default=0)
    return Answer(
        200,
        {
            "seq": seq,
            "written": counts[Status.WRITTEN],
            "deleted": counts[Status.DELETED],
            "duplicates": counts[Status.DUPLICATE],
            "absent": counts[Status.ABSENT],
        },
        {},
    )
