"""Issue 13, end to end (openai SDK → `ctproxy up` → the validating emulator): the context guidance is
inserted once per forwarded request, only when the tools it names are reachable (declared by the agent
or bridged), after the agent's own leading instructions; `[id: …]` markers on the forwarded copy carry
the journal's real item ids (history_read_item reads them), with a switch to turn them off; within one
window consecutive forwarded requests share a byte-identical prefix (the upstream's prompt cache)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import orjson
import pytest

from proxy.windows.notes.bootstrap import GUIDANCE_MARKER, developer_message, guidance_text
from tests.emulator import FunctionCall, Text
from tests.proxy.windows.test_context_rollover import start, text_of

pytestmark = pytest.mark.timeout(120)
ID_RE = re.compile(r"^\[id: (it_[0-9a-f]+)\]$")


def guidances(items: list[dict[str, Any]]) -> list[int]:
    return [k for k, i in enumerate(items) if i.get("role") == "developer" and text_of(i).startswith(GUIDANCE_MARKER)]


async def test_guidance_once_after_the_agents_instructions_and_never_duplicated(emulator, proxy_factory):
    agent = await start(emulator, proxy_factory)
    emulator.script(Text("a"), Text("b"))
    own = {"role": "developer", "content": "You are a careful agent."}
    resent = developer_message(guidance_text(("notes_read_file",)))  # an agent resending an old copy
    await agent.sample(own, {"role": "system", "content": "system rules"}, resent,
                       {"role": "user", "content": "do the work"})
    await agent.sample({"role": "user", "content": "more"})
    for req in emulator.responses_requests:
        items = req.input_items
        assert guidances(items) == [2], items  # exactly one, right after the agent's two leading messages
        assert [text_of(i).split("\n")[-1] for i in items[:2]] == ["You are a careful agent.", "system rules"]
        assert ID_RE.match(items[0]["content"][0]["text"])  # the agent's instructions are recoverable too
        g = text_of(items[2])
        assert "new_context" in g and "notes_write_file" in g and "history_read_item" in g  # the current wording
        assert "Take incremental notes while you work so you do not miss important info." in g


async def test_no_guidance_and_no_markers_without_reachable_tools(emulator, proxy_factory):
    agent = await start(emulator, proxy_factory)
    emulator.script(Text("a"))
    resent = developer_message(guidance_text(("notes_read_file",)))
    agent.history = [resent, {"role": "user", "content": "hi"}]
    resp = await agent.create(input=agent.history)
    assert resp.output_text == "a"
    items = emulator.responses_requests[0].input_items
    assert items == [{"role": "user", "content": "hi"}]  # the resent copy dropped, nothing added


async def test_guidance_for_bridged_tools(emulator, proxy_factory):
    """An agent that declares nothing gets the guidance when the families are bridged."""
    agent = await start(emulator, proxy_factory, ["--bridge", "context,notes"])
    emulator.script(Text("a"))
    await agent.create(input="hello")
    await agent.create(input=[{"role": "user", "content": "hello"}])
    items = emulator.responses_requests[-1].input_items
    assert guidances(items) == [0]
    g = text_of(items[0])
    assert "new_context" in g and "notes_write_file" in g and "history_read_item" not in g  # history not bridged
    assert not any("[id: " in orjson.dumps(i).decode() for i in items)  # no history_read_item: no markers


async def test_id_markers_are_the_journals_ids_and_the_prefix_stays_byte_identical(emulator, proxy_factory):
    agent = await start(emulator, proxy_factory)
    emulator.script(FunctionCall("shell", {"cmd": "ls"}, call_id="c_sh"), Text("done"), Text("again"))
    resp = await agent.sample({"role": "user", "content": "do the work"})
    resp = await agent.sample(*await agent.run_calls(resp))
    await agent.sample({"role": "user", "content": "and more"})
    reqs = emulator.responses_requests
    second, third = reqs[1].input_items, reqs[2].input_items
    assert orjson.dumps(third[:len(second)]) == orjson.dumps(second)  # the prompt cache keeps hitting
    assert orjson.dumps(second[:len(reqs[0].input_items)]) == orjson.dumps(reqs[0].input_items)
    assert reqs[1].json["tools"] == reqs[2].json["tools"] and reqs[1].json.get("instructions") == reqs[2].json.get(
        "instructions")
    assert text_of(third[1]).endswith("This is context window w1.")  # the identity, after the guidance
    user = third[2]
    m = ID_RE.match(user["content"][0]["text"])
    assert m and user["content"][1] == {"type": "input_text", "text": "do the work"}  # beside, not into
    out = next(i for i in third if i.get("type") == "function_call_output")
    assert out["call_id"] == "c_sh" and re.match(r"^\[id: it_[0-9a-f]+\]\nran ", out["output"])
    assert all("[id: " not in orjson.dumps(i).decode() for i in third if i.get("type") in ("function_call",)
               or i.get("role") == "assistant")
    assert agent.history[0] == {"role": "user", "content": "do the work"}  # the agent's copy is its own
    for _ in range(100):  # the id is the journal's: history_read_item reads that very item
        got = await agent.tool("history_read_item", {"item_id": m.group(1), "window_id": "w1"})
        if "do the work" in got.get("text", ""):
            break
        await asyncio.sleep(0.1)
    assert "do the work" in got["text"], got


async def test_the_switch_turns_the_markers_off(emulator, proxy_factory, tmp_path):
    cfg = tmp_path / "ctx.json"
    cfg.write_text(json.dumps({"context": {"id_projection": False}}))
    agent = await start(emulator, proxy_factory, ["--config", str(cfg)])
    emulator.script(Text("a"), Text("b"))
    await agent.sample({"role": "user", "content": "do the work"})
    await agent.sample({"role": "user", "content": "more"})
    items = emulator.responses_requests[1].input_items
    assert guidances(items) == [0]
    assert not any("[id: " in orjson.dumps(i).decode() for i in items[1:])  # the guidance names the markers

