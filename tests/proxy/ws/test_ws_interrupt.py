"""Codex 0.171's WebSocket control frames through ctproxy (issue 44 (2)): `response.interrupt` (Codex sends it by
default on its Responses-lite path), `response.steer` and `response.inject` reach the upstream as sent and in
the order sent, while a create is streaming; the interrupted response (`incomplete`, reason `interrupted`,
`end_turn: false`) reaches the client as the upstream ended it, is journaled as that (never as a completed
answer, its partial text not an item), and the socket goes on: a create chained from the interrupted response
runs. A plain aiohttp client, `ctproxy up` as a real process, the emulator upstream in WebSocket mode."""

from __future__ import annotations

import asyncio
import sqlite3

import aiohttp
import orjson
import pytest

from tests.emulator import Emulator, Text
from tests.openapi_schema import spec_available
from tests.proxy.ws.test_ws_chain import BETA, TERMINAL, events, turn, user

pytestmark = pytest.mark.timeout(180)
PARTIAL = "a long answer that the user interrupts halfway through"


async def receive_until(ws: aiohttp.ClientWebSocketResponse, done) -> list[dict]:
    got: list[dict] = []
    while True:
        msg = await ws.receive(timeout=60)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        got.append(orjson.loads(msg.data))
        if done(got[-1]):
            return got


async def test_interrupt_steer_and_inject_pass_in_order_and_the_interrupted_turn_is_not_a_failure(
        proxy_factory) -> None:
    async with Emulator(validate_requests=spec_available()) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        # created, in_progress, the item and its part added, 3 of 8 deltas: then the upstream waits
        emu.script(Text(PARTIAL, deltas=8, stall_after=7), Text("after the interrupt"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5", "store": False,
                                            "input": user("write a long answer")}).decode())
            head = await receive_until(ws, lambda e: e["type"] == "response.output_text.delta")
            rid = head[0]["response"]["id"]
            steer = {"type": "response.steer", "previous_response_id": rid,
                     "input": [{"role": "user", "content": "shorter, please"}]}
            inject = {"type": "response.inject", "response_id": rid,
                      "input": [{"type": "function_call_output", "call_id": "call_x", "output": "ok"}]}
            interrupt = {"type": "response.interrupt", "response_id": rid, "mode": "discard_partial_items"}
            for frame in (steer, inject, interrupt):
                await ws.send_str(orjson.dumps(frame).decode())
            # the emulator does not serve steer or inject: its own error for each (the real API's own answers);
            # they and the interrupted end come back in whatever order the upstream sent them
            seen: list[dict] = []
            rest = await receive_until(ws, lambda e: seen.append(e) or (
                any(x["type"] == "response.incomplete" for x in seen)
                and sum(x["type"] == "error" for x in seen) == 2))
            end = next(e for e in rest if e["type"] == "response.incomplete")["response"]
            assert end["id"] == rid and end["status"] == "incomplete"
            assert end["incomplete_details"] == {"reason": "interrupted"} and end["end_turn"] is False
            assert end["output"] == []  # discard_partial_items: the half-written message is not an item
            errors = [e for e in rest if e["type"] == "error"]
            assert all(e["error"]["param"] == "type" for e in errors), errors  # none is ctproxy's, none the turn's
            # the socket goes on: Codex continues from the interrupted response
            nxt = events(await turn(ws, {"model": "gpt-5", "store": False, "previous_response_id": rid,
                                         "input": user("go on")}))
            assert nxt[-1]["type"] == "response.completed", nxt[-1]
            assert nxt[-1]["type"] in TERMINAL
        assert emu.ws_other_messages == [steer, inject, interrupt], "as sent, in the order sent"

    def journal() -> tuple[dict[str, str], list[str]]:
        with sqlite3.connect(proxy.state_dir / "ctproxy.db") as conn:
            rows = dict(conn.execute("SELECT response_id, status FROM journal_responses").fetchall())
            texts = [t for (t,) in conn.execute("SELECT text FROM journal_items WHERE origin = 'output'")]
        return rows, texts

    for _ in range(600):  # the journal writes behind the answer: wait for the second turn's answer in it
        rows, texts = journal()
        if any("after the interrupt" in t for t in texts):
            break
        await asyncio.sleep(0.1)
    assert rows.get(rid) == "incomplete", rows  # journaled as the upstream settled it, not as completed
    assert not [t for t in texts if "interrupts halfway" in t], texts  # the discarded partial text is no item
    assert any("after the interrupt" in t for t in texts), (rows, texts)


async def test_an_interrupted_bridged_turn_stops_its_rounds(proxy_factory) -> None:
    """Issue 44 (2): the upstream ends a bridged round `incomplete` (interrupted) with a bridged call in its
    output. The turn ends there, as the upstream ended it: no round after it (the old code ran the call and
    asked the upstream again), and the client gets the interrupted end, not an answer."""
    from tests.emulator import FunctionCall

    async with Emulator(validate_requests=spec_available()) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "notes"])
        # every event of the call but the terminal one; then the upstream waits for the interrupt
        emu.script(FunctionCall("notes_list_files_by_prefix", {"prefix": ""}, call_id="call_b", stall_after=7),
                   Text("a round after the interrupt"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5", "store": False,
                                            "input": user("list my notes")}).decode())
            head = await receive_until(ws, lambda e: e["type"] == "response.created")
            rid = head[0]["response"]["id"]
            await ws.send_str(orjson.dumps({"type": "response.interrupt", "response_id": rid,
                                            "mode": "discard_partial_items"}).decode())
            rest = await receive_until(ws, lambda e: e["type"] in TERMINAL)
            assert rest[-1]["type"] == "response.incomplete", rest[-1]
            assert rest[-1]["response"]["incomplete_details"] == {"reason": "interrupted"}
            assert rest[-1]["response"]["end_turn"] is False
        # (the old code's second round went up before its terminal event, the only one the client would get)
        assert len(emu.responses_requests) == 1, [r.input_items[-1:] for r in emu.responses_requests]
