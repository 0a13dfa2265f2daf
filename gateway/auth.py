"""Who is calling and where they may write: bearer tokens and keyspace checks.

Pure lookups over the ACL's token index (hashes only, constant-time comparison); rebuilt
by `Auth.rebuild` whenever the ACL changes, so a revoked token fails on the next request.
An expired token fails like an unknown one. A consumer token is for reading on replicas:
the gateway refuses it (403). The time each token was last used is kept in memory (no
store write per request): it says when this root process last saw the token.
"""

from __future__ import annotations

import hmac
import time

from acl.model import CONSUMER, Acl, Producer, find_token
from acl.tokens import hash_token
from core.errors import AuthError, ForbiddenError
from store.docs import ADMIN_HASH
from store.ops import Op
from store.store import Store

ADMIN = "\x00admin"  # never a producer name (names cannot hold NUL)


def load_admin_hash(store: Store) -> str | None:
    """The admin token's hash from the store, or None when it holds none."""
    # A replicated document since format 5: a promoted replica keeps the admin token.
    doc = store.get_doc(ADMIN_HASH)
    return doc.body.decode() if doc is not None else None


class Auth:
    """Tokens and keyspaces of the current ACL, plus the admin token's hash."""

    def __init__(self, acl: Acl, admin_hash: str | None) -> None:
        self.admin_hash = admin_hash
        self.acl = acl
        self._index = acl.token_index()
        self._prefixes: dict[str, tuple[bytes, ...]] = {}
        #: token id -> µs of its last successful use by this process
        self.last_used: dict[str, int] = {}
        self.rebuild(acl)

    def rebuild(self, acl: Acl) -> None:
        """Use `acl` from now on (next request)."""
        self.acl = acl
        self._index = acl.token_index()
        self._prefixes = {n: p.prefixes() for n, p in acl.producers.items()}
        live = {o.token_id for o in self._index.values()}
        self.last_used = {t: us for t, us in self.last_used.items() if t in live}

    def authenticate(self, authorization: str | None) -> str:
        """Producer name (or ADMIN) of a ``Bearer`` header; AuthError when unknown."""
        if not authorization or not authorization[:7].lower() == "bearer ":
            raise AuthError("missing bearer token", hint='send "Authorization: Bearer <token>"')
        token = authorization[7:].strip()
        hit = find_token(self._index, token)
        if hit is not None:
            now = time.time_ns() // 1000
            if hit.expires_us is not None and now >= hit.expires_us:
                raise AuthError("expired token", hint="ask the admin for a new token")
            self.last_used[hit.token_id] = now
            if hit.kind == CONSUMER:
                raise ForbiddenError(
                    f"token of consumer {hit.name!r}: consumer tokens read from replicas",
                    hint="use a producer token to write",
                )
            return hit.name
        if self.admin_hash is not None and hmac.compare_digest(hash_token(token), self.admin_hash):
            return ADMIN
        raise AuthError("unknown or revoked token")

    def require_admin(self, authorization: str | None) -> None:
        """Raise unless the caller holds the admin token."""
        if self.authenticate(authorization) != ADMIN:
            raise ForbiddenError("this call needs the admin token")

    def producer(self, authorization: str | None) -> Producer:
        """The calling producer (ForbiddenError for the admin token on producer calls)."""
        name = self.authenticate(authorization)
        if name == ADMIN:
            raise ForbiddenError(
                "the admin token cannot write keys", hint="create a producer and use its token"
            )
        return self.acl.producers[name]

    def check_keys(self, p: Producer, ops: list[Op]) -> None:
        """Every op's key must lie in `p`'s keyspaces (all checked before any applies)."""
        prefixes = self._prefixes.get(p.name, ())
        # key.startswith(tuple) inlined: this check runs once per op of every request
        bad = next((op for op in ops if not (prefixes and op.key.startswith(prefixes))), None)
        if bad is not None:
            raise ForbiddenError(
                f"key {bad.key.decode('utf-8', 'backslashreplace')!r} is outside the "
                f"keyspaces of producer {p.name!r}: {list(p.keyspaces)}",
                producer=p.name,
                key=bad.key,
                keyspaces=list(p.keyspaces),
            )
