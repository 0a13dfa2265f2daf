"""The source's handshake decision and the catch-up-or-bootstrap choice (pure).

`decide` is the whole acceptance logic of a replication source: it takes the replica's
HELLO and the source's facts, and returns None (accept) or the named refusal. `needs_bootstrap`
is the one rule for whether a replica can stream or must start from a snapshot.
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

from replicator import frames


class Refusal(NamedTuple):
    """A refusal code (`frames.REFUSE_*`) and the message the replica will log."""

    code: int
    message: str


def needs_bootstrap(has_store: bool, last_seq: int, first_retained: int) -> bool:
    """True when a replica cannot stream: it has no store, or the source's log no longer
    holds the seq right after its last one (garbage-collected history)."""
    return not has_store or last_seq + 1 < first_retained


def decide(
    hello: frames.Hello,
    *,
    source_id: bytes,
    db_id: bytes,
    first_retained: int,
    closing: bool = False,
    diverged: str | None = None,
) -> Refusal | None:
    """Accept `hello` (None) or say why not.

    Order matters: a protocol or mode the source does not speak is refused first, then a
    source shutting down, then a source whose own replication stopped as diverged
    (`diverged`: the `frames.diverged_refusal` message; it must not hand the history its
    source abandoned to anyone, stream or snapshot), then replicating from itself (client
    id = this source's id), then a db id mismatch (an all-zero db id is allowed only to
    fetch a snapshot: an empty replica does not know it yet), then missing history (stream
    mode, not newest-only).
    """
    if hello.version != frames.PROTOCOL_VERSION:
        return Refusal(frames.REFUSE_PROTOCOL, f"protocol version {hello.version} is not supported")
    if hello.mode not in (frames.MODE_STREAM, frames.MODE_SNAPSHOT, frames.MODE_INVALIDATE):
        return Refusal(frames.REFUSE_PROTOCOL, f"unknown mode {hello.mode}")
    if closing:
        return Refusal(frames.REFUSE_NOT_READY, "source is shutting down")
    if diverged is not None:
        return Refusal(frames.REFUSE_DIVERGED, diverged)
    if hello.client_id == source_id:
        return Refusal(frames.REFUSE_SELF, "replicating from itself: the source is this very node")
    # An empty replica fetching a snapshot, or an empty cache node starting at the head,
    # does not know the db id yet.
    unknown_ok = hello.db_id == frames.ZERO_ID and (
        hello.mode == frames.MODE_SNAPSHOT
        or (hello.mode == frames.MODE_INVALIDATE and hello.newest_only)
    )
    if hello.db_id != db_id and not unknown_ok:
        return Refusal(
            frames.REFUSE_DB_ID,
            f"db id mismatch: source holds {uuid.UUID(bytes=db_id)}, replica holds "
            f"{uuid.UUID(bytes=hello.db_id)}",
        )
    if (
        hello.mode in (frames.MODE_STREAM, frames.MODE_INVALIDATE)
        and not hello.newest_only
        and needs_bootstrap(True, hello.last_seq, first_retained)
    ):
        return Refusal(
            frames.REFUSE_BOOTSTRAP,
            f"history no longer retained: replica needs seq {hello.last_seq + 1}, "
            f"log starts at {first_retained}; bootstrap from a snapshot",
        )
    return None
