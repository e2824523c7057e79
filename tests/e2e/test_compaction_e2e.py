"""End to end: agent → proxy (full chain) → emulator. A long session crosses the threshold, is compacted
once, every later request starts with the retained user messages and the exact compaction item; a
model switch gets the readable fallback; a failing compaction degrades to the fallback."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from proxy.db import connect
from proxy.windows.fallback import is_fallback_message
from proxy.windows.remote import store
from tests.emulator import Emulator, HttpError
from tests.openapi_schema import spec_available, validate
from tests.proxy.windows.test_compaction_harness import (
    API_KEY,
    assistant,
    codex_turn,
    completed_output_text,
    running_proxy,
    user,
    wait_for_checkpoints,
    wait_for_events,
)

pytestmark = pytest.mark.timeout(180)

WINDOW = 20_000  # tokens; threshold 0.8 → compaction above 16,000 (≈ 64 KB)
CONFIG = {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": WINDOW, "*": 128_000}}
TURN_TEXT = "x" * 5_800  # ≈ 1,450 tokens per user turn


def turn_text(i: int) -> str:
    return f"turn {i}: " + TURN_TEXT


async def drive_codex_session(http, base, emu, turns, model="gpt-test-1", history=None):
    """A stateless client like Codex CLI: resends its whole history, appends the answer."""
    history = history if history is not None else []
    for i in turns:
        history.append(user(turn_text(i)))
        status, events = await codex_turn(http, base, {"model": model, "input": list(history), "store": False})
        assert status == 200, events
        text = completed_output_text(events)
        assert text.startswith("You said"), events[-1]
        history.append(assistant(text))
    return history


def compaction_requests(emu):
    return [r for r in emu.requests if r.route == "compaction"]


def turn_requests(emu):
    return [r for r in emu.requests if r.route == "responses"]


async def test_codex_session_compacts_once_then_replays_then_falls_back_on_model_switch(tmp_path, monkeypatch):
    # With shared/'s OpenAPI file beside the clone, the emulator also validates every request against it.
    async with Emulator(validate_requests=spec_available()) as emu, \
            running_proxy(tmp_path, emu.url, CONFIG, monkeypatch) as base, aiohttp.ClientSession() as http:
        history = await drive_codex_session(http, base, emu, range(1, 10))
        assert compaction_requests(emu) == []  # below the threshold so far
        history = await drive_codex_session(http, base, emu, range(10, 14), history=history)
        comps = compaction_requests(emu)
        assert len(comps) == 1, "compacted exactly once"
        comp = comps[0]
        headers = {k.lower(): v for k, v in comp.headers}
        assert "remote_compaction_v2" in headers["x-codex-beta-features"]
        # the harness signs in with ChatGPT: a sign-in never goes to a gateway, trusted or not (issue 31)
        assert "authorization" not in headers and "chatgpt-account-id" not in headers
        assert comp.json["input"][-1] == {"type": "compaction_trigger"}
        assert sum(1 for i in comp.json["input"] if i.get("type") == "compaction_trigger") == 1
        assert comp.path == "/backend-api/codex/responses"

        # The compaction item as the emulator produced it (from its SSE), byte for byte in the store.
        conn = connect(tmp_path / "state" / "ctproxy.db")
        (cp,) = await wait_for_checkpoints(tmp_path / "state" / "ctproxy.db")
        assert cp.strategy == "remote" and cp.reason == "threshold"
        assert cp.window_id and cp.window_id.startswith("w")  # the journal opened the window at the boundary
        item = orjson.loads(cp.compaction_item)
        assert item["type"] == "compaction" and item["encrypted_content"]

        after = [r for r in turn_requests(emu) if r.received_at > comp.received_at]
        assert len(after) >= 2
        for req in after:
            inp = req.json["input"]
            k = inp.index(item)  # the exact compaction item …
            assert [m for m in inp[:k]] == list(cp.retained)  # … right after the retained user messages
            assert all(m["role"] == "user" for m in inp[:k])
            assert not any(is_fallback_message(m) for m in inp)
            if spec_available():
                validate("CreateResponse", req.json)
        # Retained messages are real user turns, newest kept, bounded to a quarter of the window.
        assert cp.retained[-1]["content"][0]["text"].startswith("turn ")
        assert sum(len(m["content"][0]["text"]) for m in cp.retained) <= WINDOW + 64  # 4 bytes × window/4 + marker

        # The model switches: the opaque item must not be replayed; the readable fallback replaces it.
        history.append(user("now with another model"))
        status, _ = await codex_turn(http, base, {"model": "gpt-test-2", "input": history, "store": False})
        assert status == 200
        last = turn_requests(emu)[-1].json
        assert last["model"] == "gpt-test-2"
        assert is_fallback_message(last["input"][0])
        assert item not in last["input"]
        assert "encrypted_content" not in orjson.dumps(last["input"]).decode()
        assert last["input"][-1] == user("now with another model")
        assert len(compaction_requests(emu)) == 1
        kinds = [(e.kind, e.outcome) for e in store.events(conn)]
        assert ("compaction", "remote") in kinds
        conn.close()


async def test_failing_compaction_degrades_to_fallback_and_is_not_retried(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, CONFIG, monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        emu.script_compaction(HttpError(500))
        history = await drive_codex_session(http, base, emu, range(1, 13))
        assert len(compaction_requests(emu)) == 1
        firsts = [r.json["input"][0] for r in turn_requests(emu)]
        fallback_from = next(i for i, m in enumerate(firsts) if is_fallback_message(m))
        assert all(is_fallback_message(m) for m in firsts[fallback_from:])
        fb_text = firsts[fallback_from]["content"][0]["text"]
        assert "turn 1:" in fb_text  # the excerpt's head …
        # … and the next turns are small again: no second attempt in a loop
        await drive_codex_session(http, base, emu, range(13, 15), history=history)
        assert len(compaction_requests(emu)) == 1
        conn = connect(tmp_path / "state" / "ctproxy.db")
        cps = await wait_for_checkpoints(tmp_path / "state" / "ctproxy.db")
        assert [c.strategy for c in cps] == ["fallback"]
        assert cps[0].reason == "threshold:http_500" and cps[0].compaction_item is None
        events = [(e.kind, e.outcome, e.reason) for e in store.events(conn)]
        assert ("compaction", "fallback", "threshold:http_500") in events
        conn.close()


async def test_api_route_uses_responses_compact_with_the_sdk(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, CONFIG, monkeypatch) as base:
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        history: list = []
        for i in range(1, 14):
            history.append(user(turn_text(i)))
            answer = await client.responses.create(model="gpt-test-1", input=history, store=False)
            assert answer.output_text.startswith("You said")
            history.append(assistant(answer.output_text))
        await client.close()
        compacts = [r for r in emu.requests if r.route == "compact"]
        assert len(compacts) == 1
        assert compacts[0].path == "/v1/responses/compact"
        assert {k.lower(): v for k, v in compacts[0].headers}["authorization"] == f"Bearer {API_KEY}"
        later = [r for r in turn_requests(emu) if r.received_at > compacts[0].received_at]
        assert later
        for req in later:
            assert any(i.get("type") == "compaction" for i in req.json["input"])
            # web search rides along on the same official-kind route
            assert {"type": "web_search"} in req.json["tools"]


async def test_feature_off_leaves_requests_alone(tmp_path, monkeypatch):
    config = {"remote_compaction": {"enabled": False}, "model_windows": {"gpt-test*": WINDOW},
              "web_search": {"backend": "off"}}
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config, monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        history = await drive_codex_session(http, base, emu, range(1, 13))
        assert compaction_requests(emu) == []
        assert turn_requests(emu)[-1].json["input"] == history[:-1]


async def test_client_that_compacts_itself_is_left_alone(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, CONFIG, monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        own = {"type": "compaction", "encrypted_content": "client-own-blob"}
        big = [user(turn_text(i)) for i in range(14)]
        status, _ = await codex_turn(http, base, {"model": "gpt-test-1", "input": [*big, own, user("go")]})
        assert status == 200
        assert compaction_requests(emu) == []
        assert turn_requests(emu)[-1].json["input"] == [*big, own, user("go")]


async def test_diverged_history_is_sent_as_is_and_journaled_once(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, CONFIG, monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        history = await drive_codex_session(http, base, emu, range(1, 12))
        assert len(compaction_requests(emu)) == 1
        edited = [user("turn 1: edited by the agent"), *history[1:4], user("short follow-up")]
        for _ in range(2):
            status, _ = await codex_turn(http, base, {"model": "gpt-test-1", "input": edited})
            assert status == 200
            assert turn_requests(emu)[-1].json["input"] == edited  # nothing replaced
        events = await wait_for_events(tmp_path / "state" / "ctproxy.db",
                                       lambda ev: ("projection", "diverged") in ev)
        assert events.count(("projection", "diverged")) == 1
