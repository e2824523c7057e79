"""Context tools (seed 000): `get_context_remaining` from the usage the proxy's tap recorded.

Returns `unknown` until a response with usage was seen for the caller — never a made-up number.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from proxy import usage as usage_store
from proxy.db import connect
from tools_server.registry import CallContext, Services, Tool, ToolResult


class GetContextRemainingArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _lookup(services: Services, task: str | None, agent: str | None) -> usage_store.Usage | None:
    if not services.state.db_path.exists():
        return None
    conn = connect(services.state.db_path)
    try:
        if task:
            return usage_store.last_usage_for_agent(conn, task, agent or "/root")
        row = conn.execute("SELECT * FROM usage ORDER BY updated_at DESC LIMIT 1").fetchone()
        return usage_store.Usage(**dict(row)) if row else None
    finally:
        conn.close()


def remaining_report(u: usage_store.Usage | None, windows: dict[str, int]) -> tuple[str, dict]:
    if u is None:
        return ("Context remaining: unknown (no response with usage has been seen for this agent yet).",
                {"state": "unknown"})
    window = usage_store.model_window(u.model, windows)
    used = u.input_tokens + u.output_tokens
    details = {"state": "known", "model": u.model, "input_tokens": u.input_tokens,
               "output_tokens": u.output_tokens, "context_window": window, "response_id": u.response_id}
    if window is None:
        details["state"] = "unknown_window"
        return (f"Context used: {used} tokens by model {u.model}; its context window is unknown, "
                "so the remaining budget is unknown.", details)
    remaining = max(window - used, 0)
    details.update(remaining_tokens=remaining, used_tokens=used,
                   remaining_fraction=round(remaining / window, 4))
    return (f"Context remaining: {remaining} of {window} tokens ({remaining / window:.1%}) after the last "
            f"response ({u.input_tokens} input + {u.output_tokens} output tokens, model {u.model}).", details)


class ContextFamily:
    name = "context"

    def __init__(self, services: Services):
        self.services = services

    async def _get_context_remaining(self, args: GetContextRemainingArgs, ctx: CallContext) -> ToolResult:
        u = await asyncio.to_thread(_lookup, self.services, ctx.task, ctx.agent)
        text, details = remaining_report(u, self.services.config.model_windows)
        return ToolResult(text=text, details=details)

    def tools(self) -> Iterable[Tool]:
        return [
            Tool(
                name="get_context_remaining",
                description="Report how many tokens of the model's context window remain, from the usage "
                "of the last response. Says 'unknown' when no usage has been seen yet.",
                family=self.name,
                capability="context",
                args_model=GetContextRemainingArgs,
                execute=self._get_context_remaining,
                parameters={"type": "object", "properties": {}, "additionalProperties": False},
                strict=True,
                read_only=True,
            )
        ]

    async def close(self) -> None:
        return None


def create_family(services: Services) -> ContextFamily:
    return ContextFamily(services)
