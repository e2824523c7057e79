"""MCP revision 2026-07-28 (stateless: no `initialize`, no `Mcp-Session-Id`, `_meta` on every request,
`server/discover`) beside the 2025 revisions at the tool server's /mcp (issue 44), each with the official
client (`mcp` 2.x `Client`): what went over the wire is read back from the HTTP client's own hooks."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest

pytest.importorskip("mcp.client.client", reason="the mcp 2.x client is not installed")
pytestmark = pytest.mark.timeout(120)


async def _session(srv: Any, mode: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[httpx2.Headers]]:
    """One client session in `mode`: what it learned, the JSON-RPC messages it sent, the answers' headers."""
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    sent: list[dict[str, Any]] = []
    answered: list[httpx2.Headers] = []

    async def on_request(request: httpx2.Request) -> None:
        if request.method == "POST" and request.content:
            sent.append(orjson.loads(request.content))

    async def on_response(response: httpx2.Response) -> None:
        answered.append(response.headers)

    http = httpx2.AsyncClient(headers=srv.headers(None, None, None), timeout=httpx2.Timeout(30.0, read=120.0),
                              event_hooks={"request": [on_request], "response": [on_response]})
    async with http, Client(streamable_http_client(f"{srv.url}/mcp", http_client=http), mode=mode) as client:
        listed = await client.list_tools()
        names = {t.name for t in listed.tools}
        called = await client.call_tool("find_tools", {"query": "patch"})
        seen = {"version": client.protocol_version, "names": names, "called": called}
    return seen, sent, answered


async def test_the_stateless_revision_and_the_handshake_revisions_at_one_endpoint(tool_server: Any) -> None:
    srv = await tool_server({"tool_discovery.enabled": True, "tool_discovery.deferred": ["apply_patch"],
                             "apply_patch.enabled": True})
    modern, sent, answered = await _session(srv, "auto")  # the client probes server/discover
    assert modern["version"] == "2026-07-28"
    assert "find_tools" in modern["names"] and not modern["called"].is_error
    methods = [m.get("method") for m in sent]
    assert "server/discover" in methods and "initialize" not in methods
    for message in sent:  # every request carries its protocol version (and capabilities) in _meta
        if "id" in message:
            meta = (message.get("params") or {}).get("_meta") or {}
            assert meta.get("io.modelcontextprotocol/protocolVersion") == "2026-07-28", message
    assert not [h for h in answered if "mcp-session-id" in h]

    legacy, sent, answered = await _session(srv, "legacy")
    assert legacy["version"].startswith("2025-")
    assert legacy["names"] == modern["names"] and not legacy["called"].is_error
    assert sent[0].get("method") == "initialize"
    assert any("mcp-session-id" in h for h in answered)
