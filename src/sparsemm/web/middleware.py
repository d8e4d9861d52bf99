"""ASGI middleware of the server: Host-header checks (DNS rebinding), security headers, body
size caps, and JSON messages for invalid requests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

# Host names a loopback server answers to; anything else is refused (DNS rebinding).
LOCAL_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 64 * 1024  # a search request is a few hundred bytes of JSON
SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
}


# ----------------------------------------------------------------------------- middleware


def _host_name(host: str) -> str:
    """The name part of a Host header: 'a.b:80' -> 'a.b', '[::1]:80' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """Host check, request-size limit and security headers (pure ASGI middleware)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: Sequence[str],
        max_body: int,
        path_limits: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.allowed = {_host_name(h) for h in allowed_hosts}
        self.max_body = max_body
        self.path_limits = dict(path_limits or {})  # larger bodies for named paths (uploads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self.any_host and _host_name(headers.get("host", "")) not in self.allowed:
            await self._error(scope, receive, send, 400, "request for an unknown host name")
            return
        length = headers.get("content-length")
        max_body = self.path_limits.get(scope.get("path", ""), self.max_body)
        if length is not None and (not length.isdigit() or int(length) > max_body):
            await self._error(scope, receive, send, 413, "request body too large")
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            await self._error(scope, receive, send, 411, "send the body with a Content-Length")
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    out.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _error(
        self, scope: Scope, receive: Receive, send: Send, status: int, message: str
    ) -> None:
        response = JSONResponse({"error": message}, status_code=status)
        response.headers.update(SECURITY_HEADERS)
        await response(scope, receive, send)


def validation_message(exc: RequestValidationError) -> str:
    """One line from pydantic's errors: 'k: Input should be less than or equal to 100'."""
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            parts.append("the request body is not valid JSON")
            continue
        loc = [str(x) for x in err.get("loc", ())]
        # ("query", "k") -> "k"; ("body",) -> "request body"
        where = ".".join(loc[1:]) if len(loc) > 1 else "request body" if loc else "request"
        parts.append(f"{where}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request"
