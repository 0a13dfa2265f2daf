"""The gateway's FastAPI app, built by `create_app` (no module globals).

The lifespan builds the `Gateway` (ACL from the store, batcher, idempotency GC) on
``app.state.gw`` and starts the extra services (replication source, read listeners) the
process wiring hands in; at shutdown it commits and acknowledges the open batch first,
then stops those services.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from core.allow import allowed_methods
from core.errors import MercuryError
from core.openapi import generated
from core.problems import NO_SUCH_ROUTE, no_route_detail
from core.service import Service
from gateway import (
    openapi_doc,
    problems,
    routes_admin,
    routes_docs,
    routes_info,
    routes_kv,
    routes_usage,
)
from gateway.settings import Settings
from gateway.writes import Gateway
from store.store import Store

log = logging.getLogger("mercury.gateway")


def create_app(settings: Settings, store: Store, services: Sequence[Service] = ()) -> FastAPI:
    """The gateway app over an open, writable `store`.

    `services` are started after the gateway and stopped after its last batch committed.
    The caller owns `store` (opens it before, closes it after the app ran).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw = Gateway(store, settings)
        app.state.gw = gw
        gw.start()
        started: list[Service] = []
        try:
            for s in services:
                await s.start()
                started.append(s)
            yield
        finally:
            await gw.stop()
            for s in reversed(started):
                await s.stop()

    app = FastAPI(
        title="Mercury gateway",
        version="1",
        description="Producer write gateway of Mercury's root (contract: docs/api.md).",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load from a CDN: gateway/routes_docs.py serves both
        redoc_url=None,
    )
    app.include_router(routes_kv.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_usage.router)  # before routes_info: /v1/usage/{producer}
    app.include_router(routes_info.router)
    app.include_router(routes_docs.router)

    def openapi() -> dict[str, Any]:
        # FastAPI's document, made true by openapi_doc.finish (the shared Problem schema,
        # no phantom 422); built at the first request, once every route is in.
        if app.openapi_schema is None:
            app.openapi_schema = openapi_doc.finish(generated(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(MercuryError)
    async def on_mercury_error(request: Request, err: Exception) -> Response:
        assert isinstance(err, MercuryError)
        resp = problems.from_error(err)
        if resp.status_code >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.url.path, resp.status_code, err)
        return resp

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, err: Exception) -> Response:
        assert isinstance(err, HTTPException)
        headers = dict(err.headers or {})
        detail = str(err.detail)
        if err.status_code == 404:  # only routing raises it: no route serves the path
            detail = no_route_detail(request.method, request.url.path)
            return problems.problem(404, detail, slug=NO_SUCH_ROUTE, title="No such route")
        if err.status_code == 405:
            # Starlette names the methods of the one route it tried; a 405's Allow must
            # name every method the resource takes (GET, HEAD, PUT and DELETE on a key).
            headers["Allow"] = allowed_methods(app, request.scope)
            detail = f"{request.method} is not served here; this path takes {headers['Allow']}"
        return problems.problem(err.status_code, detail, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, err: Exception) -> Response:
        assert isinstance(err, RequestValidationError)
        detail = "; ".join(
            f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}" for e in err.errors()
        )
        return problems.problem(400, detail or "invalid request", slug="invalid-request")

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, err: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return problems.problem(500, "internal error; see the gateway's log")

    return app
