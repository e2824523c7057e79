"""The emulator speaks the Responses WebSocket mode (tests/emulator/websocket.py): events are the SSE
events' objects as JSON text frames, checked against the official OpenAPI description; input is validated
as on HTTP; warm-ups; the connection's own `previous_response_id`; refusals; bad frames; the 60-minute
limit; every create recorded with its transport."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from tests import openapi_schema
from tests.emulator import Emulator, FunctionCall, Text

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


async def turn(ws: aiohttp.ClientWebSocketResponse, body: dict[str, Any]) -> list[dict[str, Any]]:
    await ws.send_str(orjson.dumps({"type": "response.create", **body}).decode())
    events: list[dict[str, Any]] = []
    while True:
        msg = await ws.receive(timeout=30)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        events.append(orjson.loads(msg.data))
        if events[-1]["type"] in TERMINAL:
            return events


def user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


async def test_two_creates_chain_on_the_connection_even_unstored() -> None:
    async with Emulator(validate_requests=openapi_schema.spec_available()) as emu, aiohttp.ClientSession() as http:
        emu.script(FunctionCall("shell", {"cmd": "ls"}), Text("done"))
        async with http.ws_connect(emu.url + "/v1/responses",
                                   headers={"OpenAI-Beta": "responses_websockets=2026-02-06"}) as ws:
            first = await turn(ws, {"model": "gpt-5", "store": False, "input": user("list files")})
            assert first[0]["type"] == "response.created" and first[-1]["type"] == "response.completed"
            if openapi_schema.spec_available():
                for ev in first:
                    openapi_schema.validate_stream_event(ev)
            rid = first[-1]["response"]["id"]
            call = first[-1]["response"]["output"][0]
            second = await turn(ws, {"model": "gpt-5", "store": False, "previous_response_id": rid,
                                     "input": [{"type": "function_call_output", "call_id": call["call_id"],
                                                "output": "a b"}]})
            assert second[-1]["type"] == "response.completed", second[-1]
            assert second[-1]["response"]["output"][0]["content"][0]["text"] == "done"
        # A new connection does not know the unstored response.
        async with http.ws_connect(emu.url + "/v1/responses") as ws:
            refused = await turn(ws, {"model": "gpt-5", "store": False, "previous_response_id": rid,
                                      "input": user("again")})
            assert refused[-1]["type"] == "error" and refused[-1]["status"] == 400
            assert refused[-1]["error"]["code"] == "previous_response_not_found"
        creates = [r for r in emu.requests if r.transport == "ws"]
        assert [r.ws_connection for r in creates] == [1, 1, 2]
        assert [r.status for r in creates] == [200, 200, 400]
        assert emu.ws_upgrades[0] and dict(emu.ws_upgrades[0])["OpenAI-Beta"] == "responses_websockets=2026-02-06"


async def test_input_is_validated_as_on_http_and_the_connection_stays_usable() -> None:
    async with Emulator(validate_requests=openapi_schema.spec_available()) as emu, aiohttp.ClientSession() as http:
        async with http.ws_connect(emu.url + "/v1/responses") as ws:
            orphan = await turn(ws, {"model": "gpt-5", "input": [
                {"type": "function_call_output", "call_id": "call_x", "output": "?"}]})
            assert orphan == [orphan[-1]] and orphan[-1]["type"] == "error"
            await ws.send_str("{not json")
            bad = orjson.loads((await ws.receive(timeout=30)).data)
            assert bad["type"] == "error" and bad["error"]["code"] == "invalid_json"
            await ws.send_str('{"type": "response.teleport"}')
            unknown = orjson.loads((await ws.receive(timeout=30)).data)
            assert unknown["type"] == "error" and unknown["error"]["param"] == "type"
            nomodel = await turn(ws, {"input": user("hi")})
            assert nomodel[-1]["error"]["code"] == "missing_required_parameter"
            ok = await turn(ws, {"model": "gpt-5", "input": user("hi")})
            assert ok[-1]["type"] == "response.completed"
        assert emu.ws_other_messages == [{"type": "response.teleport"}]


async def test_a_warm_up_generates_nothing_and_can_be_chained_from() -> None:
    async with Emulator(validate_requests=openapi_schema.spec_available()) as emu, aiohttp.ClientSession() as http:
        async with http.ws_connect(emu.url + "/v1/responses") as ws:
            warm = await turn(ws, {"model": "gpt-5", "store": False, "generate": False, "input": user("hi")})
            assert [e["type"] for e in warm][-1] == "response.completed"
            assert warm[-1]["response"]["output"] == []
            real = await turn(ws, {"model": "gpt-5", "store": False, "input": [],
                                   "previous_response_id": warm[-1]["response"]["id"]})
            assert real[-1]["type"] == "response.completed"
        assert emu.pending() == 0


async def test_refused_upgrade_and_the_connection_limit() -> None:
    async with Emulator(ws_refuse=426) as emu, aiohttp.ClientSession() as http:
        try:
            await http.ws_connect(emu.url + "/v1/responses")
        except aiohttp.WSServerHandshakeError as exc:
            assert exc.status == 426
        else:
            raise AssertionError("the upgrade was accepted")
        assert emu.requests[-1].transport == "ws" and emu.requests[-1].status == 426
    async with (Emulator(ws_connection_limit=0.2) as emu, aiohttp.ClientSession() as http,
                http.ws_connect(emu.url + "/v1/responses") as ws):
        limit = orjson.loads((await ws.receive(timeout=30)).data)
        assert limit["error"]["code"] == "websocket_connection_limit_reached"
        closing = await ws.receive(timeout=30)
        assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1000


async def test_lanes_run_at_the_same_time_each_fifo_and_echo_their_stream_id() -> None:
    """`stream_id` lanes: a create held on lane `a` does not hold lane `b`; each lane's events echo its
    `stream_id`; a second create on lane `a` waits for the first; a lane may fork from another lane's response."""
    release = asyncio.Event()

    async def hold_slow(rec) -> None:
        if rec.json.get("stream_id") == "a" and "slow" in orjson.dumps(rec.json["input"]).decode():
            await release.wait()

    async with Emulator(validate_requests=openapi_schema.spec_available()) as emu, aiohttp.ClientSession() as http:
        emu.before_answer = hold_slow
        async with http.ws_connect(emu.url + "/v1/responses") as ws:
            for lane, said in (("a", "slow one"), ("a", "after the slow one"), ("b", "quick one")):
                await ws.send_str(orjson.dumps({"type": "response.create", "stream_id": lane, "model": "gpt-5",
                                                "store": False, "input": user(said)}).decode())
            seen: list[dict[str, Any]] = []
            while not (seen and seen[-1]["type"] == "response.completed"):
                seen.append(orjson.loads((await ws.receive(timeout=30)).data))
            assert {e.get("stream_id") for e in seen} == {"b"}, "lane b answered while lane a was held"
            assert len(emu.requests) == 2, "lane a's second create waits behind its first"
            release.set()
            done_a: list[str] = []
            while len(done_a) < 2:
                ev = orjson.loads((await ws.receive(timeout=30)).data)
                assert ev.get("stream_id") == "a", ev
                if ev["type"] == "response.completed":
                    done_a.append(ev["response"]["id"])
            # A new lane forks from lane b's response (store: false: the connection's own, per lane).
            fork = await turn(ws, {"stream_id": "c", "model": "gpt-5", "store": False, "input": user("fork"),
                                   "previous_response_id": seen[-1]["response"]["id"]})
            assert fork[-1]["type"] == "response.completed" and fork[-1]["stream_id"] == "c"
            bad = await turn(ws, {"stream_id": "no spaces", "model": "gpt-5", "input": "x"})
            assert bad[-1]["type"] == "error" and bad[-1]["error"]["param"] == "stream_id"
        said = [orjson.dumps(r.json["input"]).decode() for r in emu.requests]
        assert "slow one" in said[0] and "quick one" in said[1] and "after the slow one" in said[2]
