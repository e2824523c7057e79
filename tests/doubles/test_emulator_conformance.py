"""The emulator's gaps that made the outside conformance suites fail even directly (issue 44): penalties and a
function tool's `strict` in every Response, a function call to `tool_choice: "required"`, a reasoning summary when
one is asked for, a failed WebSocket continuation that evicts the response it continued from, and
`--validate-requests` that follows the description's request shapes (a function tool without `strict`, an image
without `detail`) and takes the new fields (Programmatic Tool Calling items, prompt_cache_options, …)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.emulator import Emulator
from tests.openapi_schema import spec_available, validate

pytestmark = pytest.mark.timeout(120)
NEEDS_SPEC = pytest.mark.skipif(not spec_available(), reason="the OpenAPI description (shared/compat) is not here")
WEATHER = {"type": "function", "name": "get_weather", "description": "weather",
           "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                          "required": ["location"]}}
PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
         "AAAABJRU5ErkJggg==")


async def _post(emu: Emulator, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.post(emu.url + "/v1/responses", json=body,
                                                          headers={"Authorization": "Bearer sk-x"}) as r:
        return r.status, await r.json()


@NEEDS_SPEC
async def test_valid_requests_are_accepted_and_answered_as_the_api_would():
    async with Emulator(validate_requests=True) as emu:
        status, body = await _post(emu, {"model": "gpt-5", "input": "weather in Paris?", "tools": [WEATHER],
                                         "tool_choice": "required"})
        assert status == 200, body
        validate("Response", body)  # presence/frequency_penalty, a function tool with `strict`
        assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
        assert body["tools"] == [{**WEATHER, "strict": True}]
        assert [i["type"] for i in body["output"]] == ["function_call"]  # required: never a text answer
        assert orjson.loads(body["output"][0]["arguments"]) == {"location": "emulator"}

        image = {"role": "user", "content": [{"type": "input_text", "text": "what is it?"},
                                             {"type": "input_image", "image_url": PIXEL}]}
        status, body = await _post(emu, {"model": "gpt-5", "input": [image], "reasoning": {"summary": "auto"}})
        assert status == 200, body
        assert body["output"][0]["type"] == "reasoning" and body["output"][0]["summary"][0]["text"]
        assert body["reasoning"]["summary"] == "auto"


@NEEDS_SPEC
async def test_new_request_fields_and_programmatic_items_are_accepted():
    new = {"model": "gpt-5", "prompt_cache_options": {"mode": "explicit", "ttl": "30m"},
           "background_options": {"completion_window": "soonest"},
           "moderation": {"model": "omni-moderation-latest"}, "access_programs": {"cyber": "standard"},
           "image": {"context_compression": "auto"},
           "tools": [{**WEATHER, "allowed_callers": ["direct", "programmatic"]}],
           "input": [{"role": "user", "content": "go"},
                     {"type": "program", "id": "pg_1", "call_id": "call_p", "code": "text(1)", "fingerprint": "f"},
                     {"type": "function_call", "call_id": "call_f", "name": "get_weather", "arguments": "{}",
                      "caller": {"type": "program", "caller_id": "call_p"}},
                     {"type": "function_call_output", "call_id": "call_f", "output": "sunny",
                      "caller": {"type": "program", "caller_id": "call_p"}},
                     {"type": "program_output", "id": "po_1", "call_id": "call_p", "result": "1",
                      "status": "completed"}]}
    async with Emulator(validate_requests=True) as emu:
        status, body = await _post(emu, new)
        assert status == 200, body
        assert body["access_programs"] == {"cyber": "standard"}  # the API echoes it
        assert emu.responses_requests[-1].json == new


async def test_a_failed_websocket_continuation_evicts_the_response_it_continued_from():
    async with Emulator() as emu, aiohttp.ClientSession() as http, http.ws_connect(
            emu.url.replace("http", "ws") + "/v1/responses", headers={"Authorization": "Bearer sk-x"}) as ws:
        async def create(**body) -> list[dict]:
            await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5", "store": False,
                                            **body}).decode())
            events = []
            while True:
                ev = orjson.loads((await ws.receive()).data)
                events.append(ev)
                if ev["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                    return events
        first = await create(input="one")
        rid = first[-1]["response"]["id"]
        bad = await create(previous_response_id=rid, input=[{"type": "function_call_output",
                                                             "call_id": "call_nowhere", "output": "x"}])
        assert bad[-1]["type"] == "error"
        again = await create(previous_response_id=rid, input="two")
        assert again[-1]["type"] == "error"
        assert again[-1]["error"]["code"] == "previous_response_not_found"
