"""The `openai` SDK's own Responses WebSocket client (`client.responses.connect()`, openai 3.60) through ctproxy
(issue 28): two creates on one connection, the second chained by `previous_response_id` with `store: false`, both
run through the chain (journal, request log) and over ctproxy's socket to the emulator; a bad frame (the SDK's
`send_raw`) gets an error event and the connection stays usable; a create on a lane (`stream_id`) comes back on
its lane."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.emulator import Emulator, Text
from tests.openapi_schema import spec_available

pytest.importorskip("websockets", reason="the SDK's WebSocket client needs `websockets` (pyproject test extras)")
pytestmark = pytest.mark.timeout(180)


async def test_the_sdk_websocket_client_chains_two_creates_through_ctproxy(proxy_factory) -> None:
    async with Emulator(validate_requests=spec_available()) as emu:
        proxy = await proxy_factory(upstream=emu.url)
        emu.script(Text("first over the sdk"), Text("second over the sdk"), Text("third on a lane"))
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-sdk-ws", max_retries=0)
        done: list[object] = []
        async with client.responses.connect(max_retries=0) as conn:
            await conn.response.create(model="gpt-5", store=False, input="hello from the sdk")
            async for event in conn:
                if event.type == "response.completed":
                    done.append(event.response)
                    break
                assert event.type != "error", event
            await conn.response.create(model="gpt-5", store=False, input="and again",
                                       previous_response_id=done[0].id)
            async for event in conn:
                if event.type == "response.completed":
                    done.append(event.response)
                    break
                assert event.type != "error", event
            await conn.send_raw("{not json at all")
            bad = await conn.recv()
            assert bad.type == "error" and bad.error.code == "invalid_json", bad
            await conn.response.create(model="gpt-5", store=False, input="on a lane", stream_id="lane_1",
                                       previous_response_id=done[1].id)
            async for event in conn:
                assert getattr(event, "stream_id", None) == "lane_1", event
                if event.type == "response.completed":
                    done.append(event.response)
                    break
                assert event.type != "error", event
        await client.close()
        assert [r.output_text for r in done] == ["first over the sdk", "second over the sdk", "third on a lane"]
        creates = [r for r in emu.requests if r.transport == "ws" and r.route == "responses"]
        assert len(creates) == 3 and {r.ws_connection for r in creates} == {1}
        assert creates[1].json["previous_response_id"] == done[0].id
        for _ in range(200):
            if proxy.log().count("transport=ws") >= 3:
                break
            await asyncio.sleep(0.05)
        for _ in range(200):
            if proxy.log().count("ctproxy-request POST /v1/responses") >= 3:
                break
            await asyncio.sleep(0.05)
        lines = [ln for ln in proxy.log().splitlines() if "ctproxy-request POST /v1/responses" in ln]
        assert len(lines) == 3 and all("transport=ws" in ln for ln in lines)
