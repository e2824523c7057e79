"""Issue 47: the emulator's prompt cache follows the published rules (tests/emulator/cache.py): the longest prefix
seen before, in 128-token steps after 1,024, per `prompt_cache_key`; `prompt_cache_options` (mode, ttl, prewarm);
`input_transformations` `prefix_mismatch` when input before a produced reasoning item is edited. HTTP and WebSocket."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tests.emulator import Emulator, Reasoning, Response, Text
from tests.emulator.cache import cached_steps, first_difference, prompt_parts

BIG = "x" * 8000  # ~2,000 tokens of one user message: above the 1,024-token minimum


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def post(emu: Emulator, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.post(f"{emu.url}/v1/responses", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def cached(resp: dict[str, Any]) -> int:
    return resp["usage"]["input_tokens_details"]["cached_tokens"]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_steps() -> None:
    assert [cached_steps(t) for t in (0, 1023, 1024, 1151, 1152, 5000)] == [0, 0, 1024, 1024, 1152, 4992]


def test_first_difference_names_the_edited_part() -> None:
    a = prompt_parts({"tools": [], "instructions": "i"}, [], [user("a"), user("b")])
    b = prompt_parts({"tools": [], "instructions": "i"}, [], [user("a"), user("B"), user("c")])
    assert first_difference(a, [*a, b"more"]) is None
    assert first_difference(a, b) == 3


async def test_a_repeated_prefix_is_cached_in_steps_and_reported() -> None:
    async with Emulator() as emu:
        first = await post(emu, {"model": "gpt-5", "input": [user(BIG)]})
        assert cached(first) == 0 and first["usage"]["input_tokens_details"]["cache_write_tokens"] > 1024
        second = await post(emu, {"model": "gpt-5", "input": [user(BIG), *first["output"], user("next")]})
        hit = cached(second)
        assert hit >= 1024 and (hit - 1024) % 128 == 0 and hit <= second["usage"]["input_tokens"]
        assert hit >= first["usage"]["input_tokens"] - 128
        # an edit of the first item: a miss from the start
        edited = await post(emu, {"model": "gpt-5", "input": [user("y" + BIG[1:]), user("next")]})
        assert cached(edited) == 0


async def test_the_key_is_the_bucket() -> None:
    async with Emulator() as emu:
        await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "a"})
        other = await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "b"})
        same = await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "a"})
        assert cached(other) == 0 and cached(same) >= 1024


async def test_ttl_expires_and_12h_outlives_it() -> None:
    clock = Clock()
    async with Emulator(clock=clock) as emu:
        await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "short"})
        await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "long",
                         "prompt_cache_options": {"ttl": "12h"}})
        clock.now += 3600  # an hour: past the in-memory default, inside 12 h
        assert cached(await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "short"})) == 0
        assert cached(await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "long"})) >= 1024


async def test_explicit_mode_writes_only_breakpoints() -> None:
    marked = {"role": "user", "content": [{"type": "input_text", "text": BIG,
                                           "prompt_cache_breakpoint": {"mode": "explicit"}}]}
    async with Emulator() as emu:
        await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "e",
                         "prompt_cache_options": {"mode": "explicit"}})
        assert cached(await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "e"})) == 0
        await post(emu, {"model": "gpt-5", "input": [marked, user("tail " * 50)], "prompt_cache_key": "m",
                         "prompt_cache_options": {"mode": "explicit"}})
        hit = await post(emu, {"model": "gpt-5", "input": [marked, user("other " * 50)], "prompt_cache_key": "m"})
        assert cached(hit) >= 1024


async def test_prewarm_writes_without_generating_or_consuming_the_script() -> None:
    async with Emulator() as emu:
        emu.script(Text("scripted"))
        warm = await post(emu, {"model": "gpt-5", "input": [user(BIG)], "prompt_cache_key": "w",
                                "prompt_cache_options": {"prewarm": True}})
        assert warm["output"] == [] and warm["usage"]["output_tokens"] == 0 and emu.pending() == 1
        turn = await post(emu, {"model": "gpt-5", "input": [user(BIG), user("go")], "prompt_cache_key": "w"})
        assert cached(turn) >= 1024 and turn["output"][0]["content"][0]["text"] == "scripted"


async def test_prefix_mismatch_when_input_before_reasoning_is_edited() -> None:
    async with Emulator() as emu:
        emu.script(Response([Reasoning(summary="plan"), Text("one")]), Text("two"), Text("three"))
        first = await post(emu, {"model": "gpt-5", "input": [user("hello"), user(BIG)], "store": False,
                                 "include": ["reasoning.encrypted_content"]})
        kept = await post(emu, {"model": "gpt-5", "store": False,
                                "input": [user("hello"), user(BIG), *first["output"], user("go on")]})
        assert "input_transformations" not in kept
        edited = await post(emu, {"model": "gpt-5", "store": False,
                                  "input": [user("HELLO"), user(BIG), *first["output"], user("go on")]})
        rs = first["output"][0]["id"]
        assert edited["input_transformations"] == [
            {"type": "reasoning", "id": rs, "action": "removed", "reason": "prefix_mismatch"}]


async def test_previous_response_id_chain_is_the_prefix_and_websocket_reports_it() -> None:
    async with Emulator() as emu:
        first = await post(emu, {"model": "gpt-5", "input": [user(BIG)]})
        chained = await post(emu, {"model": "gpt-5", "previous_response_id": first["id"], "input": [user("more")]})
        assert cached(chained) >= 1024
        async with aiohttp.ClientSession() as http, http.ws_connect(f"{emu.url.replace('http', 'ws')}/v1/responses"
                                                                     ) as ws:
            await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5",
                                            "input": [user(BIG), user("ws")]}).decode())
            while True:
                event = orjson.loads((await ws.receive()).data)
                if event["type"] == "response.completed":
                    break
        assert cached(event["response"]) >= 1024


@pytest.mark.parametrize("prewarm", [True])
async def test_websocket_prewarm(prewarm: bool) -> None:
    async with Emulator() as emu:
        emu.script(Text("scripted"))
        async with aiohttp.ClientSession() as http, http.ws_connect(f"{emu.url.replace('http', 'ws')}/v1/responses"
                                                                     ) as ws:
            await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5", "input": [user(BIG)],
                                            "prompt_cache_options": {"prewarm": prewarm}}).decode())
            while True:
                event = orjson.loads((await ws.receive()).data)
                if event["type"] == "response.completed":
                    break
        assert event["response"]["output"] == [] and emu.pending() == 1
