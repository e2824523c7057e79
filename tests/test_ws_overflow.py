"""Overflow recovery over the Responses WebSocket (issue 28): the upstream's `context_length_exceeded` error
event on ctproxy's socket is compacted and retried by the chain's compaction stage — over the same socket —
before anything reached the client, as on HTTP (tests/test_overflow.py)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.emulator import Emulator, context_length_exceeded_400
from tests.test_compaction_harness import API_KEY, running_proxy, user
from tests.test_overflow import OLDER, config
from tests.test_ws_chain import TERMINAL

pytestmark = pytest.mark.timeout(180)


async def test_an_overflow_event_is_compacted_and_retried_before_the_client_sees_anything(tmp_path) -> None:
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config()) as base, \
            aiohttp.ClientSession() as http:
        emu.script(context_length_exceeded_400())
        async with http.ws_connect(base + "/v1/responses", headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
            create = {"type": "response.create", "model": "gpt-test-1", "input": [user(OLDER), user("the question")]}
            await ws.send_str(orjson.dumps(create).decode())
            events = []
            while not events or events[-1]["type"] not in TERMINAL:
                msg = await ws.receive(timeout=60)
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                events.append(orjson.loads(msg.data))
        assert [e for e in events if e["type"] == "error"] == [], "the client never saw the overflow"
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "You said: the question"
        first, retry = [r for r in emu.requests if r.route == "responses"]
        assert (first.transport, first.status) == ("ws", 400) and (retry.transport, retry.status) == ("ws", 200)
        assert first.ws_connection == retry.ws_connection == 1, "the retry went over the same socket"
        assert any(i.get("type") == "compaction" for i in retry.json["input"])
        compact = [r for r in emu.requests if r.route == "compact"]
        assert len(compact) == 1 and compact[0].transport == "http"
        assert "x-ctproxy-ws" not in {k.lower() for k, _ in compact[0].headers}, "the key never leaves ctproxy"
