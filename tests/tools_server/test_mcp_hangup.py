"""seed004 old 20: an MCP client that closed its connection while its SSE answer was still being written left a
60-line `SSE response error` traceback per answer (the SDK logs what `send` raises). `tracked_send`, the `send`
the SDK gets, ends such an answer quietly. The race (aiohttp not yet told of the hang-up when the SDK writes) is
not reproducible on demand, so this drives `tracked_send` with the error aiohttp raises then."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tools_server.mcp_endpoint import tracked_send


async def test_a_write_to_a_closing_transport_ends_the_answer_quietly() -> None:
    sent: list[dict[str, Any]] = []

    async def closing(message: dict[str, Any]) -> None:
        if message.get("type") == "http.response.body":
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        sent.append(message)

    finished = asyncio.Event()
    send = tracked_send(closing, finished)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"event: message\n", "more_body": True})  # no raise
    assert finished.is_set()
    await send({"type": "http.response.body", "body": b"", "more_body": False})  # nowhere to deliver: dropped
    assert [m["type"] for m in sent] == ["http.response.start"]


async def test_an_ordinary_answer_is_delivered_and_ends_at_its_last_body() -> None:
    sent: list[dict[str, Any]] = []

    async def ok(message: dict[str, Any]) -> None:
        sent.append(message)

    finished = asyncio.Event()
    send = tracked_send(ok, finished)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"a", "more_body": True})
    assert not finished.is_set()
    await send({"type": "http.response.body", "body": b"b", "more_body": False})
    assert finished.is_set() and len(sent) == 3
