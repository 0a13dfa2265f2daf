"""What a 405 answer's Allow header names: every method the request's path takes.

Starlette answers a method no route of a path takes with the methods of the one route it
tried (`POST` on a key of the root said `Allow: PUT` while GET, HEAD and DELETE are
served too). Both HTTP faces ask every route instead.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import Match
from starlette.types import Scope

#: The methods a 405's Allow may name.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: Starlette, scope: Scope) -> str:
    """Every method some route of `app` takes on the request's path, for a 405's Allow
    header (asked of the routes themselves, included routers too)."""
    return ", ".join(
        m
        for m in _METHODS
        if any(r.matches({**scope, "method": m})[0] is Match.FULL for r in app.router.routes)
    )
