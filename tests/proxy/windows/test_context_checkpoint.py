"""Issue 13, end to end: the checkpoint turn. At the hard trigger (or for a manual checkpoint) ctproxy
itself runs one turn upstream before forwarding the agent's request: the current window plus the
checkpoint instruction, only the agent's own-notes write tool offered and required; it executes that
one write through the tool server, rolls over, and forwards the agent's request in the new window
(whose notes index lists the note). A failed write is corrected once; a turn without a write still
rolls over (never a loop, never an overflow to the agent)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from proxy.windows.fallback import is_fallback_message
from proxy.windows.notes.checkpoint_turn import CHOICE as CHECKPOINT_CHOICE
from tests.emulator import FunctionCall, Text
from tests.proxy.windows.test_context_reminder import BIG
from tests.proxy.windows.test_context_rollover import start, text_of

pytestmark = pytest.mark.timeout(120)


async def configured(emulator: Any, proxy_factory: Any, tmp_path: Any) -> Any:
    cfg = tmp_path / "ctx.json"
    cfg.write_text(json.dumps({"model_windows": {"gpt-4.1": 4_000},
                               "context": {"reminder_ratio": 0.4, "hard_ratio": 0.5}}))
    return await start(emulator, proxy_factory, ["--config", str(cfg)])


def is_turn(req: Any) -> bool:
    return (req.json or {}).get("tool_choice") == CHECKPOINT_CHOICE


async def fill(agent: Any) -> None:
    """One request, the session's first (no usage yet: the hard trigger does not act on it): its answer records
    ≈ 3,000 of 4,000 tokens, so the next request's estimate (that usage plus its new items) is above the trigger.
    (Sent as two requests, the second's estimate, the first's small usage plus BIG, would already be.)"""
    await agent.sample({"role": "user", "content": "small start"}, {"role": "user", "content": BIG})


async def test_hard_trigger_runs_the_checkpoint_turn_then_forwards_in_the_new_window(emulator, proxy_factory,
                                                                                     tmp_path):
    agent = await configured(emulator, proxy_factory, tmp_path)
    emulator.script(Text("a"),
                    FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": "half done"}, call_id="c_ck"),
                    Text("resumed"), Text("later"))
    await fill(agent)
    resp = await agent.sample({"role": "user", "content": "go on"})
    assert resp.output_text == "resumed"  # the agent only sees its answer arrive a little later
    reqs = emulator.responses_requests
    turn, fwd = reqs[1], reqs[2]
    # the tools the request before went up with (the prompt's cached head, issue 47), the write required
    assert is_turn(turn) and turn.json["tools"] == reqs[0].json["tools"]
    assert turn.json["stream"] is False and turn.json["parallel_tool_calls"] is False
    last = turn.input_items[-1]
    assert last["role"] == "developer" and "checkpoint note" in text_of(last)
    assert BIG in json.dumps(turn.input_items)  # the current window, whole
    notes = list((agent.proxy.state_dir / "notes").rglob("checkpoint.md"))
    assert len(notes) == 1 and notes[0].read_text() == "half done"
    texts = [text_of(i) for i in fwd.input_items[:4]]
    assert "context window w2" in texts[1] and '"path":"/root/notes/checkpoint.md"' in texts[2]
    assert text_of(fwd.input_items[-1]).endswith("go on") and BIG not in json.dumps(fwd.input_items)
    await agent.sample({"role": "user", "content": "next"})  # the stale usage does not trigger it again
    assert len(emulator.responses_requests) == 4 and not is_turn(emulator.responses_requests[3])


async def test_the_hard_trigger_acts_on_the_requests_estimate_not_the_last_usage_alone(emulator, proxy_factory,
                                                                                        tmp_path):
    """Issue 29, one rule with compaction (ADR 0011 decision 11): the last answer used a few tokens of the 4,000
    (far below the trigger at 2,000), but this request's new items (BIG, ≈ 3,000 tokens) put its estimate
    above it: the checkpoint turn runs before this request is forwarded, not one request too late."""
    agent = await configured(emulator, proxy_factory, tmp_path)
    emulator.script(Text("a"),
                    FunctionCall("notes_write_file", {"path": "early.md", "text": "before the big read"},
                                 call_id="c_e"),
                    Text("resumed"))
    await agent.sample({"role": "user", "content": "small start"})
    resp = await agent.sample({"role": "user", "content": BIG})
    assert resp.output_text == "resumed"
    reqs = emulator.responses_requests
    assert len(reqs) == 3 and is_turn(reqs[1]) and not is_turn(reqs[2])
    assert BIG in json.dumps(reqs[1].input_items)  # the turn sees the request that fills the window
    assert [p.read_text() for p in (agent.proxy.state_dir / "notes").rglob("early.md")] == ["before the big read"]
    assert "context window w2" in text_of(reqs[2].input_items[1])  # forwarded in the new window


async def test_a_failed_write_is_corrected_once(emulator, proxy_factory, tmp_path):
    agent = await configured(emulator, proxy_factory, tmp_path)
    emulator.script(Text("a"),
                    FunctionCall("notes_write_file", {"path": "../../escape.md", "text": "x"}, call_id="c_bad"),
                    FunctionCall("notes_write_file", {"path": "ck.md", "text": "fixed"}, call_id="c_ok"),
                    Text("resumed"))
    await fill(agent)
    resp = await agent.sample({"role": "user", "content": "go on"})
    assert resp.output_text == "resumed"
    second_turn = emulator.responses_requests[2]
    assert is_turn(second_turn)
    outs = [i for i in second_turn.input_items if i.get("type") == "function_call_output"]
    assert outs and outs[-1]["call_id"] == "c_bad"  # the error, for the one correction
    assert [p.read_text() for p in (agent.proxy.state_dir / "notes").rglob("ck.md")] == ["fixed"]
    assert '"path":"/root/notes/ck.md"' in text_of(emulator.responses_requests[3].input_items[2])


@pytest.mark.parametrize("answer", ["text", "other_agents_notes"])
async def test_a_failed_turn_falls_back_to_compaction_without_a_loop(emulator, proxy_factory, tmp_path, answer):
    """No write (or a write to another agent's notes, which never lifts the fence): the readable
    compaction fallback replaces the window; the agent gets its answer; the next request runs no turn."""
    agent = await configured(emulator, proxy_factory, tmp_path)
    failed = [Text("I will not write")] if answer == "text" else [
        FunctionCall("notes_write_file", {"path": "/root/reviewer/notes/x.md", "text": "x"}, call_id="c_o"),
        Text("I still will not write")]  # (after the one correction round)
    emulator.script(Text("a"), *failed, Text("resumed"), Text("later"))
    await fill(agent)
    resp = await agent.sample({"role": "user", "content": "go on"})
    assert resp.output_text == "resumed"
    k = 1 + len(failed)  # the turn's requests, then the agent's
    fwd = emulator.responses_requests[k].input_items
    assert any(map(is_fallback_message, fwd[:5])) and BIG not in json.dumps(fwd)  # compacted: the window shrank
    # a failed turn's window starts as every window does (issue 29 (4)): identity, notes index, continuation
    texts = [text_of(i) for i in fwd]
    at = next(i for i, item in enumerate(fwd) if is_fallback_message(item))
    assert "This is context window w2" in texts[at - 2] and texts[at - 1].startswith("Existing notes for /root")
    assert "Resume the unfinished work" in texts[at + 1]
    assert text_of(fwd[-1]).endswith("go on")
    assert not list((agent.proxy.state_dir / "notes").rglob("x.md"))
    await agent.sample({"role": "user", "content": "next"})
    assert len(emulator.responses_requests) == k + 2 and not is_turn(emulator.responses_requests[k + 1])
    assert any(map(is_fallback_message, emulator.responses_requests[k + 1].input_items[:5]))  # still in effect


async def test_manual_checkpoint_runs_the_turn_at_the_next_request(emulator, proxy_factory):
    agent = await start(emulator, proxy_factory)
    emulator.script(Text("a"), FunctionCall("notes_write_file", {"path": "manual.md", "text": "m"}, call_id="c_m"),
                    Text("resumed"))
    await agent.sample({"role": "user", "content": "do the work"})
    assert (await agent.checkpoint())["pending_rollover"] == "checkpoint"
    resp = await agent.sample({"role": "user", "content": "continue"})
    assert resp.output_text == "resumed"
    assert is_turn(emulator.responses_requests[1])
    fwd = emulator.responses_requests[2].input_items
    assert '"path":"/root/notes/manual.md"' in text_of(fwd[2]) and text_of(fwd[-1]).endswith("continue")


# ---- issue 29 (2)(3): a manual checkpoint is served, and an unsaved one keeps the window ---------------

async def journaled(agent: Any, want: Any) -> tuple[list[str], list[str]]:
    """(window ids, event outcomes) of /root once `want(windows, events)` holds (the journal writes in the
    background), or as they are after a generous bound."""
    import asyncio

    from proxy.db import connect

    windows: list[str] = []
    events: list[str] = []
    for _ in range(200):
        conn = connect(agent.proxy.state_dir / "ctproxy.db")
        try:
            windows = [r[0] for r in conn.execute("SELECT window_id FROM journal_windows WHERE task_id=? AND "
                                                  "address=? ORDER BY ordinal", (agent.task, "/root"))]
            events = [r[0] for r in conn.execute("SELECT detail FROM journal_events ORDER BY id")] \
                if conn.execute("SELECT 1 FROM sqlite_master WHERE name='journal_events'").fetchone() else []
        finally:
            conn.close()
        if want(windows, events):
            break
        await asyncio.sleep(0.05)
    return windows, events


@pytest.mark.parametrize("answer", ["text", "other_agents_notes_twice"])
async def test_an_unsaved_manual_checkpoint_keeps_the_window(emulator, proxy_factory, answer):
    """Audit seed000 5: no write (or a write to another agent's notes, after its one correction round): the
    agent's request goes on in the current window, whole; no fallback, no new window, no second turn."""
    agent = await start(emulator, proxy_factory)
    wrong = FunctionCall("notes_write_file", {"path": "/root/reviewer/notes/ck.md", "text": "x"}, call_id="c_w")
    failed = [Text("no note")] if answer == "text" else [wrong, wrong]
    emulator.script(Text("a"), *failed, Text("resumed"), Text("later"))
    await agent.sample({"role": "user", "content": "do the work"})
    assert (await agent.checkpoint())["pending_rollover"] == "checkpoint"
    resp = await agent.sample({"role": "user", "content": "continue"})
    assert resp.output_text == "resumed"
    turns = emulator.responses_requests[1:1 + len(failed)]
    assert all(map(is_turn, turns))
    if len(turns) == 2:  # the correction round says what was wrong
        outs = [i for i in turns[1].input_items if i.get("type") == "function_call_output"]
        assert outs[-1]["call_id"] == "c_w" and "own notes (/root/notes/)" in outs[-1]["output"]
    fwd = emulator.responses_requests[1 + len(failed)].input_items
    assert not any(map(is_fallback_message, fwd)) and "do the work" in json.dumps(fwd)  # the window, kept
    assert text_of(fwd[-1]).endswith("continue")
    assert not list((agent.proxy.state_dir / "notes").rglob("ck.md"))
    await agent.sample({"role": "user", "content": "next"})
    assert not is_turn(emulator.responses_requests[-1])  # consumed: not run again
    windows, events = await journaled(agent, lambda w, e: any("kept_window" in (x or "") for x in e))
    assert windows == ["w1"] and any("kept_window" in (x or "") for x in events)


async def test_a_wrong_path_is_corrected_once_then_rolls_over(emulator, proxy_factory):
    agent = await start(emulator, proxy_factory)
    emulator.script(Text("a"),
                    FunctionCall("notes_write_file", {"path": "/root/reviewer/notes/ck.md", "text": "x"},
                                 call_id="c_w"),
                    FunctionCall("notes_write_file", {"path": "ck.md", "text": "mine"}, call_id="c_ok"),
                    Text("resumed"))
    await agent.sample({"role": "user", "content": "do the work"})
    await agent.checkpoint()
    assert (await agent.sample({"role": "user", "content": "continue"})).output_text == "resumed"
    assert [p.read_text() for p in (agent.proxy.state_dir / "notes").rglob("ck.md")] == ["mine"]
    assert '"path":"/root/notes/ck.md"' in text_of(emulator.responses_requests[3].input_items[2])
    assert (await journaled(agent, lambda w, e: w[-1:] == ["w2"]))[0][-1] == "w2"


async def test_a_manual_checkpoint_offers_the_write_tool_itself(emulator, proxy_factory):
    """Audit seed000 4(b): an agent whose requests neither declare nor bridge notes_write_file (only its own
    shell tool) still gets its manual checkpoint: the turn offers the write tool, the window rolls over."""
    from tests.proxy.windows.test_context_rollover import SHELL_SPEC

    agent = await start(emulator, proxy_factory)
    emulator.script(Text("a"), FunctionCall("notes_write_file", {"path": "m.md", "text": "m"}, call_id="c_m"),
                    Text("resumed"))
    await agent.create(input=[{"role": "user", "content": "do the work"}], tools=[SHELL_SPEC])
    await agent.checkpoint()
    resp = await agent.create(input=[{"role": "user", "content": "do the work"},
                                     {"role": "assistant", "content": "a"},
                                     {"role": "user", "content": "continue"}], tools=[SHELL_SPEC])
    assert resp.output_text == "resumed"
    turn = emulator.responses_requests[1]
    # the agent's tools kept (the prompt's cached head), the write tool appended: it had none
    before = emulator.responses_requests[0].json["tools"]  # as the request before went up (web search's too)
    assert is_turn(turn) and turn.json["tools"][: len(before)] == before
    assert [t.get("name") for t in turn.json["tools"][len(before):]] == ["notes_write_file"]
    fwd = emulator.responses_requests[2]
    assert [t["name"] for t in fwd.json["tools"] if t["type"] == "function"] == ["shell"]  # its own, unchanged
    assert (await journaled(agent, lambda w, e: w[-1:] == ["w2"]))[0][-1] == "w2"
    async with aiohttp.ClientSession() as http, http.post(
            f"{agent.proxy.tools_url}/v1/tools/get_context_remaining", json={}, headers=agent.tool_headers) as r:
        assert (await r.json())["details"]["pending_rollover"] is None


async def test_a_checkpoint_that_cannot_be_served_is_refused_when_marked(emulator, proxy_factory, tmp_path):
    """Issue 29 (2): with notes off, the notes strategy has no note to write: refused with the reason, never
    left pending for ever."""
    cfg = tmp_path / "nonotes.json"
    cfg.write_text(json.dumps({"notes": {"enabled": False}}))
    agent = await start(emulator, proxy_factory, ["--config", str(cfg)])
    emulator.script(Text("a"))
    await agent.sample({"role": "user", "content": "do the work"})
    async with aiohttp.ClientSession() as http, http.post(
            f"{agent.proxy.tools_url}/v1/context/checkpoint", headers=agent.tool_headers,
            json={"task": agent.task, "agent": "/root"}) as r:
        body = await r.json()
        assert r.status == 409 and body["error"]["code"] == "notes_off"
        assert "notes.enabled false" in body["error"]["message"]
