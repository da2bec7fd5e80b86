"""trainmem.serve: the HTTP JSON API for schedulers (FastAPI; the `serve` extra).

`create_app` builds the ASGI application; `serve` runs it under uvicorn.
"""

from ._app import DEFAULT_LIMITS, Limits, create_app, serve

__all__ = ["DEFAULT_LIMITS", "Limits", "create_app", "serve"]
