"""The emulator refuses what the real API refuses (tests/emulator/validation.py), and plays JSON scripts.

Every refusal is checked through the `openai` SDK (status, class, the exact `ErrorResponse` body) and the
matching valid input is checked to pass, so each rule is shown to be a rule and not a blanket 400.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.emulator import (
    CustomToolCall,
    Emulator,
    FunctionCall,
    Reasoning,
    Response,
    ScriptError,
    Text,
    load_script,
    parse_reply,
)

ROOT = Path(__file__).resolve().parents[2]
BLOB = "gAAAAABscriptedreasoningblob=="


@pytest.fixture
async def emu():
    async with Emulator() as e:
        yield e


@pytest.fixture
def client(emu: Emulator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=emu.url + "/v1", api_key="sk-test", max_retries=0)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def output_of(call_id: str, text: str = "ok", kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": text}


async def refused(client: openai.AsyncOpenAI, **kwargs: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        await client.responses.create(model="gpt-5", **kwargs)
    return info.value


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    assert isinstance(exc.body, dict)
    return exc.body  # the SDK hands over the `error` object


async def items_after(client: openai.AsyncOpenAI, emu: Emulator, reply: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """The output of one scripted turn, as the client would resend it."""
    emu.script(reply)
    resp = await client.responses.create(model="gpt-5", input=[user("go")], **kwargs)
    return [item.model_dump(exclude_none=True) for item in resp.output]


# ---- tool calls and their outputs --------------------------------------------------------------


async def test_function_call_without_output_is_refused(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    out = await items_after(client, emu, FunctionCall("get_weather", {"city": "Paris"}, call_id="call_w1"),
                            store=False)
    exc = await refused(client, input=[user("go"), *out, user("and?")], store=False)
    assert isinstance(exc, openai.BadRequestError)
    assert error_of(exc) == {"message": "No tool output found for function call call_w1.",
                             "type": "invalid_request_error", "param": "input", "code": None}
    ok = await client.responses.create(model="gpt-5", input=[user("go"), *out, output_of("call_w1")], store=False)
    assert ok.status == "completed"


async def test_custom_tool_call_without_output_is_refused(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    out = await items_after(client, emu, CustomToolCall("apply_patch", "*** Begin Patch\n*** End Patch",
                                                        call_id="call_p1"), store=False)
    exc = await refused(client, input=[user("go"), *out], store=False)
    assert error_of(exc)["message"] == "No tool output found for custom tool call call_p1."
    # a function_call_output does not answer a custom tool call
    exc = await refused(client, input=[user("go"), *out, output_of("call_p1")], store=False)
    assert error_of(exc)["message"] == "No tool call found for function call output with call_id call_p1."
    ok = await client.responses.create(
        model="gpt-5", input=[user("go"), *out, output_of("call_p1", kind="custom_tool_call_output")], store=False)
    assert ok.status == "completed"


async def test_output_without_its_call_is_refused(client: openai.AsyncOpenAI) -> None:
    exc = await refused(client, input=[user("go"), output_of("call_nowhere")])
    assert isinstance(exc, openai.BadRequestError)
    assert error_of(exc) == {"message": "No tool call found for function call output with call_id call_nowhere.",
                             "type": "invalid_request_error", "param": "input", "code": None}


# ---- previous_response_id chains and `store` ----------------------------------------------------


async def test_chain_resolves_calls_against_the_stored_response(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    emu.script(FunctionCall("get_weather", {"city": "Paris"}, call_id="call_c1"))
    first = await client.responses.create(model="gpt-5", input="weather?")
    # the call is in the stored chain: a next turn that does not answer it is refused ...
    exc = await refused(client, previous_response_id=first.id, input=[user("anything else?")])
    assert error_of(exc)["message"] == "No tool output found for function call call_c1."
    # ... and the output alone, with the chain, is valid (its call is in the stored response)
    second = await client.responses.create(model="gpt-5", previous_response_id=first.id,
                                           input=[output_of("call_c1", "18C")])
    third = await client.responses.create(model="gpt-5", previous_response_id=second.id, input=[user("thanks")])
    assert third.previous_response_id == second.id
    # without the chain the same output has no call
    exc = await refused(client, input=[output_of("call_c1", "18C")])
    assert error_of(exc)["message"] == "No tool call found for function call output with call_id call_c1."


async def test_unknown_and_unstored_previous_response_ids(client: openai.AsyncOpenAI) -> None:
    exc = await refused(client, previous_response_id="resp_doesnotexist", input="hi")
    assert isinstance(exc, openai.BadRequestError)
    assert error_of(exc) == {"message": "Previous response with id 'resp_doesnotexist' not found.",
                             "type": "invalid_request_error", "param": "previous_response_id",
                             "code": "previous_response_not_found"}
    stateless = await client.responses.create(model="gpt-5", input="hi", store=False)
    exc = await refused(client, previous_response_id=stateless.id, input="again")
    assert error_of(exc)["code"] == "previous_response_not_found"
    stored = await client.responses.create(model="gpt-5", input="hi")
    assert (await client.responses.create(model="gpt-5", previous_response_id=stored.id, input="again")).id


# ---- reasoning items ----------------------------------------------------------------------------


async def test_reasoning_needs_its_following_item(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    out = await items_after(client, emu, Response([Reasoning(summary="plan", encrypted_content=BLOB),
                                                   FunctionCall("lookup", {"q": "x"}, call_id="call_r1")]),
                            store=False)
    reasoning, call = out
    assert reasoning["encrypted_content"] == BLOB
    # the call (and its output) dropped: the reasoning item is left without what it preceded
    exc = await refused(client, input=[user("go"), reasoning, user("next")], store=False)
    assert error_of(exc) == {
        "message": f"Item '{reasoning['id']}' of type 'reasoning' was provided without its required following item.",
        "type": "invalid_request_error", "param": "input", "code": None}
    exc = await refused(client, input=[user("go"), reasoning], store=False)
    assert "without its required following item" in error_of(exc)["message"]
    # another model item in its place is not the one it preceded either
    emu.script(FunctionCall("other", call_id="call_r2"))
    other = (await client.responses.create(model="gpt-5", input="x", store=False)).output[0].model_dump()
    exc = await refused(client, input=[user("go"), reasoning, other, output_of("call_r2")], store=False)
    assert "without its required following item" in error_of(exc)["message"]
    # kept next to its call: valid (the stateless chain with encrypted reasoning)
    ok = await client.responses.create(model="gpt-5", input=[user("go"), reasoning, call, output_of("call_r1")],
                                       store=False)
    assert ok.status == "completed"


async def test_reasoning_by_id_only_must_be_stored(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    out = await items_after(client, emu, Response([Reasoning(summary="s"), Text("a")]), store=False)
    bare = {"type": "reasoning", "id": out[0]["id"], "summary": []}  # no encrypted_content
    exc = await refused(client, input=[user("go"), bare, out[1], user("more")], store=False)
    assert isinstance(exc, openai.NotFoundError)
    assert error_of(exc) == {
        "message": f"Item with id '{out[0]['id']}' not found. Items are not persisted when `store` is set to "
                   "false. Try again with `store` set to true, or remove this item from your input.",
        "type": "invalid_request_error", "param": "input", "code": None}
    kept = await items_after(client, emu, Response([Reasoning(summary="s"), Text("a")]))  # stored
    bare = {"type": "reasoning", "id": kept[0]["id"], "summary": []}
    ok = await client.responses.create(model="gpt-5", input=[user("go"), bare, kept[1], user("more")])
    assert ok.status == "completed"


async def test_item_reference_resolves_to_the_stored_item(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    out = await items_after(client, emu, FunctionCall("lookup", call_id="call_ref"))
    ref = {"type": "item_reference", "id": out[0]["id"]}
    exc = await refused(client, input=[user("go"), ref])  # the referenced call needs its output too
    assert error_of(exc)["message"] == "No tool output found for function call call_ref."
    ok = await client.responses.create(model="gpt-5", input=[user("go"), ref, output_of("call_ref")])
    assert ok.status == "completed"
    exc = await refused(client, input=[{"type": "item_reference", "id": "fc_unknown"}], store=False)
    assert isinstance(exc, openai.NotFoundError) and "fc_unknown" in error_of(exc)["message"]


async def test_opt_out_skips_the_input_rules(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    emu.check_input_items = False
    resp = await client.responses.create(model="gpt-5", input=[user("go"), output_of("call_x")])
    assert resp.status == "completed"


# ---- scripts ------------------------------------------------------------------------------------

SCRIPT = {
    "responses": [
        {"type": "response", "items": [
            {"type": "reasoning", "summary": "plan", "encrypted_content": BLOB},
            {"type": "function_call", "name": "notes_write_file", "call_id": "call_s1",
             "arguments": {"path": "plan.md", "text": "step 1"}},
        ], "usage": {"input_tokens": 1234}},
        {"type": "custom_tool_call", "name": "apply_patch", "call_id": "call_s2", "input": "*** Begin Patch\n"},
        {"type": "text", "text": "all done", "deltas": 4, "delays": {"0": 0.01}},
        {"type": "context_length_exceeded_400"},
    ],
    "default": {"type": "text", "text": "script over"},
}


async def test_json_script_drives_the_turns(tmp_path: Path, client: openai.AsyncOpenAI, emu: Emulator) -> None:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(SCRIPT))
    emu.load_script(path)
    first = await client.responses.create(model="gpt-5", input=[user("go")], store=False)
    reasoning, call = (i.model_dump(exclude_none=True) for i in first.output)
    assert reasoning["encrypted_content"] == BLOB and call["call_id"] == "call_s1"
    assert json.loads(call["arguments"]) == {"path": "plan.md", "text": "step 1"}
    assert first.usage is not None and first.usage.input_tokens == 1234
    history = [user("go"), reasoning, call, output_of("call_s1")]
    async with client.responses.stream(model="gpt-5", input=history, store=False) as stream:
        second = await stream.get_final_response()
    patch = second.output[0].model_dump(exclude_none=True)
    assert patch["type"] == "custom_tool_call" and patch["input"] == "*** Begin Patch\n"
    history += [patch, output_of("call_s2", kind="custom_tool_call_output")]
    third = await client.responses.create(model="gpt-5", input=history, store=False)
    assert third.output_text == "all done"
    exc = await refused(client, input="x")
    assert error_of(exc)["code"] == "context_length_exceeded"
    assert (await client.responses.create(model="gpt-5", input="x")).output_text == "script over"


@pytest.mark.parametrize(("data", "says"), [
    ([{"type": "txt", "text": "a"}], "script.responses[0]: unknown type 'txt'"),
    ([{"type": "text", "txt": "a"}], "script.responses[0]: unknown field(s) txt for Text"),
    ([{"type": "response", "items": [{"type": "http_error"}]}], "script.responses[0].items[0]: unknown type"),
    ([{"type": "function_call"}], "script.responses[0]: name: Field required"),
    ({"turns": []}, "script: unknown key(s) turns"),
    ([{"type": "response", "items": [{"type": "text", "text": "a", "latency": 1}]}],
     "set latency on the Response, not on its Text"),
])
def test_bad_scripts_say_where(data: Any, says: str) -> None:
    with pytest.raises(ScriptError) as info:
        load_script(data)
    assert says in str(info.value)


def test_reply_parsing_matches_the_python_api() -> None:
    assert parse_reply({"type": "reasoning", "summary": ["a", "b"], "encrypted_content": BLOB}) == Reasoning(
        summary=["a", "b"], encrypted_content=BLOB)
    assert parse_reply({"type": "text", "text": "hi", "usage": {"output_tokens": 9}}) == Text(
        "hi", usage={"output_tokens": 9})


async def _serve(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.emulator", "--port", "0", *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def test_standalone_script(tmp_path: Path) -> None:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps([{"type": "function_call", "name": "notes_write_file", "call_id": "call_cli",
                                 "arguments": "{\"path\":\"a\",\"text\":\"b\"}"}]))
    proc = await _serve("--script", str(path))
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        url = line.removeprefix("listening on ")
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        resp = await client.responses.create(model="gpt-5", input="go")
        assert resp.output[0].type == "function_call" and resp.output[0].call_id == "call_cli"
        # the standalone emulator validates input too
        exc = await refused(client, input=[user("go"), resp.output[0].model_dump(exclude_none=True)])
        assert error_of(exc)["message"] == "No tool output found for function call call_cli."
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_standalone_bad_script_exits_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"type": "nope"}]))
    proc = await _serve("--script", str(path))
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert f"{path}.responses[0]: unknown type 'nope'" in err.decode()
