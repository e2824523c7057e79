"""Pure wire-format helpers: ids, token estimates, usage, the `Response` object, error bodies.

Nothing here does I/O; the shapes follow the OpenAPI `Response`, `ResponseUsage` and
`ErrorResponse` schemas and the real payloads quoted in research/responses-api.md.
"""

from __future__ import annotations

import base64
import hashlib
import math
import secrets
import string
from collections.abc import Mapping
from typing import Any

import orjson

CONTEXT_LENGTH_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."

# Messages the real API uses for the codes tests script most often (responses-api.md §5).
ERROR_MESSAGES: dict[str, str] = {
    "context_length_exceeded": CONTEXT_LENGTH_MESSAGE,
    "rate_limit_exceeded": (
        "Rate limit reached for gpt-5 in organization org-emulator on tokens per min (TPM): "
        "Limit 30000, Used 30000, Requested 1200. Please try again in 11.054s. "
        "Visit https://platform.openai.com/account/rate-limits to learn more."
    ),
    "insufficient_quota": (
        "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, read the docs: "
        "https://platform.openai.com/docs/guides/error-codes/api-errors."
    ),
    "server_error": (
        "An error occurred while processing your request. You can retry your request, or contact us "
        "through our help center at help.openai.com if the error persists."
    ),
}

_ALNUM = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    """An id shaped like the real ones: `resp_` + 48 hex digits (same for msg_, fc_, rs_, ws_, cmp_)."""
    return f"{prefix}_{secrets.token_hex(24)}"


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


def new_request_id() -> str:
    return "req_" + secrets.token_hex(16)


def canonical_hash(value: Any) -> bytes:
    """A stable digest of a JSON value (key order does not matter)."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).digest()


def opaque_blob(seed: bytes, length: int = 384) -> str:
    """Deterministic opaque base64 that looks like the real Fernet-style tokens (`gAAAAA…`)."""
    out = bytearray(b"\x80\x00\x00\x00\x00")  # Fernet version byte + zeroed timestamp prefix
    block = seed
    while len(out) < length:
        block = hashlib.sha256(block).digest()
        out += block
    return base64.urlsafe_b64encode(bytes(out[:length])).decode("ascii")


def approx_tokens(text: str | bytes) -> int:
    """Codex's byte estimate: ceil(len(utf-8 bytes) / 4)."""
    n = len(text) if isinstance(text, bytes) else len(text.encode("utf-8"))
    return math.ceil(n / 4)


def estimate_input_tokens(body: Mapping[str, Any]) -> int:
    """Bytes of `input` + `instructions` + `tools` as JSON, divided by 4 (at least 1)."""
    size = 0
    inp = body.get("input")
    if isinstance(inp, str):
        size += len(inp.encode("utf-8"))
    elif inp is not None:
        size += len(orjson.dumps(inp))
    if isinstance(body.get("instructions"), str):
        size += len(body["instructions"].encode("utf-8"))
    if body.get("tools"):
        size += len(orjson.dumps(body["tools"]))
    return max(1, math.ceil(size / 4))


def make_usage(input_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def merge_usage(base: dict[str, Any], override: Mapping[str, Any] | None) -> dict[str, Any]:
    """Apply a partial override; `total_tokens` follows input+output unless it is overridden too."""
    if not override:
        return base
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    if "total_tokens" not in override:
        out["total_tokens"] = out["input_tokens"] + out["output_tokens"]
    return out


def last_user_text(items: list[Any]) -> str:
    """The text of the newest user message (string or input_text parts), or ''."""
    for item in reversed(items):
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        if item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "input_text"]
            return "\n".join(t for t in parts if isinstance(t, str))
    return ""


def request_input(body: Mapping[str, Any]) -> list[Any]:
    inp = body.get("input")
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    return list(inp) if isinstance(inp, list) else []


def ends_with_compaction_trigger(body: Mapping[str, Any]) -> bool:
    inp = body.get("input")
    return (
        isinstance(inp, list)
        and bool(inp)
        and isinstance(inp[-1], dict)
        and (inp[-1].get("type") == "compaction_trigger")
    )


def response_object(
    body: Mapping[str, Any],
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """A `Response` echoing the request parameters the way the real API does."""
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    resp: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": bool(body.get("background") or False),
        "completed_at": completed_at,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": body.get("model") or "gpt-5",
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "prompt_cache_retention": body.get("prompt_cache_retention"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": _service_tier(body.get("service_tier")),
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0,
        "text": {
            "format": text.get("format") or {"type": "text"},
            "verbosity": text.get("verbosity") or "medium",
        },
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [_echoed_tool(t) for t in body.get("tools") or []],
        "presence_penalty": _number(body.get("presence_penalty"), 0.0),
        "frequency_penalty": _number(body.get("frequency_penalty"), 0.0),
        "top_logprobs": body.get("top_logprobs") or 0,
        "top_p": body.get("top_p") if body.get("top_p") is not None else 1.0,
        "truncation": body.get("truncation") or "disabled",
        "usage": usage,
        "metadata": dict(body.get("metadata") or {}),
    }
    if isinstance(body.get("user"), str):  # deprecated; the spec types it as a string, never null
        resp["user"] = body["user"]
    if body.get("access_programs") is not None:  # echoed (anchors-2026-12-07 §2.2)
        resp["access_programs"] = body["access_programs"]
    if body.get("conversation") is not None:
        conv = body["conversation"]
        resp["conversation"] = {"id": conv if isinstance(conv, str) else conv.get("id")}
    return resp


def _number(value: Any, default: float) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _echoed_tool(tool: Any) -> Any:
    """A tool as the API echoes it: a function tool always has `strict` (true unless the request said) and
    `parameters`, as the Response's `FunctionTool` requires."""
    if isinstance(tool, Mapping) and tool.get("type") == "function":
        return {**tool, "strict": tool.get("strict", True) if tool.get("strict") is not None else True,
                "parameters": tool.get("parameters")}
    return tool


def _service_tier(requested: Any) -> str:
    # The API reports the tier actually used; "auto" resolves to "default".
    return "default" if requested in (None, "auto") else str(requested)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An `ErrorResponse` body."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
