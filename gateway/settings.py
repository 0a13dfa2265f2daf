"""Gateway settings: plain values, built by the CLI and handed to `create_app`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Settings:
    """What a gateway process is configured with.

    `batch_window_ms`: how long a batch stays open for more writes after its first one;
    it is committed earlier once it holds `batch_max_ops` ops or `batch_max_bytes` bytes.
    `idempotency_ttl_s`: how long an Idempotency-Key's first answer is kept (≥ 24 h).
    """

    batch_window_ms: float = 500.0
    batch_max_ops: int = 10_000
    batch_max_bytes: int = 64 << 20
    max_key: int = 500
    max_value: int = 25 << 20
    max_batch_ops: int = 10_000
    max_batch_body: int = 100 << 20
    idempotency_ttl_s: float = 48 * 3600.0
    idempotency_gc_every_s: float = 600.0
    #: The expirer's pass: at least this often, and at most this many keys per request.
    expiry_every_s: float = 1.0
    expiry_batch_max: int = 5000
    consumer_nodes: tuple[str, ...] = ()
    #: Serve the hot write endpoints by the raw-ASGI fast path (same handlers).
    fast_path: bool = True
