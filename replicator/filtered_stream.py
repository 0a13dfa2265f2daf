"""The source's side of a keyspace-filtered stream: one session's filter.

A replica asking for keyspaces (`frames.KEYSPACES`) gets every record as the filtered record
`store/filtered.py` makes of it, the chain of skip hashes starting at the head the replica
named. Filtering hashes every entry and compresses the kept ones again, so the source runs
it in a worker thread (`frames_of`), never on its event loop, which on a root serves the
gateway too.
"""

from __future__ import annotations

from replicator import filter as keyspace
from replicator import frames
from store import filtered
from store.ops import LogRecord


class FilteredSession:
    """What one filtered stream needs between records: the rule and the chain head."""

    def __init__(self, request: frames.Keyspaces, alg: int) -> None:
        self.prefixes = keyspace.normalize(request.prefixes)
        self.keep = filtered.keeps(self.prefixes)
        self.alg = alg
        #: The head before the next record: the replica's own at first, then each record's.
        self.head = request.head
        #: Bytes of the original records and of what was sent for them (for the logs).
        self.bytes_in = 0
        self.bytes_out = 0

    def frames_of(self, recs: list[LogRecord]) -> list[bytes]:
        """The RECORD frames of `recs`, filtered (blocking: call it in a worker thread)."""
        out = []
        for rec in recs:
            header, payload, _head = filtered.filter_record(
                rec.header, rec.payload, self.head, self.keep, self.alg
            )
            # The next record chains from this one's head as the root made it; a replica
            # on another history is stopped by its first check point (`filtered.scan`).
            self.head = rec.hash_head
            self.bytes_in += len(rec.header) + len(rec.payload)
            self.bytes_out += len(header) + len(payload)
            out.append(frames.encode_record(header, payload))
        return out
