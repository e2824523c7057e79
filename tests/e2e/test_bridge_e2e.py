"""The tool bridge end to end: `ctproxy up --bridge …` between the `openai` SDK and the emulator (issue 12)."""

from __future__ import annotations

import json

import openai
import pytest

from tests.emulator import FunctionCall, Text

pytestmark = pytest.mark.timeout(120)


def client(proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-bridge", max_retries=0)


async def bridged(emulator, proxy_factory, families: str = "context,notes", extra: list[str] | None = None):
    return await proxy_factory(upstream=emulator.url, extra_args=["--bridge", families, *(extra or [])])


async def test_stream_one_bridged_round(emulator, proxy_factory):
    proxy = await bridged(emulator, proxy_factory)
    emulator.script(FunctionCall("get_context_remaining", {}, call_id="call_ctx1"), Text("all good", deltas=4))
    async with client(proxy).responses.stream(model="gpt-4.1", input="how much context is left?") as stream:
        events = [ev async for ev in stream]
        final = await stream.get_final_response()
    types = [e.type for e in events]
    assert types.count("response.created") == 1 and types.count("response.completed") == 1
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(set(seqs)), "sequence_number strictly increasing"
    assert [o.type for o in final.output] == ["mcp_call", "message"]
    call = final.output[0]
    assert call.server_label == "ctproxy" and call.name == "get_context_remaining"
    assert "context window" in (call.output or "")
    assert final.output_text == "all good"
    reqs = emulator.responses_requests
    assert len(reqs) == 2
    first, second = reqs[0].json, reqs[1].json
    names = [t.get("name") or t["type"] for t in first["tools"]]
    assert "get_context_remaining" in names and "notes_write_file" in names
    types2 = [i.get("type") for i in second["input"]]
    assert "function_call" in types2 and "function_call_output" in types2
    out = next(i for i in second["input"] if i.get("type") == "function_call_output")
    assert out["call_id"] == "call_ctx1"
    assert final.usage is not None and final.usage.input_tokens > 0


async def test_no_bridged_call_passes(emulator, proxy_factory):
    proxy = await bridged(emulator, proxy_factory)
    emulator.script(Text("plain"))
    resp = await client(proxy).responses.create(model="gpt-4.1", input="hi")
    assert resp.output_text == "plain"
    assert len(emulator.responses_requests) == 1
    assert any(t.get("name") == "get_context_remaining" for t in emulator.responses_requests[0].json["tools"])


async def test_non_streaming_merged(emulator, proxy_factory):
    proxy = await bridged(emulator, proxy_factory)
    emulator.script(FunctionCall("get_context_remaining", {}), Text("done"))
    resp = await client(proxy).responses.create(model="gpt-4.1", input="go", stream=False)
    assert [o.type for o in resp.output] == ["mcp_call", "message"]
    assert resp.output_text == "done"
    assert json.dumps(resp.to_dict())  # a consistent Response object
