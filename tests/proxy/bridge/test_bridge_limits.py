"""The bridge's limits and faults (issue 12): bad arguments are the call's output, the round limit ends the
turn with a message to the model, an upstream failure in a later round ends the agent's response with
that error, and an agent hanging up stops the running call and sends no further round."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from tests.emulator import FunctionCall, Response, Text, server_error_500
from tests.support.procs import processes_mentioning

pytestmark = pytest.mark.timeout(180)


def client(proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-bridge", max_retries=0)


async def sse_events(url: str, body: dict, stop_at: str | None = None) -> list[dict]:
    """The agent's view of a streamed answer, event by event (closing the connection at `stop_at`)."""
    events = []
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/responses", json=body,
                                                          headers={"Authorization": "Bearer sk-x"}) as resp:
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                data = [line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")]
                if data:
                    events.append(json.loads(b"".join(data)))
                    if stop_at and events[-1]["type"] == stop_at:
                        return events
    return events


async def test_bad_arguments_are_the_calls_output(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    emulator.script(Response([FunctionCall("get_context_remaining", "{not json", call_id="c_bad1"),
                              FunctionCall("get_context_remaining", {"extra": 1}, call_id="c_bad2")]),
                    Text("I see the errors"))
    resp = await client(proxy).responses.create(model="gpt-4.1", input="go")
    assert [o.type for o in resp.output] == ["mcp_call", "mcp_call", "message"]
    assert all(o.status == "failed" and o.error for o in resp.output[:2])
    outputs = {i["call_id"]: i["output"] for i in emulator.responses_requests[1].json["input"]
               if i.get("type") == "function_call_output"}
    assert "not valid JSON" in outputs["c_bad1"]
    assert "unknown field 'extra'" in outputs["c_bad2"]
    assert resp.output_text == "I see the errors"


async def test_round_limit(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    emulator.script(*[FunctionCall("get_context_remaining", {}, call_id=f"c_l{i}") for i in range(9)],
                    Text("stopping here"))
    async with client(proxy).responses.stream(model="gpt-4.1", input="loop") as stream:
        final = await stream.get_final_response()
    reqs = emulator.responses_requests
    assert len(reqs) == 10  # 8 rounds run, the 9th round's call answered with the limit, one last round
    assert reqs[9].json["tool_choice"] == "none"
    last_out = [i for i in reqs[9].json["input"] if i.get("type") == "function_call_output"][-1]
    assert last_out["call_id"] == "c_l8" and "bridge.max_rounds" in last_out["output"]
    calls = [o for o in final.output if o.type == "mcp_call"]
    assert len(calls) == 9 and all(c.status == "completed" for c in calls[:8]) and calls[8].status == "failed"
    # the error in the API's shape (MCPToolCallError), which the SDK parses into its own model
    assert calls[8].error.type == "mcp_tool_execution_error" and "bridge.max_rounds" in str(calls[8].error.content)
    assert final.output_text == "stopping here"


async def test_upstream_failure_in_a_later_round(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    emulator.script(FunctionCall("get_context_remaining", {}), server_error_500())
    events = await sse_events(proxy.url, {"model": "gpt-4.1", "input": "x", "stream": True})
    types = [e["type"] for e in events]
    assert types.count("response.created") == 1
    assert types[-1] == "error" and events[-1]["code"] == "server_error"
    assert "response.completed" not in types
    emulator.script(FunctionCall("get_context_remaining", {}), server_error_500())
    with pytest.raises(openai.InternalServerError):
        await client(proxy).responses.create(model="gpt-4.1", input="x")


async def test_hang_up_stops_the_running_call(emulator, proxy_factory, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "shell", "--enable", "shell",
                                                                  "--workspace", str(ws)])
    marker = "ctp-bridge-hangup-4242"
    emulator.script(FunctionCall("exec_command", {"cmd": f"sleep 60; echo {marker}", "yield_time_ms": 30000}),
                    Text("never sent"))
    async with aiohttp.ClientSession() as http, http.post(
            proxy.url + "/v1/responses", json={"model": "gpt-4.1", "input": "run it", "stream": True},
            headers={"Authorization": "Bearer sk-x"}) as resp:
        seen = b""
        async for chunk in resp.content.iter_any():
            seen += chunk
            if b"response.mcp_call.in_progress" in seen:
                break
        for _ in range(300):  # the command started; the agent still listens
            if processes_mentioning(marker):
                break
            await asyncio.sleep(0.05)
        assert processes_mentioning(marker), "the bridged command did not start"
    # the agent hung up: the command is stopped
    for _ in range(300):
        if not processes_mentioning(marker):
            break
        await asyncio.sleep(0.1)
    assert not processes_mentioning(marker)
    await asyncio.sleep(0.5)
    assert len(emulator.responses_requests) == 1  # no further round
