"""Raw-ASGI fast path for the hot write endpoints.

`FastPath` wraps the FastAPI app: ``PUT``/``DELETE /v1/kv/{key}`` and ``POST /v1/batch`` are
answered here by the framework-free handlers of `gateway/kv_handlers.py` — the same code the
FastAPI routes call — skipping FastAPI's routing, dependency solving and Request objects,
which cost about as much per request as the whole write path (measured by the `put`
scenario of bench/gateway_write.py, bench/README.md). Every other request, and these too
when ``Settings.fast_path`` is off, goes to the FastAPI app. Errors become the same
problem+json responses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from core.errors import MercuryError
from gateway import kv_handlers, problems
from gateway.answers import Answer
from gateway.http import body_reader
from gateway.writes import Gateway

log = logging.getLogger("mercury.gateway")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_JSON = (b"content-type", b"application/json")
_PROBLEM = (b"content-type", b"application/problem+json")


class FastPath:
    """ASGI app: hot write endpoints served directly, the rest by `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method = scope["method"]
            path = scope["path"]
            handler = None
            if path.startswith("/v1/kv/"):
                if method == "PUT":
                    handler = kv_handlers.put_kv
                elif method == "DELETE":
                    handler = kv_handlers.delete_kv
            elif method == "POST" and path == "/v1/batch":
                handler = kv_handlers.post_batch
            if handler is not None:
                gw: Gateway | None = getattr(self.app.state, "gw", None)
                if gw is not None and gw.settings.fast_path:
                    await self._serve(gw, handler, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(
        self, gw: Gateway, handler: Any, scope: Scope, receive: Receive, send: Send
    ) -> None:
        t0 = time.perf_counter()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}

        read = body_reader(receive, headers.get("content-length"), scope)
        raw = scope.get("raw_path") or scope["path"].encode()
        try:
            a: Answer = await handler(gw, headers, raw, scope["query_string"], read, t0)
        except MercuryError as err:
            resp = problems.from_error(err)
            await resp(scope, receive, send)
            return
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            resp = problems.problem(500, "internal error; see the gateway's log")
            await resp(scope, receive, send)
            return
        body = orjson.dumps(a.body)
        out = [
            _PROBLEM if a.status >= 400 else _JSON,
            (b"content-length", str(len(body)).encode()),
        ]
        for k, v in a.headers.items():
            out.append((k.lower().encode("latin-1"), v.encode("latin-1")))
        await send({"type": "http.response.start", "status": a.status, "headers": out})
        await send({"type": "http.response.body", "body": body})
