"""The browser face of `trainmem serve`: an offline page at `/` and the API docs at `/docs`.

Every asset ships in the package (serve/static/, package data), so the page works on a cluster
with no way out: no CDN, no font or script from another host, and a Content-Security-Policy
that lets the browser fetch from this server only. The page builds its job form from the
server's own /openapi.json (the request models generated from the commands' declared options,
serve/_app.py), so the form has the CLI's fields, defaults and choices without a copy of them,
and it computes nothing itself: every number on it is an answer of /v1/estimate, /v1/recommend.

FastAPI's own /docs and /redoc load Swagger UI and ReDoc from a CDN (blank when air-gapped);
`create_app` turns them off and this module serves /docs (and /redoc, the same page) offline.
None of these routes is in the OpenAPI schema: /openapi.json is what it was.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "docs.html": "text/html; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "docs.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
}
"""The shipped files and their media types; a name outside this table is a 404 (no paths)."""

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
"""Content-Security-Policy of every page and asset: the browser loads and calls this server
only (a stray external URL is blocked, not fetched)."""


def asset(name: str) -> bytes:
    """The bytes of one shipped file (serve/static/NAME), read from the installed package."""
    return files("trainmem.serve").joinpath("static").joinpath(name).read_bytes()


def add_page(app: Any) -> None:
    """GET / (the page), /docs and /redoc (the API docs) and /static/NAME, kept out of the
    schema (`include_in_schema=False`)."""
    from fastapi.responses import Response
    from starlette.exceptions import HTTPException

    def answer(name: str) -> Any:
        return Response(
            asset(name),
            media_type=ASSETS[name],
            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
        )

    @app.get("/", include_in_schema=False)
    def page() -> Any:
        return answer("index.html")

    @app.get("/docs", include_in_schema=False)
    @app.get("/redoc", include_in_schema=False)
    def docs() -> Any:
        return answer("docs.html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Any:
        if name not in ASSETS:
            raise HTTPException(404)  # answered {"error": "Not Found"} like any unknown path
        return answer(name)
