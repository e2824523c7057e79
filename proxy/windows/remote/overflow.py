"""Recognising `context_length_exceeded` in its three forms (responses-api.md §5.2), pure.

1. HTTP 400 with `{"error": {"code": "context_length_exceeded", …}}`;
2. `response.failed` in a 200 stream (or a JSON `Response` with status failed);
3. an `error` event, with the code at the top level or nested under `error`.
A stream counts only when the error comes before the first output event: after that the agent has
already seen part of an answer and a retry would not be invisible.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.items.sse import SSEDecoder

CODE = "context_length_exceeded"
# Events that mean output reached (or would reach) the agent.
OUTPUT_EVENTS = frozenset({
    "response.output_item.added", "response.output_item.done", "response.content_part.added",
    "response.output_text.delta", "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta", "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta", "response.refusal.delta",
})


def _code(obj: Any) -> str | None:
    return obj.get("code") if isinstance(obj, dict) and isinstance(obj.get("code"), str) else None


def event_error_code(payload: dict[str, Any]) -> str | None:
    """The error code of a terminal failure event, else None."""
    typ = payload.get("type")
    if typ == "response.failed":
        resp = payload.get("response")
        return _code(resp.get("error")) if isinstance(resp, dict) else None
    if typ == "error":
        return _code(payload.get("error")) or _code(payload)
    return None


def sse_failure_before_output(body: bytes) -> str | None:
    """The error code of a failure that precedes every output event; None if output came first."""
    decoder = SSEDecoder()
    for ev in [*decoder.feed(body), *decoder.close()]:
        if ev.data == "[DONE]":
            continue
        try:
            payload = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(payload, dict):
            continue
        if payload.get("type") in OUTPUT_EVENTS:
            return None
        code = event_error_code(payload)
        if code is not None or payload.get("type") in ("response.failed", "error"):
            return code or "unknown"
    return None


def response_error_code(status: int, content_type: str, body: bytes) -> str | None:
    """The error code of an answer that failed before any output, in any of the three forms."""
    ctype = content_type.lower()
    if ctype.startswith("text/event-stream"):
        return sse_failure_before_output(body) if status < 400 else None
    if "json" not in ctype and status < 400:
        return None
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    if status >= 400:
        return _code(parsed.get("error")) or "http_error"
    if parsed.get("status") == "failed":
        return _code(parsed.get("error")) or "unknown"
    return None


def is_overflow(status: int, content_type: str, body: bytes) -> bool:
    return response_error_code(status, content_type, body) == CODE
