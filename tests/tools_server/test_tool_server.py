"""The tool server: auth, Host/Origin checks, REST and MCP with the official client."""

from __future__ import annotations

import aiohttp


async def test_rest_and_mcp_list_and_call(tool_server):
    srv = await tool_server()
    names = {t["name"] for t in await srv.list_rest()}
    assert "get_context_remaining" in names
    task = _task(srv)
    res = await srv.rest("get_context_remaining", {}, task=task)
    assert res.ok and res.details["state"] == "unknown" and "unknown" in res.text
    tools = await srv.mcp_list()
    assert "get_context_remaining" in {t.name for t in tools}
    mres = await srv.mcp("get_context_remaining", {}, task=task)
    assert not mres.is_error and "unknown" in mres.text
    assert mres.structured["ok"] is True and mres.structured["output"] == mres.text
    assert mres.structured["state"] == "unknown"
    notask = await srv.rest("get_context_remaining", {})  # issue 13: no task is an error, not any task's usage
    assert not notask.ok and notask.details["error"] == "no_task"


def _task(srv) -> str:
    from proxy.journal import Journal

    j = Journal(srv.services.state)
    try:
        return j.create_task()
    finally:
        j.close()


async def test_unknown_fields_are_errors_that_name_the_field(tool_server):
    srv = await tool_server()
    res = await srv.rest("get_context_remaining", {"bogus": 1})
    assert res.status == 400 and "bogus" in res.body["error"]["message"]
    mres = await srv.mcp("get_context_remaining", {"bogus": 1})
    assert mres.is_error and "bogus" in mres.text


async def test_unknown_tool_is_404(tool_server):
    srv = await tool_server()
    res = await srv.rest("no_such_tool", {})
    assert res.status == 404 and res.body["error"]["code"] == "unknown_tool"


async def test_auth_host_origin(tool_server):
    srv = await tool_server()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{srv.url}/healthz") as r:
            assert r.status == 401
        async with http.get(f"{srv.url}/healthz", headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        async with http.get(f"{srv.url}/healthz", headers=srv.headers()) as r:
            assert r.status == 200
        async with http.get(f"{srv.url}/v1/tools", headers={**srv.headers(), "Host": "evil.example"}) as r:
            assert r.status == 403
        async with http.get(f"{srv.url}/v1/tools", headers={**srv.headers(), "Host": f"127.0.0.1:{srv.port + 1}"}) as r:
            assert r.status == 403
        async with http.get(f"{srv.url}/v1/tools", headers={**srv.headers(), "Origin": "https://evil.example"}) as r:
            assert r.status == 403
        async with http.post(f"{srv.url}/mcp", headers={"Host": "rebind.evil.example"}, json={}) as r:
            assert r.status == 403
        async with http.post(f"{srv.url}/mcp", json={}) as r:
            assert r.status == 401


async def test_disabled_capability_hides_tool(tool_server):
    srv = await tool_server({"context.enabled": False})
    assert "get_context_remaining" not in {t["name"] for t in await srv.list_rest()}
    res = await srv.rest("get_context_remaining", {})
    assert res.status == 404
