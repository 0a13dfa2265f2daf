"""`/docs` (Swagger UI) and `/redoc` (ReDoc) over `/openapi.json`, served by the node itself.

FastAPI's own pages load their scripts from a CDN: on a machine without Internet access (a
laptop offline, a datacenter host) they stay blank. Here both pages load their assets from
this node: the Swagger UI bundle and ReDoc's standalone script as the PyPI package
`fastapi-offline` ships them (MIT; Swagger UI is Apache-2.0, ReDoc MIT), a runtime
dependency that is only a directory of files to us. Nothing on either page reaches another
host (ReDoc without its Google Fonts).
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from starlette.responses import FileResponse, HTMLResponse, Response

from core.errors import NotFoundError

#: The package's asset directory.
ASSETS = Path(fastapi_offline.__file__).parent / "static"
ASSETS_URL = "/docs/static"
#: The files the pages load (a fixed list: anything else is 404), and their types.
FILES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
OAUTH2_REDIRECT = "/docs/oauth2-redirect"

#: Both pages may load only from this node. ReDoc's sidebar shows its maker's logo from
#: the maker's CDN (and hides it when that fails): blocked here before any request, so
#: opening the docs tells no third party that someone did. Both pages style themselves
#: inline and start from an inline script; ReDoc searches in a blob: worker.
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' blob:; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
    "worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
)

router = APIRouter(include_in_schema=False)


def _title(request: Request) -> str:
    return str(request.app.title)


@router.get("/docs", response_class=HTMLResponse)
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over this node's OpenAPI document."""
    page = get_swagger_ui_html(
        openapi_url=str(request.app.openapi_url),
        title=f"{_title(request)} - Swagger UI",
        oauth2_redirect_url=OAUTH2_REDIRECT,
        swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
    )
    page.headers["Content-Security-Policy"] = CSP
    return page


@router.get(OAUTH2_REDIRECT, response_class=HTMLResponse)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc", response_class=HTMLResponse)
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc over this node's OpenAPI document."""
    page = get_redoc_html(
        openapi_url=str(request.app.openapi_url),
        title=f"{_title(request)} - ReDoc",
        redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
        with_google_fonts=False,
    )
    page.headers["Content-Security-Policy"] = CSP
    return page


@router.get(ASSETS_URL + "/{name}")
async def asset(name: str) -> Response:
    """One of the pages' files; they change only with the package, so cached for a day."""
    media = FILES.get(name)
    if media is None:
        raise NotFoundError(f"no file {name!r}")
    return FileResponse(
        ASSETS / name, media_type=media, headers={"Cache-Control": "public, max-age=86400"}
    )
