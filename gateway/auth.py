"""Who is calling and where they may write: bearer tokens and keyspace checks.

A header resolves to its principal by `acl.principals` (the one resolver every surface
uses), rebuilt by `Auth.rebuild` whenever the ACL changes, so a revoked token fails on the
next request. What the gateway allows is its own: an expired token fails like an unknown
one (401, worded apart); a consumer token is for reading on replicas, so the gateway
refuses it (403). The time each token was last used is kept in memory (no store write per
request): it says when this root process last saw the token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from operator import itemgetter

from acl.model import CONSUMER, Acl, Producer
from acl.principals import ADMIN as ADMIN_KIND
from acl.principals import Principal, Refusal, TokenResolver
from core.errors import AuthError, ForbiddenError
from store.docs import ADMIN_HASH
from store.ops import Op
from store.store import Store

_KEY = itemgetter(1)  # Op.key

ADMIN = "\x00admin"  # never a producer name (names cannot hold NUL)


def wall_us() -> int:
    """Now, in µs since the epoch: the clock tokens' expiry and last use are read on."""
    return time.time_ns() // 1000


def load_admin_hash(store: Store) -> str | None:
    """The admin token's hash from the store, or None when it holds none."""
    # A replicated document since format 5: a promoted replica keeps the admin token.
    doc = store.get_doc(ADMIN_HASH)
    return doc.body.decode() if doc is not None else None


class Auth:
    """Tokens and keyspaces of the current ACL, plus the admin token's hash."""

    def __init__(
        self, acl: Acl, admin_hash: str | None, clock: Callable[[], int] = wall_us
    ) -> None:
        self.acl = acl
        #: µs since the epoch; the root's reads (gateway/read_tokens.py) read it too
        self.clock = clock
        self.principals = TokenResolver(None, admin_hash)  # its tokens: rebuild(acl) below
        self._prefixes: dict[str, tuple[bytes, ...]] = {}
        #: token id -> µs of its last successful use by this process
        self.last_used: dict[str, int] = {}
        self.rebuild(acl)

    @property
    def admin_hash(self) -> str | None:
        """The admin token's hash (None: no admin token)."""
        return self.principals.admin_hash

    @admin_hash.setter
    def admin_hash(self, admin_hash: str | None) -> None:
        # Set when the admin token rotates: refused from the next request on.
        self.principals = self.principals.with_admin_hash(admin_hash)

    def rebuild(self, acl: Acl) -> None:
        """Use `acl` from now on (next request)."""
        self.acl = acl
        self.principals = TokenResolver(acl, self.principals.admin_hash)
        self._prefixes = {n: p.prefixes() for n, p in acl.producers.items()}
        live = {t for p in acl.producers.values() for t in p.tokens}
        live.update(t for c in acl.consumers.values() for t in c.tokens)
        self.last_used = {t: us for t, us in self.last_used.items() if t in live}

    def authenticate(self, authorization: str | None) -> str:
        """Producer name (or ADMIN) of a ``Bearer`` header; AuthError when unknown."""
        now = self.clock()
        who = self.principals.resolve(authorization, now)
        if who is Refusal.MISSING:
            raise AuthError("missing bearer token", hint='send "Authorization: Bearer <token>"')
        if who is Refusal.EXPIRED:
            raise AuthError("expired token", hint="ask the admin for a new token")
        if not isinstance(who, Principal):
            raise AuthError("unknown or revoked token")
        if who.kind == ADMIN_KIND:
            return ADMIN
        if who.token_id is not None:
            self.last_used[who.token_id] = now
        if who.kind == CONSUMER:
            raise ForbiddenError(
                f"token of consumer {who.name!r}: consumer tokens read from replicas",
                hint="use a producer token to write",
            )
        return who.name

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
        if prefixes and ops:
            # The keys that start with a prefix are one interval of the byte order (a key
            # between two of them shares their first len(prefix) bytes): when the smallest
            # and the largest key of the request start with the same prefix, so does every
            # key. Two passes in C instead of a Python test per op of every bulk request.
            keys = list(map(_KEY, ops))
            lo, hi = min(keys), max(keys)
            for pre in prefixes:
                if lo.startswith(pre) and hi.startswith(pre):
                    return
        # Otherwise find the first key outside them, for the answer to name.
        bad = next((op for op in ops if not (prefixes and op.key.startswith(prefixes))), None)
        if bad is not None:
            raise ForbiddenError(
                f"key {bad.key.decode('utf-8', 'backslashreplace')!r} is outside the "
                f"keyspaces of producer {p.name!r}: {list(p.keyspaces)}",
                producer=p.name,
                key=bad.key,
                keyspaces=list(p.keyspaces),
            )
