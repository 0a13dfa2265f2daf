"""Who a bearer token is: the one resolution of an ``Authorization`` header to a principal.

Every HTTP surface that takes a token — the gateway's writes and admin calls, the root's
reads and watch, a replica's read API and its point-get fast path — resolves it here, so
a header means the same principal everywhere: one bearer parser, one expiry rule, one
lookup. What a caller then *allows* stays its own policy (the gateway refuses consumer
tokens, the root's reads without ``--read-auth`` ignore them, only the root keeps *last
used*).

Pure: no clock, no store. The caller reads its clock and passes ``now_us``; the resolver
is built from an immutable `Acl` (and the admin token's hash) and rebuilt when either
changes, so a revoked token resolves to `Refusal.UNKNOWN` on the next request.

Timing: a token is found by its SHA-256 (a dict lookup whose timing depends on the digest,
never on the secret's bytes); the admin token, a single hash, is compared with
`hmac.compare_digest`.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass

from acl.model import CONSUMER, PRODUCER, Acl, Consumer, Producer
from acl.tokens import hash_token

#: The admin's kind. The admin token belongs to no producer or consumer (it is node-wide
#: and unknown to the ACL), has no id and never expires.
ADMIN = "admin"

#: The admin's keyspaces: the empty prefix, every key.
EVERYTHING: tuple[bytes, ...] = (b"",)

_SCHEME = "bearer"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who holds a token: `kind` (ADMIN, PRODUCER or CONSUMER), `name` (the producer's or
    consumer's; "admin" for the admin), the keyspaces it reaches as byte prefixes (for
    `bytes.startswith`; EVERYTHING for the admin), its expiry (µs since the epoch, None:
    never) and the token's id (None for the admin token)."""

    kind: str
    name: str
    keyspaces: tuple[bytes, ...]
    expires_us: int | None
    token_id: str | None


class Refusal(enum.Enum):
    """Why a header names no principal. Callers word (and may merge) these themselves."""

    #: No ``Authorization`` header, or one of another scheme.
    MISSING = "missing"
    #: A bearer token no one holds (never issued, revoked, or empty).
    UNKNOWN = "unknown"
    #: A known token whose expiry has passed.
    EXPIRED = "expired"


ADMIN_PRINCIPAL = Principal(ADMIN, "admin", EVERYTHING, None, None)


def bearer_token(authorization: str | bytes | None) -> str | None:
    """The token of an ``Authorization`` header value; None when there is no header or it
    is not of the Bearer scheme.

    The scheme is everything before the first space, in any case ("Bearer", "bearer",
    "BEARER"); the token is the rest with surrounding whitespace stripped, so extra
    spaces after the scheme are allowed and ``"Bearer "`` gives the empty token (which
    no one holds). Raw header bytes are read as Latin-1, as the HTTP servers decode them,
    so a non-ASCII token hashes the same whichever server read it.
    """
    if not authorization:
        return None
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, space, token = authorization.partition(" ")
    if not space or scheme.lower() != _SCHEME:
        return None
    return token.strip()


def expired(expires_us: int | None, now_us: int) -> bool:
    """The one expiry rule: a token expires at `expires_us` itself (refused from that
    microsecond on); None never expires."""
    return expires_us is not None and now_us >= expires_us


class TokenResolver:
    """Tokens of one `Acl`, plus the admin token's hash: token -> `Principal`.

    Immutable: build a new one when the ACL or the admin hash changes (`with_admin_hash`).
    """

    __slots__ = ("_index", "admin_hash")

    def __init__(self, acl: Acl | None = None, admin_hash: str | None = None) -> None:
        self.admin_hash = admin_hash
        index: dict[str, Principal] = {}
        if acl is not None:
            # Consumers first: a hash held by both kinds resolves to the producer, as the
            # token index always did (tokens carry 256 random bits: it never happens).
            holders: list[tuple[str, Consumer | Producer]] = [
                *((CONSUMER, c) for c in acl.consumers.values()),
                *((PRODUCER, p) for p in acl.producers.values()),
            ]
            for kind, h in holders:
                spaces = tuple(k.encode() for k in h.keyspaces)
                for tid, info in h.tokens.items():
                    index[info.hash] = Principal(kind, h.name, spaces, info.expires_us, tid)
        self._index = index

    def with_admin_hash(self, admin_hash: str | None) -> TokenResolver:
        """The same tokens with another admin token."""
        out = TokenResolver.__new__(TokenResolver)
        out._index, out.admin_hash = self._index, admin_hash
        return out

    def resolve(self, authorization: str | bytes | None, now_us: int) -> Principal | Refusal:
        """The principal of an ``Authorization`` header value at `now_us`."""
        token = bearer_token(authorization)
        if token is None:
            return Refusal.MISSING
        return self.resolve_token(token, now_us)

    def resolve_token(self, token: str, now_us: int) -> Principal | Refusal:
        """The principal of a bearer token (as `bearer_token` gives it) at `now_us`."""
        digest = hash_token(token)
        hit = self._index.get(digest)
        if hit is not None:
            return Refusal.EXPIRED if expired(hit.expires_us, now_us) else hit
        if self.admin_hash is not None and hmac.compare_digest(digest, self.admin_hash):
            return ADMIN_PRINCIPAL
        return Refusal.UNKNOWN
