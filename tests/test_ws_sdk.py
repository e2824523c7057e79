"""The `openai` SDK's own Responses WebSocket client (`client.responses.connect()`) through ctproxy (issue 28):
two creates on one connection, the second chained by `previous_response_id` with `store: false`, both run
through the chain (journal, request log) and over ctproxy's socket to the emulator."""

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
        emu.script(Text("first over the sdk"), Text("second over the sdk"))
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
        await client.close()
        assert [r.output_text for r in done] == ["first over the sdk", "second over the sdk"]
        creates = [r for r in emu.requests if r.transport == "ws" and r.route == "responses"]
        assert len(creates) == 2 and {r.ws_connection for r in creates} == {1}
        assert creates[1].json["previous_response_id"] == done[0].id
        for _ in range(200):
            if proxy.log().count("transport=ws") >= 3:
                break
            await asyncio.sleep(0.05)
        lines = [ln for ln in proxy.log().splitlines() if "ctproxy-request POST /v1/responses" in ln]
        assert len(lines) == 2 and all("transport=ws" in ln for ln in lines)
