"""What the write path answers: status, JSON body and headers, before any HTTP framework.

`kv_answer` and `batch_answer` turn a request's store results into its answer; the same
function also produces the answer stored for an Idempotency-Key, so a replay is identical.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from core.problems import problem_document
from store.ops import Result, Status, status_counts

_SEQ = itemgetter(1)


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


def batch_answer(results: list[Result], keys: Sequence[bytes] | None = None) -> Answer:
    """Answer of POST /v1/batch: what the store did with each op, in totals, and per op
    when `keys` (the ops' keys, in order) are given.

    `seq` is the log position that reflects every op of the request (the highest seq among
    its results: new seqs, a duplicate's stored seq, a failed condition's current version),
    0 when no key it names has any version. The totals always add up to the number of ops.
    """
    counts = status_counts([r[0] for r in results])
    body: dict[str, Any] = {
        "seq": max(map(_SEQ, results), default=0),
        "written": counts.get(Status.WRITTEN, 0),
        "deleted": counts.get(Status.DELETED, 0),
        "duplicates": counts.get(Status.DUPLICATE, 0),
        "absent": counts.get(Status.ABSENT, 0),
        "superseded": counts.get(Status.SUPERSEDED, 0),
        "precondition_failed": counts.get(Status.PRECONDITION_FAILED, 0),
    }
    if keys is not None:
        body["results"] = [_op_result(k, r) for k, r in zip(keys, results, strict=True)]
    return Answer(200, body, {})


def _op_result(key: bytes, r: Result) -> dict[str, Any]:
    """One op's entry of ``results``: its key (``key_b64`` when not UTF-8), status, seq."""
    try:
        doc: dict[str, Any] = {"key": key.decode("utf-8")}
    except UnicodeDecodeError:
        doc = {"key_b64": base64.b64encode(key).decode()}
    doc["status"] = r.status.value
    doc["seq"] = r.seq
    return doc
