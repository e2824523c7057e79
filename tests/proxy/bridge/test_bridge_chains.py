"""The next request after a bridged turn is valid upstream whatever the agent does with the executed calls:
resent, dropped, or a `previous_response_id` chain; and a mixed round (issue 12). The emulator enforces the
real API's input rules (a call without its output, a reasoning item without its following item, an unknown
previous_response_id: each a 400)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.emulator import FunctionCall, Reasoning, Response, Text

pytestmark = [pytest.mark.validate_requests, pytest.mark.timeout(120)]



WEATHER = {"type": "function", "name": "get_weather", "description": "weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}, "strict": True}


def client(proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-bridge", max_retries=0)


@pytest.fixture
async def proxy(emulator, proxy_factory):
    return await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context,notes"])


def as_input(items: list[Any]) -> list[dict[str, Any]]:
    return [i.model_dump(exclude_none=True) for i in items]


async def test_previous_response_id_chain(emulator, proxy):
    emulator.script(FunctionCall("get_context_remaining", {}, call_id="call_p1"), Text("first"), Text("second"))
    c = client(proxy)
    async with c.responses.stream(model="gpt-4.1", input="check the context") as stream:
        first = await stream.get_final_response()
    assert [o.type for o in first.output] == ["mcp_call", "message"]
    nxt = await c.responses.create(model="gpt-4.1", input="and now?", previous_response_id=first.id)
    assert nxt.output_text == "second"
    reqs = emulator.responses_requests
    assert len(reqs) == 3
    ids = list(emulator.stored)
    assert ids[0] == first.id  # the merged response keeps the first round's id (the SDK insists)
    assert reqs[2].json["previous_response_id"] == ids[1]  # mapped to the upstream's last response of the turn


async def test_stateless_chain_with_encrypted_reasoning_resent(emulator, proxy):
    emulator.script(Response([Reasoning(summary="plan"), FunctionCall("get_context_remaining", {}, call_id="c_r1")]),
                    Response([Reasoning(summary="answer"), Text("first")]), Text("second"))
    c = client(proxy)
    user1 = {"role": "user", "content": "check"}
    first = await c.responses.create(model="gpt-5", input=[user1], store=False,
                                     include=["reasoning.encrypted_content"])
    assert [o.type for o in first.output] == ["reasoning", "mcp_call", "reasoning", "message"]
    resend = [user1, *as_input(first.output), {"role": "user", "content": "again"}]
    nxt = await c.responses.create(model="gpt-5", input=resend, store=False, include=["reasoning.encrypted_content"])
    assert nxt.output_text == "second"
    sent = emulator.responses_requests[2].json["input"]
    types = [i.get("type", "message") for i in sent]
    assert "mcp_call" not in types
    at = types.index("function_call")
    assert types[at - 1] == "reasoning" and types[at + 1] == "function_call_output"
    assert sent[at]["call_id"] == sent[at + 1]["call_id"] == "c_r1"


async def test_stateless_agent_that_drops_unknown_items(emulator, proxy):
    emulator.script(Response([Reasoning(summary="plan"), FunctionCall("get_context_remaining", {}, call_id="c_d1")]),
                    Text("first"), Text("second"))
    c = client(proxy)
    user1 = {"role": "user", "content": "check"}
    first = await c.responses.create(model="gpt-5", input=[user1], store=False,
                                     include=["reasoning.encrypted_content"])
    kept = [o for o in first.output if o.type != "mcp_call"]  # an agent that knows no mcp_call
    nxt = await c.responses.create(model="gpt-5", input=[user1, *as_input(kept), {"role": "user", "content": "2"}],
                                   store=False, include=["reasoning.encrypted_content"])
    assert nxt.output_text == "second"
    types = [i.get("type", "message") for i in emulator.responses_requests[2].json["input"]]
    at = types.index("reasoning")
    assert types[at + 1: at + 3] == ["function_call", "function_call_output"]


async def test_mixed_round_then_previous_response_id(emulator, proxy):
    emulator.script(Response([FunctionCall("get_context_remaining", {}, call_id="c_b1"),
                              FunctionCall("get_weather", {"city": "Paris"}, call_id="c_a1")]),
                    Text("sunny, and context is fine"))
    c = client(proxy)
    async with c.responses.stream(model="gpt-4.1", input="weather?", tools=[WEATHER]) as stream:
        first = await stream.get_final_response()
    assert [o.type for o in first.output] == ["mcp_call", "function_call"]
    assert first.output[0].output and first.output[1].name == "get_weather"
    assert len(emulator.responses_requests) == 1  # the agent's own call ends the turn
    nxt = await c.responses.create(model="gpt-4.1", previous_response_id=first.id, tools=[WEATHER],
                                   input=[{"type": "function_call_output", "call_id": "c_a1", "output": "sunny"}])
    assert nxt.output_text.startswith("sunny")
    sent = emulator.responses_requests[1].json["input"]
    assert {i["call_id"] for i in sent if i.get("type") == "function_call_output"} == {"c_a1", "c_b1"}


async def test_mixed_round_stateless_resent(emulator, proxy):
    emulator.script(Response([FunctionCall("get_context_remaining", {}, call_id="c_b2"),
                              FunctionCall("get_weather", {"city": "Oslo"}, call_id="c_a2")]), Text("cold"))
    c = client(proxy)
    user = {"role": "user", "content": "weather?"}
    first = await c.responses.create(model="gpt-4.1", input=[user], tools=[WEATHER], store=False)
    resend = [user, *as_input(first.output), {"type": "function_call_output", "call_id": "c_a2", "output": "cold"}]
    nxt = await c.responses.create(model="gpt-4.1", input=resend, tools=[WEATHER], store=False)
    assert nxt.output_text == "cold"


def spliced_pairs(request) -> list[tuple[str, str]]:
    """(type, call_id) of the calls and outputs in a request's input, in order."""
    return [(i["type"], i["call_id"]) for i in request.json["input"]
            if isinstance(i, dict) and i.get("type") in ("function_call", "function_call_output")]


@pytest.mark.parametrize("with_ids", [True, False], ids=["messages-with-ids", "messages-without-ids"])
async def test_an_agent_that_resends_only_its_messages_gets_the_bridged_call_spliced_back(emulator, proxy, with_ids):
    """Issue 31: after a bridged turn, an agent that resends only `message` items (no reasoning, no mcp_call)
    still sends the model what the tool returned: the call and its output go back at their place, before
    the message that followed them; on a fresh conversation and on a branch of it."""
    emulator.script(Response([Reasoning(summary="plan"), FunctionCall("get_context_remaining", {}, call_id="c_m1")]),
                    Response([Reasoning(summary="answer"), Text("first")]), Text("second"), Text("branch"))
    c = client(proxy)
    user1 = {"role": "user", "content": "check"}
    first = await c.responses.create(model="gpt-5", input=[user1], store=False,
                                     include=["reasoning.encrypted_content"])
    messages = [o for o in first.output if o.type == "message"]
    kept = as_input(messages) if with_ids else [{"role": "assistant", "content": first.output_text}]
    nxt = await c.responses.create(model="gpt-5", input=[user1, *kept, {"role": "user", "content": "2"}],
                                   store=False)
    assert nxt.output_text == "second"
    # a branch: the same history up to the bridged turn, another question
    other = await c.responses.create(model="gpt-5", input=[user1, *kept, {"role": "user", "content": "2b"}],
                                     store=False)
    assert other.output_text == "branch"
    for req in emulator.responses_requests[2:]:
        sent = req.json["input"]
        assert spliced_pairs(req) == [("function_call", "c_m1"), ("function_call_output", "c_m1")]
        types = [i.get("type", "message") for i in sent]
        at = types.index("function_call")
        assert sent[at + 2].get("role") == "assistant"  # at their place: before the message that followed them
        assert "get_context_remaining" in sent[at]["name"] and sent[at + 1]["output"]
