"""Overflow recovery's upstream side, run by the window service (moved out of addons/compaction.py, issue 29):
the one retry, held whole (the agent has seen nothing yet), and the flow's tap refilled from its answer."""

from __future__ import annotations

from typing import Any

import orjson
from mitmproxy import http

from proxy.flowstate import state_of
from proxy.sse import ResponseTap, StreamTap
from proxy.upstream import UpstreamBroken, UpstreamUnavailable
from proxy.windows.service import WindowDeps


async def send_retry(deps: WindowDeps, request: http.Request, payload: dict[str, Any]) -> http.Response | None:
    """The retry of `request` with `payload`, through the upstream-turn service under the one credential rule."""
    req = request.copy()
    req.content = orjson.dumps(payload)  # re-encoded with the request's own Content-Encoding
    up = deps.turns.prepare(req.method, req.url, req.headers.items(multi=True), req.raw_content or b"",
                            deps.credentials_allowed)
    try:
        held = await deps.turns.hold(up)
    except (UpstreamUnavailable, UpstreamBroken):
        return None
    resp = http.Response.make(held.status, b"", [(k.encode(), v.encode()) for k, v in held.headers])
    resp.raw_content = held.body
    resp.headers["content-length"] = str(len(held.body))
    return resp


def retap(flow: http.HTTPFlow, resp: http.Response) -> None:
    """Refill the flow's tap from the retry, keeping the tap object (and its listeners)."""
    tap = state_of(flow).tap
    if not isinstance(tap, ResponseTap):
        return
    fresh = ResponseTap(listeners=tap.listeners)
    for name in ("response_id", "model", "status", "items", "usage", "error", "completed", "incomplete",
                 "events", "last_sequence", "first_output_seen"):
        setattr(tap, name, getattr(fresh, name))
    if resp.headers.get("content-type", "").lower().startswith("text/event-stream"):
        feeder = StreamTap(tap, resp.headers.get("content-encoding", ""))
        feeder(resp.raw_content or b"")
        feeder(b"")
    else:
        try:
            parsed = orjson.loads(resp.get_content(strict=False) or b"")
        except orjson.JSONDecodeError:
            return
        if isinstance(parsed, dict):
            tap.on_json_response(parsed)
