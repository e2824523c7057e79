"""`GET /metrics` on the tool server: its own numbers and the proxy's, in the Prometheus text format.

Where the numbers live (issue 17; docs/dashboard.md): the proxy and the tool server are two processes. The
tool server counts its tool calls here (`ToolMetrics`); the proxy keeps its request metrics in its own
registry (`proxy/metrics.py`) and serves them on a loopback telemetry port (`proxy/app/telemetry.py`) that
`ctproxy up` hands the tool server as `--proxy-telemetry URL`. A scrape of the tool server's `/metrics`
(same loopback + bearer-token rules as every other route) pulls the proxy's text and appends it to its
own: one scrape target for both processes. `ctproxy_proxy_telemetry_up` says whether that pull worked.

Tool calls are counted by name (the registry's names; anything else is `unknown`, so a client cannot
grow the series), transport and outcome (`ok`, `error`: the tool answered an error, `refused`: a
ToolError before it ran, `cancelled`: its caller went away, `exception`: it raised), counted on the one
road every call takes (tools_server/service.py). Never arguments or results.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tools_server.registry import clip

log = logging.getLogger("ctproxy.tools")

CALL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
RECENT_CALLS = 200
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class ToolCallRecord:
    """One tool call as the dashboard shows it: no arguments, no result; the error text of a failed call."""

    id: int
    at: float
    name: str
    transport: str
    ms: float
    outcome: str  # ok | error | refused | cancelled | exception
    error: str | None = None  # clipped; what the model was told went wrong
    agent: str | None = None


class ToolMetrics:
    def __init__(self, known_tools: Callable[[], set[str]] | None = None):
        r = self.registry = CollectorRegistry()
        self._known = known_tools or (lambda: set())
        self._calls = Counter("ctproxy_tool_calls", "Tool calls, by tool, transport and outcome",
                              ["tool", "transport", "outcome"], registry=r)
        self._duration = Histogram("ctproxy_tool_call_duration_seconds", "Tool call duration", ["tool"],
                                   buckets=CALL_BUCKETS, registry=r)
        self.proxy_up = Gauge("ctproxy_proxy_telemetry_up", "1 when the proxy's metrics were read for this "
                              "scrape (0: not running, or started with --no-metrics)", registry=r)
        self.recent: deque[ToolCallRecord] = deque(maxlen=RECENT_CALLS)
        self._next = 1
        self.listeners: list[Callable[[ToolCallRecord], None]] = []

    def observe_call(self, name: str, transport: str, seconds: float, outcome: str, error: str | None = None,
                     agent: str | None = None) -> ToolCallRecord:
        """Count one call: the one road (tools_server/service.py) calls this for every call it takes."""
        label = name if name in self._known() else "unknown"
        transport = transport if transport in ("rest", "mcp", "bridge", "codex", "cell", "direct") else "other"
        self._calls.labels(label, transport, outcome).inc()
        self._duration.labels(label).observe(max(seconds, 0.0))
        rec = ToolCallRecord(id=self._next, at=time.time(), name=label, transport=transport,
                             ms=round(seconds * 1000, 2), outcome=outcome,
                             error=clip(error, 300) if error else None, agent=clip(agent, 80) if agent else None)
        self._next += 1
        self.recent.append(rec)
        for listener in list(self.listeners):
            try:
                listener(rec)
            except Exception:  # a slow or gone dashboard never fails a call
                pass
        return rec

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ProxyTelemetry:
    """The tool server's client of the proxy's loopback telemetry (proxy/app/telemetry.py)."""

    def __init__(self, url: str | None, token: str):
        self.url = url.rstrip("/") if url else None
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def metrics_text(self) -> bytes | None:
        if self.url is None:
            return None
        try:
            async with self._http().get(self.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                return await r.read() if r.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def requests(self, after: int = 0, wait: float = 0.0) -> list[dict[str, Any]] | None:
        """The proxy's request records with an id above `after` (None: the proxy is not reachable)."""
        if self.url is None:
            return None
        try:
            async with self._http().get(self.url + "/requests", params={"after": str(after), "wait": str(wait)},
                                        timeout=aiohttp.ClientTimeout(total=wait + 10)) as r:
                if r.status != 200:
                    return None
                data = orjson.loads(await r.read()).get("data")
                return data if isinstance(data, list) else None
        except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError, AttributeError):
            return None

    async def diff(self, record_id: int) -> tuple[int, dict[str, Any]]:
        """(status, body) of the proxy's on-demand body diff of one request."""
        if self.url is None:
            return 503, {"error": {"code": "no_proxy", "message": "the proxy's telemetry is not available"}}
        try:
            async with self._http().get(f"{self.url}/requests/{record_id}/diff",
                                        timeout=aiohttp.ClientTimeout(total=30)) as r:
                return r.status, orjson.loads(await r.read())
        except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError):
            return 503, {"error": {"code": "no_proxy", "message": "the proxy did not answer"}}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


METRICS_KEY = web.AppKey("tool_metrics", ToolMetrics)
TELEMETRY_KEY = web.AppKey("proxy_telemetry", ProxyTelemetry)


async def metrics_handler(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    proxy_text = await request.app[TELEMETRY_KEY].metrics_text()
    metrics.proxy_up.set(1 if proxy_text is not None else 0)
    body = metrics.render() + (proxy_text or b"")
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE, "Cache-Control": "no-store"})


def mount_metrics(app: web.Application, metrics: ToolMetrics, telemetry: ProxyTelemetry) -> None:
    app[METRICS_KEY] = metrics
    app[TELEMETRY_KEY] = telemetry
    app.router.add_get("/metrics", metrics_handler)

    async def close(_: web.Application) -> None:
        await telemetry.close()

    app.on_cleanup.append(close)
