"""The answer describes the client's request, not ctproxy's (issue 44): the `tools`, `tool_choice`, `include` and
`instructions` of every Response object the client gets (a JSON body, each lifecycle event of a stream, each frame
of the WebSocket, a bridged turn's merged answer) are the client's own, while the upstream saw what ctproxy added.
The pure parts (proxy/host/clientecho.py) are checked on split chunks; the transports through `ctproxy up`."""

from __future__ import annotations

import random

import aiohttp
import openai
import orjson
import pytest

from proxy.host.clientecho import EchoStream, client_echo, recorded, restore, restore_sse
from tests.emulator import Emulator, FunctionCall, Text
from tests.openapi_schema import spec_available

FN = {"type": "function", "name": "get_weather", "strict": True, "description": "weather",
      "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False}}
SOURCES = "web_search_call.action.sources"


def _event(typ: str, **payload) -> bytes:
    return b"event: " + typ.encode() + b"\ndata: " + orjson.dumps({"type": typ, **payload}) + b"\n\n"


def _resp(tools: list, **extra) -> dict:
    return {"id": "resp_1", "object": "response", "status": "in_progress", "tools": tools, "tool_choice": "auto",
            "instructions": None, **extra}


# ---------------------------------------------------------------- pure


def test_an_unchanged_request_needs_nothing_and_a_changed_one_names_what_changed():
    body = {"model": "gpt-5", "input": "hi", "tools": [FN]}
    assert client_echo(recorded(body), dict(body)) is None
    forwarded = {**body, "tools": [FN, {"type": "web_search"}], "include": [SOURCES]}
    echo = client_echo(recorded(body), forwarded)
    assert echo is not None and echo.changed == {"tools", "include"} and echo.added_include == {SOURCES}
    assert client_echo(recorded(body), dict(body), bridged=True).changed == {"tools", "tool_choice"}


def test_restore_keeps_the_upstreams_rendering_of_the_clients_tools_and_drops_ctproxys():
    client = {"input": "hi", "tools": [{k: v for k, v in FN.items() if k != "strict"}],
              "include": ["reasoning.encrypted_content"]}
    echo = client_echo(recorded(client), {**client, "tools": [*client["tools"], {"type": "web_search"}],
                                          "include": ["reasoning.encrypted_content", SOURCES]})
    # the upstream fills `strict` in: that rendering is what the client would have seen directly
    resp = _resp([FN, {"type": "web_search", "search_context_size": "medium"}],
                 include=["reasoning.encrypted_content", SOURCES])
    assert restore(resp, echo) and resp["tools"] == [FN] and resp["include"] == ["reasoning.encrypted_content"]
    assert not restore(resp, echo)  # already the client's
    bare = client_echo(recorded({"input": "hi"}), {"input": "hi", "tools": [{"type": "web_search"}]})
    resp = _resp([{"type": "web_search"}])
    assert restore(resp, bare) and resp["tools"] == []


def test_restore_gives_back_the_clients_tool_choice_and_instructions():
    client = {"input": "hi", "tool_choice": "required", "instructions": "be brief", "tools": [FN]}
    echo = client_echo(recorded(client), {**client, "tool_choice": "none", "instructions": "ctproxy's own"})
    resp = _resp([FN], tool_choice="none", instructions="ctproxy's own")
    assert restore(resp, echo) and resp["tool_choice"] == "required" and resp["instructions"] == "be brief"
    absent = client_echo(recorded({"input": "hi"}), {"input": "hi", "tool_choice": "none", "instructions": "x"})
    resp = _resp([], tool_choice="none", instructions="x")
    assert restore(resp, absent) and resp["tool_choice"] == "auto" and resp["instructions"] is None


def _stream(tools: list) -> list[bytes]:
    return [
        _event("response.created", sequence_number=0, response=_resp(tools)),
        _event("response.in_progress", sequence_number=1, response=_resp(tools)),
        _event("response.output_text.delta", sequence_number=2, item_id="m", output_index=0, content_index=0,
               delta='he said "response": no'),
        _event("response.completed", sequence_number=3, response=_resp(tools, status="completed",
                                                                        output=[{"type": "message"}])),
    ]


def test_the_stream_filter_rewrites_only_lifecycle_events_whatever_the_chunking():
    echo = client_echo(recorded({"input": "hi"}), {"input": "hi", "tools": [{"type": "web_search"}]})
    events = _stream([{"type": "web_search"}])
    whole = b"".join(events)
    expected = restore_sse(whole, echo)
    assert expected != whole and events[2] in expected  # the delta is byte for byte as it came
    rng = random.Random(44)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(whole)), rng.randint(1, 12)))
        pieces = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
        f = EchoStream(echo)
        out = b"".join(b"".join(f(p)) for p in pieces) + b"".join(f(b""))
        assert out == expected
    for raw in expected.split(b"\n\n")[:-1]:
        data = orjson.loads(raw.split(b"data: ", 1)[1])
        if "response" in data:
            assert data["response"]["tools"] == []


def test_a_delta_chunk_passes_without_a_parse_and_a_partial_event_is_held_not_sent_empty():
    echo = client_echo(recorded({"input": "hi"}), {"input": "hi", "tools": [{"type": "web_search"}]})
    f = EchoStream(echo)
    delta = _event("response.output_text.delta", delta="x")
    assert f(delta) == [delta]
    created = _event("response.created", response=_resp([{"type": "web_search"}]))
    assert f(created[:20]) == []  # held: an empty chunk would end a chunked body
    out = f(created[20:])
    assert len(out) == 1 and orjson.loads(out[0].split(b"data: ")[1])["response"]["tools"] == []


# ---------------------------------------------------------------- the transports, through ctproxy up

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def emu():
    async with Emulator(validate_requests=spec_available()) as emulator:
        emulator.set_default(Text("ok"))
        yield emulator


def _client(proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-echo", max_retries=0)


async def test_json_and_sse_answers_show_the_clients_tools_while_upstream_got_web_search(emu, proxy_factory):
    proxy = await proxy_factory(upstream=emu.url)
    # the repro: curl -d '{"model":"gpt-5","input":"hi"}' $PROXY/v1/responses | jq .tools
    async with aiohttp.ClientSession() as http, http.post(proxy.url + "/v1/responses", json={"model": "gpt-5",
                                                                                          "input": "hi"},
                                                          headers={"Authorization": "Bearer sk-test-echo"}) as r:
        body = await r.json()
        assert r.status == 200 and int(r.headers["content-length"]) == len(await r.read())
    assert body["tools"] == [] and body["tool_choice"] == "auto" and "include" not in body
    assert [t["type"] for t in emu.responses_requests[-1].json["tools"]] == ["web_search"]  # upstream got it

    c = _client(proxy)
    seen = []
    async with c.responses.stream(model="gpt-5", input="hi", tools=[FN], instructions="be brief") as s:
        async for ev in s:
            if getattr(ev, "response", None) is not None:
                seen.append((ev.type, ev.response))
    assert [t for t, _ in seen] == ["response.created", "response.in_progress", "response.completed"]
    for _, resp in seen:
        assert [t.model_dump(exclude_none=True) for t in resp.tools] == [FN]
        assert resp.tool_choice == "auto" and resp.instructions == "be brief"
    assert [t["type"] for t in emu.responses_requests[-1].json["tools"]] == ["function", "web_search"]
    await c.close()


async def test_the_websocket_frames_show_the_clients_tools(emu, proxy_factory):
    pytest.importorskip("websockets", reason="the SDK's WebSocket client needs `websockets` (test extras)")
    proxy = await proxy_factory(upstream=emu.url)
    c = _client(proxy)
    seen = []
    async with c.responses.connect(max_retries=0) as conn:
        await conn.response.create(model="gpt-5", store=False, input="hi", tools=[FN])
        async for ev in conn:
            assert ev.type != "error", ev
            if getattr(ev, "response", None) is not None:
                seen.append(ev.response)
            if ev.type == "response.completed":
                break
    await c.close()
    assert len(seen) == 3
    for resp in seen:
        assert [t.model_dump(exclude_none=True) for t in resp.tools] == [FN]
    ws = [r for r in emu.requests if r.transport == "ws" and r.route == "responses"]
    assert [t["type"] for t in ws[-1].json["tools"]] == ["function", "web_search"]


async def test_a_bridged_turn_shows_the_clients_tools_and_tool_choice(emu, proxy_factory):
    proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "context,notes"])
    emu.script(FunctionCall("get_context_remaining", {}), Text("bridged done"))
    c = _client(proxy)
    seen = []
    async with c.responses.stream(model="gpt-5", input="how much context?", tools=[FN]) as s:
        async for ev in s:
            if getattr(ev, "response", None) is not None:
                seen.append(ev.response)
    final = await c.responses.create(model="gpt-5", input="again", tools=[FN], stream=False)
    await c.close()
    assert seen and seen[-1].output_text == "bridged done"
    for resp in [*seen, final]:
        assert [t.model_dump(exclude_none=True) for t in resp.tools] == [FN]
        assert resp.tool_choice == "auto"
    first = emu.responses_requests[0].json
    assert len(first["tools"]) > 2  # the bridge's specs and web search went upstream


def test_the_echo_tap_reads_what_it_passes_on_and_decodes_a_compressed_stream():
    import zlib

    from proxy.host.clientecho import EchoTap
    from proxy.items.sse import ResponseTap, decompressor

    echo = client_echo(recorded({"input": "hi"}), {"input": "hi", "tools": [{"type": "web_search"}]})
    whole = b"".join(_stream([{"type": "web_search"}]))
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    packed = packer.compress(whole) + packer.flush()
    tap = ResponseTap()
    stream = EchoTap(tap, EchoStream(echo, decompressor("gzip")))
    out = [stream(packed[i:i + 37]) for i in range(0, len(packed), 37)]
    out.append(stream(b""))
    sent = b"".join(b"".join(o) for o in out)
    assert sent == restore_sse(whole, echo) and all(isinstance(o, list) for o in out)
    assert tap.completed and tap.events == 4 and stream.nbytes == len(sent)
