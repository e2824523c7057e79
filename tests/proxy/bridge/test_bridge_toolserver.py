"""The tool server's bridge endpoint through the proxy's own client (proxy/toolclient.py) (issue 12)."""

from __future__ import annotations

import pytest

from proxy.toolclient import CallerUpstream, ToolCall, ToolClient, ToolServerUnreachable
from tools_server.registry import CallContext, Tool, ToolResult

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"


async def test_specs_list_the_registry_with_mode_and_availability(tool_server):
    srv = await tool_server({"apply_patch.enabled": True})
    client = ToolClient(srv.url, srv.token)
    try:
        tools = {t.name: t for t in await client.specs()}
    finally:
        await client.close()
    ctx = tools["get_context_remaining"]
    assert ctx.available and ctx.parallel and ctx.capability == "context"
    assert ctx.function["name"] == "get_context_remaining" and ctx.function["type"] == "function"
    patch = tools["apply_patch"]
    assert patch.available and not patch.parallel
    assert patch.custom is not None and patch.custom["format"]["syntax"] == "lark"
    assert not tools["exec_command"].available and "shell.enabled" in tools["exec_command"].reason
    write = tools["notes_write_file"]
    assert not write.parallel  # notes writes run one at a time


async def test_calls_answer_errors_as_outputs(tool_server):
    srv = await tool_server({"apply_patch.enabled": True})
    client = ToolClient(srv.url, srv.token)
    try:
        no_task = await client.call(ToolCall("get_context_remaining", "function", "{}", call_id="c1"))
        assert no_task.is_error and no_task.error == "no_task"  # the tool's own error, as the call's output
        bad_json = await client.call(ToolCall("get_context_remaining", "function", "{not json"))
        assert bad_json.is_error and "not valid JSON" in bad_json.output
        unknown_field = await client.call(ToolCall("get_context_remaining", "function", '{"x": 1}'))
        assert unknown_field.is_error and "unknown field 'x'" in unknown_field.output
        unknown_tool = await client.call(ToolCall("no_such_tool", "function", "{}"))
        assert unknown_tool.is_error and unknown_tool.error == "unknown_tool"
        patched = await client.call(ToolCall("apply_patch", "custom", PATCH, call_id="p1"))
        assert not patched.is_error, patched.output
        assert (srv.services.workspace / "hello.txt").read_text() == "hi\n"
    finally:
        await client.close()


async def test_unreachable_and_wrong_token(tool_server):
    srv = await tool_server()
    wrong = ToolClient(srv.url, "not-the-token")
    with pytest.raises(ToolServerUnreachable):
        await wrong.specs()
    await wrong.close()
    gone = ToolClient("http://127.0.0.1:9", srv.token)
    with pytest.raises(ToolServerUnreachable):
        await gone.call(ToolCall("get_context_remaining", "function", "{}"))
    await gone.close()


async def test_caller_credentials_reach_the_call_context_only_when_allowed(tool_server):
    srv = await tool_server()
    seen: list[CallContext] = []

    async def spy(_args, ctx: CallContext) -> ToolResult:
        seen.append(ctx)
        return ToolResult(text="ok")

    from tools_server.app import SERVICE_KEY
    from tools_server.context import GetContextRemainingArgs

    service = srv.app[SERVICE_KEY]
    service.registry._all["ctp_spy"] = Tool("ctp_spy", "spy", "context", "context", GetContextRemainingArgs, spy)
    client = ToolClient(srv.url, srv.token)
    try:
        up = CallerUpstream("https://api.openai.com/v1", "api", True, True, {"authorization": "Bearer sk-x"})
        await client.call(ToolCall("ctp_spy", "function", "{}", task="t", agent="/root", session="s", upstream=up))
        denied = CallerUpstream("http://gw.example/v1", None, False, False, {"authorization": "Bearer sk-x"})
        await client.call(ToolCall("ctp_spy", "function", "{}", upstream=denied))
    finally:
        await client.close()
    assert seen[0].transport == "bridge" and seen[0].task == "t" and seen[0].session == "s"
    assert seen[0].upstream is not None and seen[0].upstream.headers == {"authorization": "Bearer sk-x"}
    assert "sk-x" not in repr(seen[0])
    assert seen[1].upstream is not None and seen[1].upstream.headers == {}
