"""The root's read tokens (`mercury root --read-auth`): which keyspaces a bearer token may
read on the root's HTTP reads.

A token index (the `reads.auth.TokenIndex` shape) over the gateway's live `Auth`, so the
root's reads follow exactly the ACL the gateway enforces: a revoked or expired token is
refused on the next request (the gateway rebuilds its index before the revoking call
answers), a use counts as the token's *last used*, and the admin token — node-local,
unknown to the replicated ACL — reads every key. Producers read their keyspaces,
consumers theirs.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from acl.model import CONSUMER, TokenOwner, find_token
from acl.tokens import hash_token
from gateway.auth import Auth

#: The admin token's keyspaces: the empty prefix, every key.
EVERYTHING: tuple[bytes, ...] = (b"",)


class GatewayReadTokens:
    """Keyspaces of a token per the gateway on ``app.state.gw`` (set by its lifespan)."""

    def __init__(self, app: Any, consumers: bool = True) -> None:
        self.app = app
        # False on a root without --read-auth: only producers (their keyspaces) and the
        # admin read there, as the root's point GET allows.
        self.consumers = consumers
        self._acl: object = None
        self._index: dict[str, TokenOwner] = {}

    def keyspaces(self, token: str) -> tuple[bytes, ...] | None:
        """The token's keyspaces; None when unknown, revoked or expired."""
        gw = getattr(self.app.state, "gw", None)
        if gw is None:
            return None  # not started yet
        auth: Auth = gw.auth
        if auth.acl is not self._acl:  # a new ACL (an Acl is immutable): new index
            self._index, self._acl = auth.acl.token_index(), auth.acl
        hit = find_token(self._index, token)
        if hit is None:
            admin = auth.admin_hash
            if admin is not None and hmac.compare_digest(hash_token(token), admin):
                return EVERYTHING
            return None
        now = time.time_ns() // 1000
        if hit.expires_us is not None and now >= hit.expires_us:
            return None
        if hit.kind == CONSUMER:
            if not self.consumers:
                return None
            c = auth.acl.consumers.get(hit.name)
            spaces = tuple(k.encode() for k in c.keyspaces) if c is not None else None
        else:
            p = auth.acl.producers.get(hit.name)
            spaces = p.prefixes() if p is not None else None
        if spaces is not None:
            auth.last_used[hit.token_id] = now
        return spaces
