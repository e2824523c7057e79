"""The sessions dashboard at `/ui/` on the tool server (issue 17; docs/dashboard.md).

Who may see it: the same loopback rules as the rest of the server (a loopback Host, so no DNS rebinding),
and instead of a bearer token on every request a browser session: `ctproxy up` prints a one-time login
link (`/ui/login?code=…`); opening it sets an HttpOnly, SameSite=Strict cookie scoped to `/ui/` and
redirects to `/ui/`, so no page URL carries a secret after that. The token itself is never accepted in a
URL. A browser request with an Origin other than this server's own is refused (a foreign page can
neither read the API nor log in); scripts may still use the bearer token in the Authorization header.

Static files are plain ES modules served from the package (`static/`): nothing to build. The chart is
uPlot (MIT, vendored in `static/vendor/` with its license), small and dependency-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from proxy.app import sessionview
from proxy.app.status import all_statuses, read_run_file
from proxy.windows import cache_stats
from tools_server.metrics_endpoint import METRICS_KEY, TELEMETRY_KEY, ToolCallRecord
from tools_server.registry import Registry, Services
from tools_server.security import host_allowed

STATIC = Path(__file__).parent / "static"
COOKIE = "ctproxy_ui"
CODE_TTL_SECONDS = 600.0  # a link minted by `ctproxy dashboard`; the start-up link lasts until it is used
MAX_SESSIONS = 64
KEEPALIVE_SECONDS = 15.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class UISessions:
    """One-time login codes and the browser sessions they became (in memory: a restart logs out)."""

    def __init__(self) -> None:
        self._codes: dict[str, float | None] = {}  # code -> expiry (None: until used)
        self._sessions: dict[str, float] = {}  # session id -> created

    def new_code(self, ttl: float | None = CODE_TTL_SECONDS) -> str:
        code = secrets.token_urlsafe(24)
        self._codes[code] = time.time() + ttl if ttl is not None else None
        return code

    def redeem(self, code: str) -> str | None:
        """A fresh session id for a valid, unused code (which is then gone), else None."""
        now = time.time()
        self._codes = {c: e for c, e in self._codes.items() if e is None or e > now}
        match = next((c for c in self._codes if hmac.compare_digest(c.encode(), code.encode())), None)
        if match is None:
            return None
        del self._codes[match]
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = now
        while len(self._sessions) > MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        return sid

    def valid(self, sid: str | None) -> bool:
        return bool(sid) and any(hmac.compare_digest(s.encode(), sid.encode()) for s in self._sessions)  # type: ignore[union-attr]


SESSIONS_KEY = web.AppKey("ui_sessions", UISessions)
SERVICES_KEY = web.AppKey("ui_services", Services)
REGISTRY_KEY = web.AppKey("ui_registry", Registry)
STREAMS_KEY = web.AppKey("ui_streams", set)  # the open SSE streams' queues, ended when the server stops


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status,
                             headers={"Cache-Control": "no-store"})


def _is_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def ui_gate(security: Any, sessions: UISessions, token: str, listen_host: str,
            port_of: Callable[[], int | None]) -> Any:
    """The server's security middleware for every path but `/ui/…`, which gets the rules above."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not _is_ui(request.path):
            return await security(request, handler)
        if not host_allowed(request.headers.get("Host", ""), listen_host, port_of()):
            return _error(403, "forbidden_host", "Host header is not this server's loopback address")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"http://{request.headers.get('Host', '')}":
            return _error(403, "forbidden_origin", "only this server's own pages may call the dashboard API")
        bearer = hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected)
        if request.path == "/ui/login" or bearer or sessions.valid(request.cookies.get(COOKIE)):
            return await handler(request)
        if request.path.startswith("/ui/api/") or request.path == "/ui/login-codes":
            return _error(401, "unauthorized", "log in with the link `ctproxy up` printed (or `ctproxy dashboard`)")
        return web.Response(status=401, content_type="text/html", text=_LOGIN_PAGE,
                            headers={"Cache-Control": "no-store"})

    return middleware


_LOGIN_PAGE = """<!doctype html><meta charset="utf-8"><title>ctproxy dashboard</title>
<body style="font-family:system-ui;margin:3em"><h1>ctproxy dashboard</h1>
<p>Not logged in. Open the one-time login link that <code>ctproxy up</code> printed, or make a new one with
<code>ctproxy dashboard</code>.</p></body>"""


# ---- pages and login ----------------------------------------------------------------------------------


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


async def login(request: web.Request) -> web.StreamResponse:
    sid = request.app[SESSIONS_KEY].redeem(request.query.get("code", ""))
    if sid is None:
        return web.Response(status=403, content_type="text/html", text=_LOGIN_PAGE.replace(
            "Not logged in.", "This login link was already used or has expired."))
    resp = web.HTTPSeeOther("/ui/")
    resp.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", path="/ui")
    resp.headers["Cache-Control"] = "no-store"
    raise resp


async def login_codes(request: web.Request) -> web.Response:
    """A new one-time link (for `ctproxy dashboard`)."""
    if request.method != "POST":
        raise web.HTTPMethodNotAllowed(request.method, ["POST"])
    code = request.app[SESSIONS_KEY].new_code()
    return web.json_response({"url": f"http://{request.host}/ui/login?code={code}", "expires_in": CODE_TTL_SECONDS})


def login_url(app: web.Application, host: str, port: int) -> str:
    """The start-up link `ctproxy up` prints (valid until used)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/ui/login?code={app[SESSIONS_KEY].new_code(ttl=None)}"


# ---- the API ------------------------------------------------------------------------------------------


def _json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json", headers={"Cache-Control": "no-store"})


async def _db(request: web.Request, fn: Callable[[Any], Any]) -> Any:
    services = request.app[SERVICES_KEY]

    def run() -> Any:
        conn = services.state_store().view()  # the store's: every instance on a shared store shows the same state
        try:
            return fn(conn)
        finally:
            conn.close()

    return await asyncio.to_thread(run)


async def api_requests(request: web.Request) -> web.Response:
    records = await request.app[TELEMETRY_KEY].requests(after=int(request.query.get("after", "0") or 0))
    return _json({"proxy_reachable": records is not None, "data": records or []})


async def api_request_diff(request: web.Request) -> web.Response:
    """What the chain changed in one request's body (the replay diff, live; kept for recent small bodies)."""
    try:
        record_id = int(request.match_info["id"])
    except ValueError:
        return _error(404, "not_found", "no such request")
    status, body = await request.app[TELEMETRY_KEY].diff(record_id)
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


async def api_tasks(request: web.Request) -> web.Response:
    limit = int(request.query.get("limit", "50") or 50)
    tasks = await _db(request, lambda conn: sessionview.list_tasks(conn, max(1, min(limit, 500))))
    return _json({"data": [dataclasses.asdict(t) | {"sessions": t.sessions, "items": t.items} for t in tasks]})


async def api_session(request: web.Request) -> web.Response:
    key = request.match_info["key"]
    config = request.app[SERVICES_KEY].config

    def read(conn: Any) -> Any:
        s = sessionview.find_session(conn, key)
        if s is None:
            return None
        windows = cache_stats.read(conn, s.session_key)  # issue 47: what the upstream's prompt cache did
        cache = cache_stats.totals(windows) | {"windows": [dataclasses.asdict(w) for w in windows]}
        return s, sessionview.session_items(conn, key, 300), sessionview.session_plot(conn, key, config), cache

    found = await _db(request, read)
    if found is None:
        return _error(404, "not_found", "no such session")
    s, items, plot, cache = found
    return _json({"session": s, "items": items, "plot": plot, "prompt_cache": cache})


async def api_item(request: web.Request) -> web.Response:
    found = await _db(request, lambda conn: sessionview.item_raw(conn, request.match_info["id"]))
    if found is None:
        return _error(404, "not_found", "no such item")
    return _json({"item": found[0], "raw": found[1]})


def _owner(obj: Any) -> tuple[str | None, str | None]:
    owner = getattr(obj, "owner", None)
    if isinstance(owner, tuple) and len(owner) == 2:
        return str(owner[0]), str(owner[1])
    return None, None


def running_now(registry: Registry | None) -> list[dict[str, Any]]:
    """Shell jobs and code cells running now, read from the families' managers: ids, owners and times only
    (never a command line or a cell's source)."""
    now = time.monotonic()
    out: list[dict[str, Any]] = []
    for family in getattr(registry, "families", []):
        manager = getattr(family, "manager", None)
        jobs = getattr(manager, "_jobs", None)  # tools_server/shell/manager.ShellManager
        if isinstance(jobs, dict):
            for job in list(jobs.values()):
                if getattr(job, "finished_at", None) is None and not getattr(job, "released", False):
                    task, agent = _owner(job)
                    out.append({"kind": "shell", "id": str(getattr(job, "id", "?")), "task": task, "agent": agent,
                                "seconds": round(now - float(getattr(job, "started_at", now)), 1)})
        cells = getattr(manager, "cells", None)  # tools_server/codemode/cells.CellManager
        if isinstance(cells, dict):
            for cell in list(cells.values()):
                if getattr(cell, "state", None) == "running":
                    task, agent = _owner(cell)
                    out.append({"kind": "code cell", "id": str(getattr(cell, "id", "?")), "task": task,
                                "agent": agent, "seconds": round(now - float(getattr(cell, "started", now)), 1)})
    return out


async def api_tools(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    return _json({"calls": list(metrics.recent)[-100:], "running": running_now(request.app[REGISTRY_KEY])})


async def api_status(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    run = await asyncio.to_thread(read_run_file, services.state)
    statuses = all_statuses(services.config, run, None)
    return _json({"proxy": {k: run.get(k) for k in ("proxy", "mode", "upstream", "tools", "pid")} if run else None,
                  "capabilities": [s.__dict__ for s in statuses]})


def _sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def api_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `request` (each proxy request as it finishes), `toolcall` (each tool call)."""
    telemetry = request.app[TELEMETRY_KEY]
    metrics = request.app[METRICS_KEY]
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1000)  # None: the server is stopping

    def on_call(rec: ToolCallRecord) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(_sse("toolcall", rec))

    async def poll(after: int) -> None:
        while True:
            records = await telemetry.requests(after=after, wait=20)
            if records is None:
                await asyncio.sleep(2)  # the proxy is not there (yet, or with --no-metrics)
                continue
            for rec in records:
                after = max(after, int(rec.get("id", 0)))
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(_sse("request", rec))

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    await resp.write(b": connected\n\n")
    metrics.listeners.append(on_call)
    streams = request.app[STREAMS_KEY]
    streams.add(queue)
    poller = asyncio.create_task(poll(int(request.query.get("after", "0") or 0)))
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                chunk = b": keepalive\n\n"
            if chunk is None:
                break  # the server is stopping: end the stream (the browser reconnects to the next one)
            await resp.write(chunk)
    except ConnectionResetError:
        pass  # the page went away (a cancelled handler re-raises through `finally`)
    finally:
        poller.cancel()
        streams.discard(queue)
        with contextlib.suppress(ValueError):
            metrics.listeners.remove(on_call)
    return resp


async def _end_streams(app: web.Application) -> None:
    """on_shutdown: an open dashboard must not hold the server's stop for aiohttp's 60 s grace period."""
    for queue in list(app[STREAMS_KEY]):
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)


def mount_ui(app: web.Application, sessions: UISessions, services: Services, registry: Registry) -> None:
    app[SESSIONS_KEY] = sessions
    app[SERVICES_KEY] = services
    app[REGISTRY_KEY] = registry
    app[STREAMS_KEY] = set()
    app.on_shutdown.append(_end_streams)
    app.router.add_get("/ui", ui_root)
    app.router.add_get("/ui/", index)
    app.router.add_get("/ui/login", login)
    app.router.add_post("/ui/login-codes", login_codes)
    app.router.add_get("/ui/api/requests", api_requests)
    app.router.add_get("/ui/api/events", api_events)
    app.router.add_get("/ui/api/requests/{id}/diff", api_request_diff)
    app.router.add_get("/ui/api/tasks", api_tasks)
    app.router.add_get("/ui/api/sessions/{key}", api_session)
    app.router.add_get("/ui/api/items/{id}", api_item)
    app.router.add_get("/ui/api/tools", api_tools)
    app.router.add_get("/ui/api/status", api_status)
    app.router.add_static("/ui/static", STATIC, show_index=False, follow_symlinks=False)


async def ui_root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPMovedPermanently("/ui/")
