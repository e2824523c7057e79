"""Overflow recovery: `context_length_exceeded` in its three forms, recovered invisibly once, or passed
through unchanged when recovery is impossible or fails."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI

from proxy.app.journal_views import tasks_report
from proxy.db import connect
from proxy.items.sse import encode_event
from proxy.state import StateDir
from proxy.windows.fallback import is_fallback_message
from proxy.windows.remote.overflow import CODE, is_overflow, response_error_code, sse_failure_before_output
from tests.emulator import Emulator, ErrorEvent, FailedInStream, Text, context_length_exceeded_400
from tests.proxy.windows.test_compaction_harness import (
    API_KEY,
    codex_turn,
    completed_output_text,
    running_proxy,
    user,
    wait_for_events,
)

WINDOW = 20_000
# Enough older history for a compaction to shrink: the retry must be strictly smaller than what failed.
OLDER = "an older history: " + "h" * 6_000
BIG = [user(f"part {i}: " + "y" * 8_000) for i in range(9)]  # ≈ 18,300 tokens: above 90% of the window


def config(enabled=True, threshold=1.0, recover=True):
    return {"remote_compaction": {"enabled": enabled, "threshold": threshold, "recover_overflow": recover},
            "model_windows": {"gpt-test*": WINDOW}}


# ---- detection (pure) ------------------------------------------------------------------------------

ERR = {"error": {"message": "too long", "type": "invalid_request_error", "param": "input", "code": CODE}}


def sse(*events):
    return b"".join(encode_event(e) for e in events)


def test_http_400_form():
    assert is_overflow(400, "application/json", orjson.dumps(ERR))
    assert not is_overflow(400, "application/json", orjson.dumps({"error": {"code": "invalid_value"}}))
    assert not is_overflow(429, "application/json", orjson.dumps({"error": {"code": "rate_limit_exceeded"}}))
    assert not is_overflow(400, "application/json", b"not json")


def test_response_failed_form():
    body = sse({"type": "response.created", "response": {"id": "r"}},
               {"type": "response.failed", "response": {"id": "r", "status": "failed",
                                                        "error": {"code": CODE, "message": "m"}}})
    assert is_overflow(200, "text/event-stream; charset=utf-8", body)
    assert is_overflow(200, "application/json", orjson.dumps({"object": "response", "status": "failed",
                                                               "error": {"code": CODE}}))


@pytest.mark.parametrize("event", [
    {"type": "error", "sequence_number": 2, "error": {"type": "invalid_request_error", "code": CODE}},
    {"type": "error", "sequence_number": 2, "code": CODE, "message": "m", "param": "input"},
])
def test_error_event_forms(event):
    assert sse_failure_before_output(sse({"type": "response.created"}, event)) == CODE


def test_failure_after_output_is_not_recoverable():
    body = sse({"type": "response.output_item.added", "item": {"type": "message"}},
               {"type": "response.failed", "response": {"error": {"code": CODE}}})
    assert response_error_code(200, "text/event-stream", body) is None


def test_other_failures_are_not_overflow():
    body = sse({"type": "response.failed", "response": {"error": {"code": "server_error"}}})
    assert response_error_code(200, "text/event-stream", body) == "server_error"
    assert not is_overflow(200, "text/event-stream", body)


# ---- end to end ------------------------------------------------------------------------------------

pytestmark_e2e = pytest.mark.timeout(180)


def turns(emu):
    return [r for r in emu.requests if r.route == "responses"]


@pytestmark_e2e
@pytest.mark.parametrize("stream", [False, True])
async def test_http_400_is_recovered_invisibly_for_the_sdk(tmp_path, monkeypatch, stream):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config(), monkeypatch) as base:
        emu.script(context_length_exceeded_400())
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        inp = [user(OLDER), user("the question")]
        if stream:
            text = ""
            async with await client.responses.create(model="gpt-test-1", input=inp, stream=True) as events:
                async for ev in events:
                    if ev.type == "response.output_text.done":
                        text = ev.text
        else:
            text = (await client.responses.create(model="gpt-test-1", input=inp)).output_text
        await client.close()
        assert text == "You said: the question"
        first, retry = turns(emu)
        assert first.status == 400 and retry.status == 200
        assert [r.route for r in emu.requests].count("compact") == 1
        assert retry.json["input"][-1] == user("the question")
        assert any(i.get("type") == "compaction" for i in retry.json["input"])
        want = [("compaction", "remote"), ("recovery", "recovered")]
        events = await wait_for_events(tmp_path / "state" / "ctproxy.db", lambda ev: ev[-2:] == want)
        assert events[-2:] == want
    # `ctproxy tasks` shows them per session (the journal is flushed when the proxy stops)
    report = tasks_report(StateDir.open(tmp_path / "state"))
    assert "compactions 1, recoveries 1" in report
    assert " remote " in report  # the window the compaction opened


@pytestmark_e2e
async def test_feature_off_recovers_with_the_readable_fallback(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config(enabled=False), monkeypatch) as base:
        emu.script(context_length_exceeded_400())
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        answer = await client.responses.create(model="gpt-test-1", input=[user(OLDER), user("q")])
        await client.close()
        assert answer.output_text == "You said: q"
        retry = turns(emu)[-1]
        # the one bootstrap builder (issue 29 (4)): identity and notes index, the fallback, the continuation
        first = retry.json["input"]
        assert "This is context window w2" in orjson.dumps(first[0]).decode()
        assert first[1]["content"][0]["text"].startswith("Existing notes for /root")
        assert is_fallback_message(first[2]) and "Resume the unfinished work" in orjson.dumps(first[3]).decode()
        assert not any(r.route in ("compact", "compaction") for r in emu.requests)  # nothing remote when off


@pytestmark_e2e
async def test_when_the_retry_fails_the_agent_gets_the_original_error_unchanged(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config(), monkeypatch) as base:
        original = context_length_exceeded_400()
        emu.script(original, context_length_exceeded_400())
        async with aiohttp.ClientSession() as http, http.post(
                f"{base}/v1/responses", json={"model": "gpt-test-1", "input": [user("q " + OLDER)]},
                headers={"authorization": f"Bearer {API_KEY}"}) as resp:
            body = await resp.read()
            assert resp.status == 400
        assert orjson.loads(body) == original.body
        assert len(turns(emu)) == 2  # one retry, not a loop
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        emu.script(context_length_exceeded_400(), context_length_exceeded_400())
        with pytest.raises(openai.BadRequestError) as exc:
            await client.responses.create(model="gpt-test-1", input=[user("again " + OLDER)])
        assert exc.value.code == CODE
        await client.close()


@pytestmark_e2e
@pytest.mark.parametrize("failure", [FailedInStream(), ErrorEvent(nested=True), ErrorEvent(nested=False)],
                         ids=["response.failed", "error-nested", "error-flat"])
async def test_in_stream_overflow_above_90_percent_is_recovered(tmp_path, monkeypatch, failure):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config(), monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        emu.script(failure)
        status, events = await codex_turn(http, base, {"model": "gpt-test-1", "input": [*BIG, user("final ask")]})
        assert status == 200
        assert not any(e.get("type") in ("response.failed", "error") for e in events)
        assert completed_output_text(events) == "You said: final ask"
        assert [r.route for r in emu.requests] == ["responses", "compaction", "responses"]
        retry = turns(emu)[-1].json["input"]
        assert retry[-1] == user("final ask")
        assert any(i.get("type") == "compaction" for i in retry)


@pytestmark_e2e
async def test_held_stream_without_failure_is_released_unchanged(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config(), monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        emu.script(Text("a normal long-context answer", deltas=4))
        status, events = await codex_turn(http, base, {"model": "gpt-test-1", "input": [*BIG, user("q")]})
        assert status == 200
        assert completed_output_text(events) == "a normal long-context answer"
        assert [e["type"] for e in events].count("response.output_text.delta") == 4
        assert len(emu.requests) == 1
        # the tap saw the released answer: its usage is recorded like a streamed one's
        for _ in range(100):
            conn = connect(tmp_path / "state" / "ctproxy.db")
            row = conn.execute("SELECT input_tokens FROM usage").fetchone()
            conn.close()
            if row is not None:
                break
            await asyncio.sleep(0.05)
        assert row is not None and row[0] > 18_000


@pytestmark_e2e
async def test_output_before_failure_is_passed_through(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config(), monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        emu.script(FailedInStream(items=[Text("partial")]))
        status, events = await codex_turn(http, base, {"model": "gpt-test-1", "input": [*BIG, user("q")]})
        assert status == 200
        assert events[-1]["type"] == "response.failed"
        assert len(emu.requests) == 1


@pytestmark_e2e
async def test_small_streams_are_not_held_and_the_next_request_compacts(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config(), monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        emu.script(FailedInStream())
        small = [user("short"), user("history")]
        status, events = await codex_turn(http, base, {"model": "gpt-test-1", "input": small})
        assert events[-1]["type"] == "response.failed"  # streamed through: the agent saw it
        assert events[-1]["response"]["error"]["code"] == CODE
        status, events = await codex_turn(http, base, {"model": "gpt-test-1", "input": [*small, user("again")]})
        assert status == 200 and completed_output_text(events) == "You said: again"
        assert [r.route for r in emu.requests] == ["responses", "compaction", "responses"]
        events = await wait_for_events(tmp_path / "state" / "ctproxy.db", lambda ev: ("recovery", "missed") in ev)
        assert ("recovery", "missed") in events


@pytestmark_e2e
async def test_recovery_off_passes_the_400_through(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config(recover=False), monkeypatch) as base:
        emu.script(context_length_exceeded_400())
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model="gpt-test-1", input=[user("q")])
        await client.close()
        assert len(emu.requests) == 1


@pytestmark_e2e
async def test_all_switches_off_pass_the_overflow_through_unchanged(tmp_path, monkeypatch):
    """Issue 29 (7), audit seed004-pipeline 1: with remote_compaction, context, history and web search off in
    the config (recover_overflow left at its default), a context_length_exceeded reaches the agent unchanged:
    no compaction, no retry, and status says recovery is off."""
    from proxy.app.status import capability_status
    from proxy.config import Config

    off = {"web_search": {"enabled": False}, "remote_compaction": {"enabled": False},
           "context": {"enabled": False}, "history": {"enabled": False}, "notes": {"enabled": False},
           "model_windows": {"gpt-test*": WINDOW}}
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, off, monkeypatch) as base:
        emu.script(context_length_exceeded_400())
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            await client.responses.create(model="gpt-test-1", input=[user(OLDER), user("q")])
        await client.close()
        assert err.value.code == CODE
        assert len(emu.requests) == 1  # no retry, no compaction call
    cfg = Config.model_validate(off)
    assert not cfg.recovers_overflow()
    st = capability_status(cfg, "remote_compaction")
    assert st.state == "off" and "reaches the agent unchanged" in st.reason
    # context on (its default) keeps recovery with the readable fallback, and status says so
    on = Config.model_validate({**off, "context": {"enabled": True}})
    assert on.recovers_overflow()
    assert "readable fallback" in capability_status(on, "remote_compaction").reason
