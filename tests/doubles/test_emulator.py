"""The Responses emulator speaks the real wire format: every event and body is checked against the
official OpenAPI description, and the official `openai` SDK parses what it sends."""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
import sys
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import brotli
import openai
import orjson
import pytest
import zstandard
from multidict import CIMultiDict

from tests import openapi_schema
from tests.emulator import (
    CONTEXT_LENGTH_MESSAGE,
    Compaction,
    CustomToolCall,
    Emulator,
    ErrorEvent,
    FailedInStream,
    FunctionCall,
    HttpError,
    Item,
    Raw,
    Reasoning,
    ReceivedRequest,
    Response,
    Text,
    WebSearch,
    context_length_exceeded_400,
    insufficient_quota_429,
    rate_limited_429,
    server_error_500,
)
from tests.emulator.compaction import retained_user_messages
from tests.emulator.wire import estimate_input_tokens
from tests.openapi_schema import (
    SchemaViolation,
    schema_errors,
    spec_available,
    stream_event_schemas,
    validate,
    validate_stream_event,
)

ROOT = Path(__file__).resolve().parents[2]
# A copy of shared/compat/codex-cli/request-exec-first-turn.json (Codex CLI 0.169.0's first request), kept
# in the repo so that a clone without shared/ runs these tests too.
CODEX_REQUEST = Path(__file__).resolve().parents[1] / "flows" / "codex-request-exec-first-turn.json"
needs_spec = pytest.mark.skipif(not spec_available(), reason="OpenAI OpenAPI spec not found (set CTPROXY_OPENAPI_SPEC)")

TEXT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture
async def emu():
    async with Emulator() as e:
        yield e


@pytest.fixture
def client(emu: Emulator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=emu.url + "/v1", api_key="sk-test", max_retries=0)


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-5", "input": "What is the capital of France?", **extra}


def parse_sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event-line name, data JSON) per frame; fails on anything that is not `event:`+`data:`."""
    assert data.endswith(b"\n\n"), "stream must end with a complete frame"
    frames = []
    for frame in data[:-2].split(b"\n\n"):
        lines = frame.split(b"\n")
        assert len(lines) == 2 and lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), frame
        frames.append((lines[0][7:].decode(), orjson.loads(lines[1][6:])))
    return frames


async def post(
    emu: Emulator, payload: Any, path: str = "/v1/responses", **kwargs: Any
) -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession() as session:
        data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        async with session.post(emu.url + path, data=data, headers=headers, **kwargs) as resp:
            return resp.status, resp.headers.copy(), await resp.read()


async def stream_events(emu: Emulator, payload: dict[str, Any], path: str = "/v1/responses") -> list[dict[str, Any]]:
    status, headers, data = await post(emu, {**payload, "stream": True}, path)
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    frames = parse_sse(data)
    for name, event in frames:
        assert name == event["type"]
    assert b"[DONE]" not in data
    events = [event for _, event in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def check_events(events: list[dict[str, Any]]) -> None:
    for event in events:
        validate_stream_event(event)


# ---- default behaviour -------------------------------------------------------------------------


@needs_spec
async def test_default_stream_is_a_spec_text_turn(emu: Emulator) -> None:
    events = await stream_events(emu, body())
    types = [e["type"] for e in events]
    collapsed = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]
    assert collapsed == TEXT_ORDER
    assert types.count("response.output_text.delta") == 3
    check_events(events)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert deltas == done["text"] == "You said: What is the capital of France?"
    final = events[-1]["response"]
    validate("Response", final, strict=True)
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == deltas
    assert final["id"].startswith("resp_") and final["output"][0]["id"].startswith("msg_")
    assert events[0]["response"]["id"] == final["id"]
    usage = final["usage"]
    assert usage["input_tokens"] == estimate_input_tokens(body())
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert emu.last.response_id == final["id"] and emu.last.events_sent == len(events)


@needs_spec
async def test_default_json_echoes_request_parameters(emu: Emulator) -> None:
    tools = [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": False}]
    req = body(
        instructions="Be brief.",
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0.2,
        top_p=0.9,
        text={"format": {"type": "text"}, "verbosity": "low"},
        truncation="auto",
        store=False,
        metadata={"k": "v"},
        reasoning={"effort": "low", "summary": "auto"},
        max_output_tokens=500,
        prompt_cache_key="thread-1",
    )
    status, headers, data = await post(emu, req)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert headers["x-request-id"].startswith("req_")
    resp = orjson.loads(data)
    validate("Response", resp, strict=True)
    for key in ("model", "instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p"):
        assert resp[key] == req[key], key
    for key in ("text", "truncation", "store", "metadata", "reasoning", "max_output_tokens", "prompt_cache_key"):
        assert resp[key] == req[key], key
    assert resp["object"] == "response" and resp["status"] == "completed" and resp["completed_at"]
    assert resp["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


async def test_codex_route_behaves_like_v1(emu: Emulator) -> None:
    events = await stream_events(emu, body(), path="/backend-api/codex/responses")
    assert events[-1]["type"] == "response.completed"
    assert emu.last.path == "/backend-api/codex/responses" and emu.last.route == "responses"


# ---- every reply kind validates ----------------------------------------------------------------

REPLIES: dict[str, Any] = {
    "text": Text("Paris is the capital of France.", deltas=5, phase="final_answer"),
    "function_call": FunctionCall("get_weather", {"city": "Paris"}, namespace="weather"),
    "custom_tool_call": CustomToolCall("apply_patch", "*** Begin Patch\n*** End Patch\n"),
    "web_search": WebSearch("capital of France", sources=["https://en.wikipedia.org/wiki/Paris"]),
    "reasoning": Reasoning(summary=["First thought.", "Second thought."]),
    "compaction": Compaction(),
    "raw_item": Item({"id": "ig_1", "type": "image_generation_call", "status": "completed", "result": "aGk="}),
    "multi": Response([Reasoning(summary="plan"), Text("Checking."), FunctionCall("a", "{}"), FunctionCall("b", "{}")]),
    "incomplete": Response([Text("cut")], status="incomplete"),
    "failed": FailedInStream(),
    "failed_partial": FailedInStream("server_error", items=[Text("partial")]),
    "error_flat": ErrorEvent(nested=False),
}


@needs_spec
@pytest.mark.parametrize("kind", sorted(REPLIES))
async def test_every_reply_kind_streams_valid_events(emu: Emulator, kind: str) -> None:
    emu.script(REPLIES[kind])
    events = await stream_events(emu, body(include=["web_search_call.action.sources"]))
    check_events(events)
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete", "response.failed", "error")
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert added == [e["output_index"] for e in done] == list(range(len(added)))
    if "response" in events[-1]:
        assert events[-1]["response"]["output"] == [e["item"] for e in done]


@needs_spec
@pytest.mark.parametrize("kind", sorted(k for k in REPLIES if k != "error_flat"))
async def test_every_reply_kind_as_json_validates(emu: Emulator, kind: str) -> None:
    emu.script(REPLIES[kind])
    status, _, data = await post(emu, body())
    assert status == 200
    validate("Response", orjson.loads(data))


@needs_spec
async def test_error_event_shapes(emu: Emulator) -> None:
    emu.script(ErrorEvent(nested=True), ErrorEvent(nested=False, code="server_error", error_type="server_error"))
    nested = (await stream_events(emu, body()))[-1]
    assert nested == {
        "type": "error",
        "sequence_number": 2,
        "error": {
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
            "message": CONTEXT_LENGTH_MESSAGE,
            "param": "input",
        },
    }
    with pytest.raises(SchemaViolation):  # the shape seen in the wild is not the spec's
        validate("ResponseErrorEvent", nested)
    flat = (await stream_events(emu, body()))[-1]
    validate("ResponseErrorEvent", flat, strict=True)
    assert flat["code"] == "server_error" and flat["param"] is None


@needs_spec
async def test_failed_in_stream_has_the_real_shape(emu: Emulator) -> None:
    emu.script(FailedInStream())
    events = await stream_events(emu, body())
    assert [e["type"] for e in events] == ["response.created", "response.failed"]
    resp = events[1]["response"]
    assert resp["status"] == "failed" and resp["usage"] is None
    assert resp["error"] == {"code": "context_length_exceeded", "message": CONTEXT_LENGTH_MESSAGE}
    validate_stream_event(events[1])
    # The real payload violates the spec twice (code outside the enum, usage null): documented relaxations.
    problems = schema_errors("ResponseFailedEvent", events[1], strict=True)
    assert problems


@needs_spec
async def test_http_error_bodies_validate(emu: Emulator) -> None:
    emu.script(context_length_exceeded_400(), rate_limited_429(2.5), insufficient_quota_429(), server_error_500())
    status, _, data = await post(emu, body())
    assert status == 400
    assert orjson.loads(data) == {
        "error": {
            "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }
    status, headers, data = await post(emu, body())
    assert status == 429 and headers["retry-after"] == "2" and headers["retry-after-ms"] == "2500"
    validate("ErrorResponse", orjson.loads(data), strict=True)
    status, _, data = await post(emu, body())
    assert status == 429 and orjson.loads(data)["error"]["code"] == "insufficient_quota"
    status, _, data = await post(emu, body())
    assert status == 500
    validate("ErrorResponse", orjson.loads(data), strict=True)


# ---- item details ------------------------------------------------------------------------------


async def test_function_call_event_sequence(emu: Emulator) -> None:
    emu.script(FunctionCall("lookup", '{"q": "paris", "limit": 3}', call_id="call_abc", namespace="kb", deltas=4))
    events = await stream_events(emu, body())
    types = [e["type"] for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 4,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = events[2]["item"], events[-2]["item"]
    assert added["status"] == "in_progress" and added["arguments"] == ""
    assert done["call_id"] == "call_abc" and done["namespace"] == "kb" and done["status"] == "completed"
    assert done["id"].startswith("fc_")
    deltas = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert deltas == done["arguments"] == events[-3]["arguments"] == '{"q": "paris", "limit": 3}'
    assert events[-3]["name"] == "lookup"


async def test_web_search_sources_only_when_included(emu: Emulator) -> None:
    sources = ["https://example.com/a", {"url": "https://www.example.org/b", "title": "Example B"}]
    emu.script(WebSearch("paris", sources=sources), WebSearch("paris", sources=sources))
    plain = await stream_events(emu, body())
    with_sources = await stream_events(emu, body(include=["web_search_call.action.sources"]))
    ws_plain = plain[-1]["response"]["output"][0]
    ws_full = with_sources[-1]["response"]["output"][0]
    assert ws_plain["id"].startswith("ws_") and "sources" not in ws_plain["action"]
    assert ws_full["action"]["sources"] == [
        {"type": "url", "url": "https://example.com/a"},
        {"type": "url", "url": "https://www.example.org/b"},
    ]
    assert ws_full["action"]["query"] == "paris" and ws_full["action"]["queries"] == ["paris"]
    message = with_sources[-1]["response"]["output"][1]["content"][0]
    assert [a["title"] for a in message["annotations"]] == ["example.com", "Example B"]
    for ann in message["annotations"]:
        assert ann["type"] == "url_citation"
        assert message["text"][ann["start_index"] : ann["end_index"]].endswith(f"({ann['url']}))")
    announced = [e for e in with_sources if e["type"] == "response.output_text.annotation.added"]
    assert [e["annotation_index"] for e in announced] == [0, 1]
    phases = [e["type"] for e in with_sources if e["type"].startswith("response.web_search_call.")]
    assert phases == [f"response.web_search_call.{p}" for p in ("in_progress", "searching", "completed")]


async def test_reasoning_item_complete_only_in_done(emu: Emulator) -> None:
    emu.script(Reasoning(summary="Think first.", encrypted_content="gAAAAAB-secret-blob"))
    events = await stream_events(emu, body())
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    done = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert done["encrypted_content"] == "gAAAAAB-secret-blob"
    assert added["encrypted_content"] != done["encrypted_content"]
    assert done["summary"] == [{"type": "summary_text", "text": "Think first."}]
    text_done = next(e for e in events if e["type"] == "response.reasoning_summary_text.done")
    assert text_done["text"] == "Think first."
    assert events[-1]["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


async def test_obfuscation_follows_stream_options(emu: Emulator) -> None:
    with_obf = await stream_events(emu, body())
    without = await stream_events(emu, body(stream_options={"include_obfuscation": False}))
    assert all("obfuscation" in e for e in with_obf if e["type"].endswith(".delta"))
    assert not any("obfuscation" in e for e in without)


# ---- remote compaction -------------------------------------------------------------------------


def codex_history(text: str) -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        {"type": "message", "role": "assistant", "content": "ok"},
    ]


@needs_spec
async def test_compaction_trigger_answers_one_compaction_item(emu: Emulator) -> None:
    req = body(input=[*codex_history("fix the bug"), {"type": "compaction_trigger"}], store=False)
    emu.script(Text("this scripted turn is not used for compaction"))
    events = await stream_events(emu, req)
    check_events(events)
    output = events[-1]["response"]["output"]
    assert [i["type"] for i in output] == ["reasoning", "compaction"]
    cmp_item = output[1]
    assert cmp_item["id"].startswith("cmp_") and len(cmp_item["encrypted_content"]) > 100
    assert emu.last.route == "compaction" and emu.pending() == 1
    again = await stream_events(emu, req)
    other = await stream_events(emu, {**req, "input": [*codex_history("other"), {"type": "compaction_trigger"}]})
    blob = again[-1]["response"]["output"][1]["encrypted_content"]
    assert blob == cmp_item["encrypted_content"]  # deterministic per input
    assert other[-1]["response"]["output"][1]["encrypted_content"] != blob


async def test_compaction_queue_is_separate(emu: Emulator) -> None:
    emu.script_compaction(FailedInStream("server_error"))
    trigger = body(input=[*codex_history("x"), {"type": "compaction_trigger"}])
    assert (await stream_events(emu, trigger))[-1]["type"] == "response.failed"
    assert (await stream_events(emu, trigger))[-1]["response"]["output"][-1]["type"] == "compaction"


@needs_spec
async def test_compact_endpoint_returns_compact_resource(emu: Emulator, client: openai.AsyncOpenAI) -> None:
    req = {"model": "gpt-5", "input": [*codex_history("first ask"), *codex_history("second ask")]}
    status, _, data = await post(emu, req, path="/v1/responses/compact")
    assert status == 200
    resource = orjson.loads(data)
    validate("CompactResource", resource, strict=True)
    validate("CompactResponseMethodPublicBody", req, strict=True)
    kinds = [(i["type"], i.get("role")) for i in resource["output"]]
    assert kinds == [("message", "user"), ("message", "user"), ("compaction", None)]
    assert [i["content"][0]["text"] for i in resource["output"][:2]] == ["first ask", "second ask"]
    assert resource["object"] == "response.compaction" and resource["id"].startswith("resp_")
    compacted = await client.responses.compact(model="gpt-5", input=req["input"])
    assert compacted.output[-1].type == "compaction"
    assert compacted.output[-1].encrypted_content == resource["output"][-1]["encrypted_content"]
    status, _, data = await post(emu, {"input": "x"}, path="/v1/responses/compact")
    assert status == 400 and orjson.loads(data)["error"]["param"] == "model"
    emu.script_compact(Compaction(encrypted_content="fixed"), server_error_500())
    _, _, data = await post(emu, req, path="/backend-api/codex/responses/compact")
    assert orjson.loads(data)["output"][-1]["encrypted_content"] == "fixed"
    status, _, _ = await post(emu, req, path="/v1/responses/compact")
    assert status == 500


def test_retained_user_messages_budget_keeps_newest() -> None:
    items = [
        {"role": "user", "content": "a" * 400},  # 100 tokens
        {"role": "user", "content": [{"type": "input_text", "text": "b" * 40}]},  # 10 tokens
        {"type": "function_call", "call_id": "c", "name": "n", "arguments": "{}"},
        {"role": "user", "content": "c" * 40},  # 10 tokens
    ]
    assert [m["content"][0]["text"][0] for m in retained_user_messages(items, budget=50)] == ["b", "c"]
    assert len(retained_user_messages(items, budget=1)) == 1  # the newest is always kept


# ---- store, retrieve, previous_response_id, input tokens ---------------------------------------


@needs_spec
async def test_retrieve_and_previous_response_id(emu: Emulator, client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(model="gpt-5", input="hello")
    got = await client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    second = await client.responses.create(model="gpt-5", input="more", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    stateless = await client.responses.create(model="gpt-5", input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(stateless.id)
    status, _, data = await post(emu, body(previous_response_id=stateless.id))
    err = orjson.loads(data)
    validate("ErrorResponse", err, strict=True)
    assert status == 400 and err["error"]["code"] == "previous_response_not_found"
    await client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)


async def test_input_tokens_endpoint(emu: Emulator, client: openai.AsyncOpenAI) -> None:
    counted = await client.responses.input_tokens.count(model="gpt-5", input="x" * 400)
    assert counted.input_tokens == 100
    emu.token_counter = lambda body: 7
    assert (await client.responses.input_tokens.count(model="gpt-5", input="x")).input_tokens == 7


# ---- recording, catch-all, encodings -----------------------------------------------------------


async def raw_http(emu: Emulator, request: bytes) -> bytes:
    """Send hand-written HTTP/1.1 bytes (exact header case, order and duplicates); read to EOF."""
    reader, writer = await asyncio.open_connection(emu.host, emu.port)
    writer.write(request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


@needs_spec
async def test_catch_all_records_raw_bytes_and_headers(emu: Emulator) -> None:
    raw = b'{"model": "gpt-4o",  "messages": []}\n'
    head = (
        b"POST /v1/chat/completions?a=1&b=2 HTTP/1.1\r\nHost: api.openai.com\r\nX-Mixed-Case: 1\r\n"
        b"x-dup: a\r\nX-Dup: b\r\nContent-Type: application/json\r\nConnection: close\r\n"
    )
    answer = await raw_http(emu, head + b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    assert answer.startswith(b"HTTP/1.1 404 ")
    err = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    validate("ErrorResponse", err, strict=True)
    assert err["error"]["message"] == "Invalid URL (POST /v1/chat/completions)"
    rec = emu.last
    assert rec.route == "other" and rec.raw_body == raw and rec.json == {"model": "gpt-4o", "messages": []}
    assert rec.query == "a=1&b=2" and rec.method == "POST" and rec.status == 404
    assert rec.headers[:5] == [
        ("Host", "api.openai.com"),
        ("X-Mixed-Case", "1"),
        ("x-dup", "a"),
        ("X-Dup", "b"),
        ("Content-Type", "application/json"),
    ]
    assert rec.header_all("X-DUP") == ["a", "b"] and rec.header("x-mixed-case") == "1"
    async with aiohttp.ClientSession() as session, session.get(emu.url + "/healthz") as resp:
        assert resp.status == 404
    assert emu.last.method == "GET" and emu.last.json is None and emu.last.raw_body == b""


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("zstd", lambda b: zstandard.ZstdCompressor().compress(b)),
        ("gzip", gzip.compress),
        ("br", brotli.compress),
        ("deflate", zlib.compress),
    ],
)
async def test_compressed_request_bodies(emu: Emulator, encoding: str, compress: Any) -> None:
    plain = orjson.dumps(body(input="compressed hello"))
    packed = compress(plain)
    status, _, data = await post(emu, packed, headers={"Content-Encoding": encoding})
    assert status == 200
    assert orjson.loads(data)["output"][0]["content"][0]["text"] == "You said: compressed hello"
    assert emu.last.raw_body == packed and emu.last.body == plain and emu.last.header("content-encoding") == encoding


async def test_undecodable_and_non_json_bodies(emu: Emulator) -> None:
    status, _, data = await post(emu, b"not gzip", headers={"Content-Encoding": "gzip"})
    assert status == 400 and "gzip" in orjson.loads(data)["error"]["message"]
    status, _, data = await post(emu, b"{broken")
    assert status == 400 and "could not parse the JSON body" in orjson.loads(data)["error"]["message"]
    status, _, data = await post(emu, {"input": "no model"})
    assert status == 400 and orjson.loads(data)["error"]["code"] == "missing_required_parameter"
    assert [r.status for r in emu.requests] == [400, 400, 400]


async def test_large_request_is_accepted(emu: Emulator) -> None:
    big = [{"role": "user", "content": "y" * 1000} for _ in range(1500)]  # about 1.5 MB
    status, _, data = await post(emu, body(input=big))
    assert status == 200
    assert orjson.loads(data)["usage"]["input_tokens"] == estimate_input_tokens({"input": big})
    assert len(emu.last.raw_body) > 1_500_000


# ---- the Codex request -------------------------------------------------------------------------


@needs_spec
async def test_real_codex_request_validates_and_is_served() -> None:
    capture = json.loads(CODEX_REQUEST.read_text())
    validate("CreateResponse", capture["body"], strict=True)
    async with Emulator(validate_requests=True) as emu:
        headers = {k: v for k, v in capture["headers"].items() if k not in ("Host", "Content-Length")}
        status, resp_headers, data = await post(emu, capture["body"], headers=headers)
        assert status == 200 and resp_headers["Content-Type"].startswith("text/event-stream")
        frames = parse_sse(data)
        assert frames[-1][1]["type"] == "response.completed"
        assert emu.last.header("x-codex-beta-features") == "remote_compaction_v2"
        assert ("session-id", capture["headers"]["session-id"]) in emu.last.headers
        bad = {**capture["body"], "context_management": [{"type": "compaction", "compact_threshold": 10}]}
        status, _, data = await post(emu, bad)
        assert status == 400 and "compact_threshold" in orjson.loads(data)["error"]["message"]


# ---- the official SDK --------------------------------------------------------------------------


async def test_sdk_parses_stream_and_json(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    emu.script(Text("Bonjour tout le monde", deltas=4))
    stream = await client.responses.create(model="gpt-5", input="hi", stream=True)
    events = [ev async for ev in stream]
    assert [type(e).__name__ for e in events[:2]] == ["ResponseCreatedEvent", "ResponseInProgressEvent"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Bonjour tout le monde"
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "Bonjour tout le monde"
    resp = await client.responses.create(model="gpt-5", input="Say hi")
    assert resp.output_text == "You said: Say hi" and resp.usage is not None and resp.usage.total_tokens > 0


async def test_sdk_parses_function_calls(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    calls = [FunctionCall("get_weather", {"city": "Paris"}), FunctionCall("get_time", {"tz": "CET"})]
    emu.script(Response([Text("Let me check."), *calls]), Response(calls))
    resp = await client.responses.create(model="gpt-5", input="weather?")
    fcs = [o for o in resp.output if o.type == "function_call"]
    assert [(f.name, json.loads(f.arguments)) for f in fcs] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "CET"}),
    ]
    assert resp.output_text == "Let me check."
    async with client.responses.stream(model="gpt-5", input="weather?") as stream:
        final = await stream.get_final_response()
    assert [o.name for o in final.output if o.type == "function_call"] == ["get_weather", "get_time"]


async def test_sdk_maps_errors(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    emu.script(context_length_exceeded_400(), rate_limited_429(), server_error_500(), FailedInStream(), ErrorEvent())
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="gpt-5", input="x")
    assert bad.value.code == "context_length_exceeded" and bad.value.param == "input"
    with pytest.raises(openai.RateLimitError) as limited:
        await client.responses.create(model="gpt-5", input="x")
    assert limited.value.response.headers["retry-after"] == "1"
    with pytest.raises(openai.InternalServerError):
        await client.responses.create(model="gpt-5", input="x")
    stream = await client.responses.create(model="gpt-5", input="x", stream=True)
    events = [ev async for ev in stream]
    assert events[-1].type == "response.failed" and events[-1].response.error.code == "context_length_exceeded"
    stream = await client.responses.create(model="gpt-5", input="x", stream=True)
    with pytest.raises(openai.APIError) as nested:
        async for _ in stream:
            pass
    assert nested.value.code == "context_length_exceeded"


# ---- timing, disconnects, concurrency ----------------------------------------------------------


async def read_events_with_times(resp: aiohttp.ClientResponse) -> list[tuple[float, dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    out: list[tuple[float, dict[str, Any]]] = []
    data_line = b""
    async for line in resp.content:
        if line.startswith(b"data: "):
            data_line = line[6:]
        elif line == b"\n" and data_line:
            out.append((loop.time(), orjson.loads(data_line)))
            data_line = b""
    return out


@pytest.mark.parametrize(
    "reply",
    [Text("abcdef", deltas=3, pause_after_first=0.3), Text("abcdef", delays={3: 0.3})],
    ids=["pause_after_first", "delays"],
)
async def test_delays_hold_back_later_events(emu: Emulator, reply: Text) -> None:
    emu.script(reply)
    paused_after = 0 if reply.pause_after_first else 3
    async with (
        aiohttp.ClientSession() as session,
        session.post(emu.url + "/v1/responses", json=body(stream=True)) as resp,
    ):
        timed = await read_events_with_times(resp)
    writes = emu.last.write_times
    assert len(timed) == len(writes) == emu.last.events_sent
    # The paused event reached the client before the emulator even wrote the next one.
    assert timed[paused_after][0] < writes[paused_after + 1]
    assert timed[-1][1]["type"] == "response.completed"


async def test_mid_stream_disconnect_truncates(emu: Emulator) -> None:
    emu.script(Text("hello world", deltas=5, disconnect_after=4))
    received: list[bytes] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(emu.url + "/v1/responses", json=body(stream=True)) as resp,
    ):
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in resp.content.iter_any():
                received.append(chunk)
    frames = parse_sse(b"".join(received))
    assert [f[1]["type"] for f in frames] == TEXT_ORDER[:4]
    assert emu.last.events_sent == 4 and emu.last.response_id is not None
    assert emu.last.response_id not in emu.stored  # an unfinished response is not retrievable


async def test_sdk_sees_disconnect_as_error(client: openai.AsyncOpenAI, emu: Emulator) -> None:
    emu.script(Text("hello", disconnect_after=3))
    stream = await client.responses.create(model="gpt-5", input="x", stream=True)
    seen = []
    with pytest.raises(openai.APIConnectionError):
        async for ev in stream:
            seen.append(ev.type)
    assert seen == TEXT_ORDER[:3]


async def test_client_disconnect_is_recorded(emu: Emulator) -> None:
    emu.script(Text("abc", pause_after_first=0.2))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(emu.url + "/v1/responses", json=body(stream=True))
        await resp.content.readuntil(b"\n\n")
        resp.close()  # hang up while the emulator is paused
    for _ in range(100):
        if emu.last.client_disconnected:
            break
        await asyncio.sleep(0.05)
    assert emu.last.client_disconnected and emu.last.events_sent < 9


async def test_concurrent_long_streams(emu: Emulator) -> None:
    emu.default_deltas = 190

    async def one(i: int) -> list[dict[str, Any]]:
        return await stream_events(emu, body(input=f"stream {i} " + "z" * 300))

    results = await asyncio.gather(*(one(i) for i in range(20)))
    for events in results:
        assert len(events) == 198 and events[-1]["type"] == "response.completed"
    assert len({events[-1]["response"]["id"] for events in results}) == 20


# ---- scripting API ----------------------------------------------------------------------------


async def test_script_queue_defaults_and_callables(emu: Emulator) -> None:
    seen: list[ReceivedRequest] = []

    def responder(req: ReceivedRequest) -> Text:
        seen.append(req)
        return Text(f"model was {req.json['model']}")

    emu.script(Text("one"), responder)
    texts = []
    for _ in range(3):
        _, _, data = await post(emu, body())
        texts.append(orjson.loads(data)["output"][0]["content"][0]["text"])
    assert texts == ["one", "model was gpt-5", "You said: What is the capital of France?"]
    assert seen == [emu.requests[1]]
    emu.set_default(Text("always"))
    _, _, data = await post(emu, body())
    assert orjson.loads(data)["output"][0]["content"][0]["text"] == "always"
    emu.reset()
    assert emu.requests == [] and emu.pending() == 0
    _, _, data = await post(emu, body())
    assert orjson.loads(data)["output"][0]["content"][0]["text"].startswith("You said:")
    await emu.wait_for_requests(1, timeout=1)


async def test_usage_override_and_token_counter(emu: Emulator) -> None:
    emu.script(Text("x", usage={"input_tokens": 250_000}), Response([Text("y")], usage={"total_tokens": 5}))
    _, _, data = await post(emu, body())
    usage = orjson.loads(data)["usage"]
    assert usage["input_tokens"] == 250_000 and usage["total_tokens"] == 250_000 + usage["output_tokens"]
    _, _, data = await post(emu, body())
    assert orjson.loads(data)["usage"]["total_tokens"] == 5
    emu.token_counter = lambda b: 1234
    _, _, data = await post(emu, body())
    assert orjson.loads(data)["usage"]["input_tokens"] == 1234


def test_response_rejects_options_on_its_items() -> None:
    with pytest.raises(ValueError, match="on the Response"):
        Response([Text("x", usage={"input_tokens": 1})])
    with pytest.raises(TypeError):
        Response([HttpError(500)])  # type: ignore[list-item]


async def test_raw_reply_is_exact(emu: Emulator) -> None:
    frames = [b'event: response.created\r\ndata: {"type":', b'"response.created"}\r\n\r\n', b": comment\n\n"]
    emu.script(
        Raw(201, [("Content-Type", "text/plain"), ("X-Raw", "1")], b"exact \x00 bytes"),
        Raw(200, {"Content-Type": "text/event-stream"}, frames),
    )
    status, headers, data = await post(emu, body())
    assert (status, headers["X-Raw"], headers["Content-Type"], data) == (201, "1", "text/plain", b"exact \x00 bytes")
    status, _, data = await post(emu, body(stream=True))
    assert data == b"".join(frames) and emu.last.events_sent == 3


async def test_latency_before_headers(emu: Emulator) -> None:
    emu.script(
        HttpError(
            503,
            b'{"error":{"message":"slow down","type":"server_error","param":null,"code":"slow_down"}}',
            latency=0.05,
        )
    )
    status, _, data = await post(emu, body())
    assert status == 503 and orjson.loads(data)["error"]["code"] == "slow_down"


# ---- the schema helper ------------------------------------------------------------------------


@needs_spec
def test_schema_helper_messages_and_relaxations() -> None:
    with pytest.raises(SchemaViolation) as exc_info:
        validate("ResponseTextDeltaEvent", {"type": "response.output_text.delta", "delta": "x"})
    assert "ResponseTextDeltaEvent" in str(exc_info.value) and "required" in str(exc_info.value)
    # oneOf members overlap (EasyInputMessage vs InputMessage): only valid because oneOf → anyOf.
    validate(
        "CreateResponse",
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "t"}]}]},
        strict=True,
    )
    assert schema_errors("CreateResponse", {"model": "m", "tools": [{"type": "function", "name": "f"}]})
    assert len(stream_event_schemas()) == 58
    assert stream_event_schemas()["response.output_text.delta"] == "ResponseTextDeltaEvent"
    with pytest.raises(SchemaViolation, match="unknown event type"):
        validate_stream_event({"type": "response.compaction.compacting", "sequence_number": 0})
    with pytest.raises(KeyError):
        validate("NoSuchSchema", {})


@needs_spec
def test_schema_cache_holds_the_converted_components() -> None:
    comps = openapi_schema.components(strict=True)
    cache = openapi_schema._cache_file(openapi_schema.spec_path())
    assert orjson.loads(cache.read_bytes()) == comps  # the next process reads this instead of the YAML
    text = cache.read_text()
    assert '"oneOf"' not in text and '"nullable"' not in text


# ---- standalone ---------------------------------------------------------------------------------


async def test_standalone_process() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.emulator", "--port", "0", "--deltas", "7",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.removeprefix("listening on ")
        async with (
            aiohttp.ClientSession() as session,
            session.post(url + "/v1/responses", json=body(stream=True)) as resp,
        ):
            data = await resp.read()
        types = [f[1]["type"] for f in parse_sse(data)]
        assert types.count("response.output_text.delta") == 7 and types[-1] == "response.completed"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_unknown_methods_on_known_paths_reach_the_catch_all(emu: Emulator) -> None:
    async with aiohttp.ClientSession() as session, session.get(emu.url + "/v1/responses") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["message"] == "Invalid URL (GET /v1/responses)"
    assert emu.last.route == "other"


async def test_close_does_not_wait_for_paused_streams() -> None:
    emu = await Emulator().start()
    emu.script(Text("hello", pause_after_first=60))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(emu.url + "/v1/responses", json=body(stream=True))
        await resp.content.readuntil(b"\n\n")
        await asyncio.wait_for(emu.close(), 30)  # far below the 60 s pause
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
