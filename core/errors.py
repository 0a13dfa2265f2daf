"""Mercury's one error hierarchy.

Every error carries structured fields (key, seq, producer, hint) and says whether a retry can
succeed. Components raise these; both HTTP faces map them to statuses through one table
(`core/problems.py`); the CLI prints `str(err)` and the hint.
"""

from __future__ import annotations

from typing import Any


class MercuryError(Exception):
    """Root of every Mercury error.

    `hint` tells an operator what to do about it; `retryable` says whether the same request
    can succeed later without any change.
    """

    retryable: bool = False

    def __init__(self, message: str, *, hint: str | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.fields = fields

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} (hint: {self.hint})"
        return self.message


# --- store -------------------------------------------------------------------------------


class ConfigError(MercuryError):
    """A malformed command-line or configuration value (an address, a size...)."""


class StoreError(MercuryError):
    """Something is wrong with a store on disk or with a request made of it."""


class StoreExistsError(StoreError):
    """`init` was asked to create a store where one already exists."""


class StoreNotFoundError(StoreError):
    """No store at the given path."""


class FormatError(StoreError):
    """The store's format version is not the one this code runs on."""


class PendingMigrationsError(FormatError):
    """The store is older than the code: `mercury migrate` must run first."""


class NewerFormatError(FormatError):
    """The store was written by a newer Mercury: upgrade the code, never downgrade the data."""


class CorruptionError(StoreError):
    """Stored bytes fail their checksum or the log's hash chain does not hold."""


class CRCError(CorruptionError):
    """A stored value's CRC does not match: the bytes are never served."""


class ChainError(CorruptionError):
    """The log's hash chain or seq continuity is broken."""


class StoreFullError(StoreError):
    """The LMDB map (or the disk) is full; nothing of the batch was applied."""

    retryable = True


class InvalidOpError(StoreError):
    """An op the store refuses before touching anything (empty or oversized key, value...)."""


class LogRetentionError(StoreError):
    """The requested seq is older than the retained log: a replica must bootstrap."""


# --- reads (owned by the reads component) ------------------------------------------------


class ReadError(MercuryError):
    """A read request that cannot be served as asked."""


class InvalidReadError(ReadError):
    """A read request with bad parameters (key length, limit, range bounds)."""


class InvalidCursorError(InvalidReadError):
    """A range cursor that is malformed or was issued for another range."""


class ReadTooLargeError(ReadError):
    """The values asked for in one request exceed the node's per-reply bound."""


class RangeOnRootError(ReadError):
    """Range reads are refused on the root: they belong on consumer nodes."""


class OutsideKeyspaceError(ReadError):
    """A filtered replica asked for keys outside its keyspaces: served elsewhere (421)."""


class ReadProtocolError(ReadError):
    """Malformed or oversized input on a KT or memcached listener.

    `status` is the HTTP status a KT listener answers (None: close without answering, as
    KT does for an unknown binary magic); `close` says whether the connection can no longer
    be resynchronised and must close.
    """

    def __init__(
        self, message: str, *, status: int | None = 400, close: bool = False, **fields: Any
    ) -> None:
        super().__init__(message, **fields)
        self.status = status
        self.close = close


# --- gateway and ACL (owned by the gateway component) ------------------------------------


class GatewayError(MercuryError):
    """A producer's or admin's request the gateway refuses (mapped in core/problems.py)."""


class BadRequestError(GatewayError):
    """The request is malformed: bad JSON/msgpack, bad key, bad header (400)."""


class WriteGuardError(BadRequestError):
    """A keyspace's write guard refused the write (empty value, too many deletes) (400)."""


class AuthError(GatewayError):
    """Missing, unknown or revoked bearer token (401)."""


class ForbiddenError(GatewayError):
    """The caller may not do this: a key outside its keyspaces, or not the admin (403)."""


class NotFoundError(GatewayError):
    """No such producer, consumer, keyspace or token (404)."""


class NoSuchKeyError(NotFoundError):
    """The key is not stored (404, its own problem type: `core.problems.NO_SUCH_KEY`)."""


class MisdirectedError(GatewayError):
    """A read the root does not serve (range/bulk reads belong to consumer nodes) (421)."""


class KeyspaceOverlapError(GatewayError):
    """A keyspace grant overlaps another producer's and is not shared by both (409)."""


class PreconditionFailedError(GatewayError):
    """If-Match / If-None-Match did not hold at commit time (412)."""


class TooLargeError(GatewayError):
    """Key, value or batch beyond its limit (413)."""


class RequestTimeoutError(BadRequestError):
    """The client stopped sending its request body for longer than the body timeout (408)."""


class OverloadedError(GatewayError):
    """The write path holds as many batches as it may (open + queued): retry later (503)."""

    retryable = True


class QuotaExceededError(GatewayError):
    """Over the producer's write quota for longer than its max delay (429)."""

    retryable = True


class StorageQuotaError(GatewayError):
    """The write would grow the producer's stored bytes beyond its storage quota (507)."""


class ShuttingDownError(GatewayError):
    """The gateway is stopping and accepts no more writes (503)."""

    retryable = True


class AclDocError(GatewayError):
    """An `acl apply` YAML document is invalid."""


# --- replication (owned by the replication component) -----------------------------------


class ReplicationError(MercuryError):
    """Replication between a source and a replica failed."""


class ProtocolError(ReplicationError):
    """A malformed, truncated or corrupted frame on a replication connection.

    Retryable: the replica drops the connection and resumes from its last applied seq.
    """

    retryable = True


class StreamGapError(ReplicationError):
    """The stream skipped or repeated a seq: nothing of the record was applied.

    Retryable: the replica reconnects and resumes from its last applied seq.
    """

    retryable = True


class RefusedError(ReplicationError):
    """The source refused the handshake; `code` names why (see `replicator/frames.py`)."""


class DbIdMismatchError(RefusedError):
    """The source holds another database (different db id)."""


class SelfReplicationError(RefusedError):
    """The replica asked to replicate from itself."""


class BootstrapNeededError(RefusedError):
    """The source no longer retains the history the replica needs: bootstrap from a snapshot."""

    retryable = True


class DivergedError(ReplicationError):
    """This replica's history and its source's differ at the same seq (e.g. the root was
    restored from an older copy): no retry can succeed, only a re-bootstrap."""


class InvalidRecordError(ReplicationError):
    """A replicated log record holds what no store accepts (key length, value size, op
    code, entry numbering): replication stops rather than crash on it."""


class SnapshotTransferError(ReplicationError):
    """A snapshot transfer was cut or failed verification; retrying resumes it."""

    retryable = True
