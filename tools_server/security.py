"""Who may talk to the tool server: loopback Host names only, no browser Origin, the bearer token."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def host_allowed(host_header: str, listen_host: str, port: int | None) -> bool:
    """The Host must name a loopback address (or the listen address) and, when known, our port."""
    value = host_header.strip().lower()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        name += "]"
        port_part = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port_part = value.partition(":")
    names = set(LOOPBACK_NAMES)
    names.add(listen_host.lower() if ":" not in listen_host else f"[{listen_host.lower()}]")
    if name not in names:
        return False
    if port is None:
        return True
    return port_part == str(port) or (port_part == "" and port == 80)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def security_middleware(token: str, listen_host: str, port_of: Callable[[], int | None]) -> Callable:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # DNS rebinding: a browser page on evil.example resolving to 127.0.0.1 sends its own Host.
        if not host_allowed(request.headers.get("Host", ""), listen_host, port_of()):
            return _error(403, "forbidden_host", "Host header is not this server's loopback address")
        # Browsers always send Origin on cross-site requests; no legitimate client of ours does.
        if "Origin" in request.headers:
            return _error(403, "forbidden_origin", "browser origins are refused")
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return _error(401, "unauthorized", "missing or wrong bearer token (see `ctproxy token`)")
        return await handler(request)

    return middleware
