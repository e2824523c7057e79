"""Tool discovery decides what a bridged request carries (issue 14): a deferred tool is held back, a
`find_tools` load made in one round shows in the next round's tools, and in the session's next request;
another session still does not carry it. Through `ctproxy up --bridge …` with the `openai` SDK."""

from __future__ import annotations

import openai
import pytest

from tests.emulator import FunctionCall, Text

pytestmark = pytest.mark.timeout(120)
IMAGE = "openai_generate_image"


def tool_names(req) -> list[str]:
    return [t.get("name") or t["type"] for t in req.json.get("tools") or []]


async def test_find_tools_load_shows_in_the_next_round_and_request(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=[
        "--bridge", "tool_discovery,image_generation,context", "--enable", "tool_discovery",
        "--enable", "image_generation"])
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-discovery", max_retries=0)
    emulator.script(FunctionCall("find_tools", {"load": [IMAGE]}, call_id="call_load"), Text("loaded"))
    async with c.responses.stream(model="gpt-4.1", input="load the image tool",
                                  prompt_cache_key="disc-a") as stream:
        final = await stream.get_final_response()
    assert final.output_text == "loaded"
    assert final.output[0].type == "mcp_call" and final.output[0].status == "completed"
    assert "Loaded" in (final.output[0].output or "")
    first, second = emulator.responses_requests
    assert "find_tools" in tool_names(first) and "get_context_remaining" in tool_names(first)
    assert IMAGE not in tool_names(first)  # deferred until loaded
    assert IMAGE in tool_names(second)  # the load shows in the next round
    assert set(tool_names(first)) < set(tool_names(second))

    emulator.script(Text("again"))
    await c.responses.create(model="gpt-4.1", input="next", prompt_cache_key="disc-a")
    assert IMAGE in tool_names(emulator.responses_requests[2])  # the session's next request carries it

    emulator.script(Text("other"))
    await c.responses.create(model="gpt-4.1", input="hi", prompt_cache_key="disc-b")
    await c.close()
    third = tool_names(emulator.responses_requests[3])
    assert "find_tools" in third and IMAGE not in third  # another session loaded nothing


async def test_discovery_off_offers_every_bridged_tool_but_find_tools(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=[
        "--bridge", "tool_discovery,image_generation", "--enable", "image_generation"])
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-discovery", max_retries=0)
    emulator.script(Text("plain"))
    await c.responses.create(model="gpt-4.1", input="hi")
    await c.close()
    names = tool_names(emulator.responses_requests[0])
    assert IMAGE in names and "find_tools" not in names
