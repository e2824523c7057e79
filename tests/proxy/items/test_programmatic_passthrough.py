"""Programmatic Tool Calling and the new fields pass through ctproxy unchanged (issue 44): `program` and
`program_output` items keep their fields both ways, a tool output's `caller` stays, the new request fields reach the
upstream and `Response.input_transformations` reaches the client; a bridged tool's output echoes its call's
`caller`, and ctproxy's bridged tools say `allowed_callers: ["direct"]`."""

from __future__ import annotations

import openai
import orjson
import pytest

from proxy.items.bridged import output_item
from tests.emulator import Emulator, Item, Raw, Response, Text
from tests.openapi_schema import spec_available

pytestmark = pytest.mark.timeout(180)
CALLER = {"type": "program", "caller_id": "call_prog"}
PROGRAM = {"type": "program", "id": "pg_1", "call_id": "call_prog", "code": "text(await tools.f({}))",
           "fingerprint": "fp_round_trip_me"}
PROGRAM_OUTPUT = {"type": "program_output", "id": "po_1", "call_id": "call_prog", "result": "42",
                  "status": "completed"}
FN = {"type": "function", "name": "f", "strict": True, "allowed_callers": ["direct", "programmatic"],
      "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False}}
NEW_FIELDS = {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"},
              "background_options": {"completion_window": "soonest"},
              "moderation": {"model": "omni-moderation-latest"}, "access_programs": {"cyber": "standard"},
              "image": {"context_compression": "auto"}}


def test_an_output_carries_its_calls_caller():
    assert output_item("function", "c1", "ok", caller=CALLER) == {
        "type": "function_call_output", "call_id": "c1", "output": "ok", "caller": CALLER}
    assert "caller" not in output_item("function", "c1", "ok")


@pytest.fixture
async def emu():
    async with Emulator(validate_requests=spec_available()) as emulator:
        yield emulator


def _client(proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-ptc", max_retries=0)


async def test_program_items_new_fields_and_input_transformations_pass_through(emu, proxy_factory):
    proxy = await proxy_factory(upstream=emu.url)
    sent_input = [
        {"role": "user", "content": "run the program"}, PROGRAM,
        {"type": "function_call", "call_id": "call_f", "name": "f", "arguments": "{}", "caller": CALLER},
        {"type": "function_call_output", "call_id": "call_f", "output": "42", "caller": CALLER},
        PROGRAM_OUTPUT,
    ]
    emu.script(Response([Item(PROGRAM), Item(PROGRAM_OUTPUT), Text("done")]))
    c = _client(proxy)
    async with c.responses.stream(model="gpt-5", input=sent_input, tools=[FN], extra_body=NEW_FIELDS) as s:
        done = [ev.item.model_dump(exclude_none=True) for ev in [e async for e in s]
                if ev.type == "response.output_item.done"]
    got = emu.responses_requests[-1].json
    assert got["input"][:len(sent_input)] == sent_input  # every field of the client's items, as sent
    assert {k: got[k] for k in NEW_FIELDS} == NEW_FIELDS
    assert got["tools"][0] == FN
    assert done[0] == PROGRAM and done[1] == PROGRAM_OUTPUT  # the fingerprint comes back to round-trip

    transformations = [{"type": "reasoning", "id": "rs_1", "action": "removed", "reason": "prefix_mismatch"}]
    body = {"id": "resp_it", "object": "response", "status": "completed", "model": "gpt-5", "output": [],
            "tools": [], "tool_choice": "auto", "input_transformations": transformations,
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}
    emu.script(Raw(headers={"content-type": "application/json"}, body=orjson.dumps(body)))
    resp = await c.responses.with_raw_response.create(model="gpt-5", input="hi")
    assert orjson.loads(resp.content)["input_transformations"] == transformations
    await c.close()


async def test_a_bridged_output_echoes_its_calls_caller_and_the_specs_say_direct(emu, proxy_factory):
    proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "context"])
    call = {"type": "function_call", "id": "fc_b1", "call_id": "call_b1", "name": "get_context_remaining",
            "arguments": "{}", "status": "completed", "caller": CALLER}
    emu.script(Response([Item(call)]), Text("bridged done"))
    c = _client(proxy)
    final = await c.responses.create(model="gpt-5", input="how much room?")
    await c.close()
    assert final.output_text == "bridged done"
    first, second = emu.responses_requests[-2:]
    bridged = [t for t in first.json["tools"] if t.get("name") == "get_context_remaining"]
    assert bridged and bridged[0]["allowed_callers"] == ["direct"]
    outputs = [i for i in second.json["input"] if i.get("type") == "function_call_output"]
    assert outputs and outputs[-1]["call_id"] == "call_b1" and outputs[-1]["caller"] == CALLER
