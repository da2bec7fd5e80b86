"""The outer ASGI layer: a body limit whatever the transfer encoding, JSON bodies only, one log
line per request, and a last-resort 500 that logs the traceback and answers a generic message.

The body is read here, counting bytes as they arrive (Content-Length or chunked alike): past
`max_body_bytes` the request is answered 413 at once and the rest is never read; within the
limit the application receives the buffered body. A POST (every POST endpoint takes a JSON
body) whose content type is missing or not JSON is answered 415 saying to send
application/json: without this the application would judge the raw bytes and answer "body:
Input should be a valid dictionary", which names no cause. Log line (logger "trainmem.serve",
INFO):

    POST /v1/estimate 200 12.3ms client=127.0.0.1:51234

No bodies, no query strings, no headers are logged.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger("trainmem.serve")


class Guard:
    """ASGI middleware around the FastAPI application (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 0}

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        try:
            body = await self._read_body(receive)
            if body is None:
                await _answer(
                    send_logged,
                    413,
                    {"error": f"body: larger than {self.max_body_bytes} bytes"},
                    close=True,
                )
            elif scope["method"] == "POST" and not is_json(_header(scope, b"content-type")):
                await _answer(send_logged, 415, {"error": UNSUPPORTED_MEDIA_TYPE})
            else:
                await self.app(scope, _replay(body, receive), send_logged)
        except Exception:  # the last resort: every known cause is answered inside the app
            logger.exception("%s %s: unexpected error", scope["method"], scope["path"])
            if not status["code"]:
                await _answer(send_logged, 500, {"error": "internal error; see the server log"})
        finally:
            client = scope.get("client")
            logger.info(
                "%s %s %d %.1fms client=%s",
                scope["method"],
                scope["path"],
                status["code"],
                (time.perf_counter() - start) * 1e3,
                f"{client[0]}:{client[1]}" if client else "-",
            )

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it passes the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


UNSUPPORTED_MEDIA_TYPE = (
    "content-type: send the body as JSON with the header 'content-type: application/json'"
)
"""The 415 answer's one line: what to send (the body itself is not judged)."""


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type names JSON: application/json or application/*+json, any case,
    any parameters (``application/json; charset=utf-8``); what FastAPI parses as JSON."""
    if not content_type:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def _header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (the first of that name), decoded as latin-1; None if absent."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the buffered body once, then waits on the connection."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(send: Send, status: int, payload: dict[str, Any], *, close: bool = False) -> None:
    content = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
