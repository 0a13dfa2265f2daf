"""The root's read tokens (`mercury root --read-auth`): which keyspaces a bearer token may
read on the root's HTTP reads.

A token index (the `reads.auth.TokenIndex` shape) over the gateway's live `Auth`: the
token resolves by the gateway's own resolver (`acl.principals`, rebuilt before a revoking
call answers) on the gateway's clock, so the root's reads follow exactly the ACL the
gateway enforces: a revoked or expired token is refused on the next request, a use counts
as the token's *last used*, and the admin token — node-local, unknown to the replicated
ACL — reads every key. Producers read their keyspaces, consumers theirs.
"""

from __future__ import annotations

from typing import Any

from acl.model import CONSUMER
from acl.principals import EVERYTHING, Principal
from gateway.auth import Auth

__all__ = ["EVERYTHING", "GatewayReadTokens"]


class GatewayReadTokens:
    """Keyspaces of a token per the gateway on ``app.state.gw`` (set by its lifespan)."""

    def __init__(self, app: Any, consumers: bool = True) -> None:
        self.app = app
        # False on a root without --read-auth: only producers (their keyspaces) and the
        # admin read there, as the root's point GET allows.
        self.consumers = consumers

    def keyspaces(self, token: str) -> tuple[bytes, ...] | None:
        """The token's keyspaces; None when unknown, revoked or expired."""
        gw = getattr(self.app.state, "gw", None)
        if gw is None:
            return None  # not started yet
        auth: Auth = gw.auth
        now = auth.clock()
        who = auth.principals.resolve_token(token, now)
        if not isinstance(who, Principal):
            return None
        if who.kind == CONSUMER and not self.consumers:
            return None
        if who.token_id is not None:  # the admin token has no id, and no last use
            auth.last_used[who.token_id] = now
        return who.keyspaces
