"""The Mercury SDK: `Client` (blocking) and `AsyncClient` (asyncio) over HTTP.

It speaks only HTTP to a root and to replicas: it imports no server component (an
import-linter contract in pyproject.toml says so). See docs/client.md.
"""

from mercury_client.aio import AsyncClient
from mercury_client.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    MercuryClientError,
    NoSuchRoute,
    NotFound,
    PreconditionFailed,
    QuotaExceeded,
    RateLimited,
    Refused,
    ServerError,
    StorageFull,
    TooLarge,
    Unauthorized,
    Unavailable,
    Unprocessable,
)
from mercury_client.retry import RetryPolicy
from mercury_client.sync import Client
from mercury_client.wire import BatchResult, Change, Item, Snapshot, Versioned, WriteResult

__all__ = [
    "AsyncClient",
    "BadRequest",
    "BatchResult",
    "Change",
    "Client",
    "Conflict",
    "Forbidden",
    "Gone",
    "Item",
    "MercuryClientError",
    "NoSuchRoute",
    "NotFound",
    "PreconditionFailed",
    "QuotaExceeded",
    "RateLimited",
    "Refused",
    "RetryPolicy",
    "ServerError",
    "Snapshot",
    "StorageFull",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "Versioned",
    "WriteResult",
]
