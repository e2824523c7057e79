"""Issue 29: the context-window contracts users feel (seed 000; audits seed000-defects 3–7, 16 and
seed004-pipeline-defects 1). Each test failed before the change it covers."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from proxy.config import load_config
from proxy.usage import model_window
from proxy.windows.notes.checkpoint_turn import CHOICE as CHECKPOINT_CHOICE
from tests.support.cli import ctproxy as cli

REPO = Path(__file__).resolve().parents[3]




# ---- model windows from the config ---------------------------------------------------------------------

def test_config_set_model_windows_keeps_the_specific_entries(tmp_path):
    """`ctproxy config set model_windows …` saves keys sorted ("*" first); a specific entry still wins."""
    state = tmp_path / "state"
    table = {"gpt-test-big": 400_000, "gpt-test*": 50_000, "*": 8_000}
    out = cli("config", "set", "model_windows", json.dumps(table), "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    saved = json.loads((state / "config.json").read_text())["model_windows"]
    assert next(iter(saved)) == "*"  # what the file holds: sorted
    cfg = load_config(state / "config.json")
    assert model_window("gpt-test-big", cfg.model_windows) == 400_000  # the exact name
    assert model_window("gpt-test-1", cfg.model_windows) == 50_000  # the longer glob
    assert model_window("other", cfg.model_windows) == 8_000  # "*" only when nothing else matches


def test_defaults_resolve_whatever_their_order():
    from proxy.config import DEFAULT_MODEL_WINDOWS

    backwards = dict(reversed(list(DEFAULT_MODEL_WINDOWS.items())))
    for model in ("gpt-5", "gpt-5-codex-mini", "gpt-4.1-mini", "o3", "gpt-4o", "unknown-model"):
        assert model_window(model, backwards) == model_window(model, DEFAULT_MODEL_WINDOWS)
    assert model_window("gpt-4.1-mini", backwards) == 1_047_576


# ---- read-your-writes: once the proxy has answered, tools and the CLI see that answer ---------------------

async def _tool(http, proxy, name: str, task: str, agent: str) -> dict:
    token = (proxy.state_dir / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": agent}
    async with http.post(proxy.tools_url + f"/v1/tools/{name}", headers=headers, json={}) as r:
        return await r.json()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stream", [False, True])
async def test_an_answered_request_is_seen_at_once(emulator, proxy_factory, stream):
    """Audits seed000 16 and issue 29 "Registration is read-your-writes": right after the SDK has the
    answer, the checkpoint route knows the agent (not 404 "registered agents: none"), and
    get_context_remaining reports that answer's usage, its text and details agreeing. No polling."""
    import openai

    from tests.emulator import Text

    proxy = await proxy_factory(upstream=emulator.url)
    task = cli("task", "new", "--state-dir", str(proxy.state_dir)).stdout.strip()
    token = (proxy.state_dir / "token").read_text().strip()
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                           default_headers={"x-ctp-task": task, "x-ctp-agent": "/root/worker"})
    async with aiohttp.ClientSession() as http:
        for n, used in enumerate((1200, 3400)):
            emulator.script(Text(f"answer {n}", usage={"input_tokens": used - 100, "output_tokens": 100}))
            if stream:
                async with c.responses.stream(model="gpt-4.1", input=f"question {n}") as s:
                    await s.get_final_response()
            else:
                await c.responses.create(model="gpt-4.1", input=f"question {n}")
            res = await _tool(http, proxy, "get_context_remaining", task, "/root/worker")
            assert res["details"]["used_tokens"] == used, res  # this answer's, not the one before
            assert res["details"]["agents"] == ["/root/worker"]
            assert "Agents registered in this task: /root/worker." in res["text"]
        await c.close()
        # a new agent's first answer: the checkpoint route knows it at once (not "registered agents: none")
        c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                               default_headers={"x-ctp-task": task, "x-ctp-agent": "/root/other"})
        emulator.script(Text("hello"))
        await c.responses.create(model="gpt-4.1", input="first")
        await c.close()
        async with http.post(proxy.tools_url + "/v1/context/checkpoint", headers={"Authorization": f"Bearer {token}"},
                             json={"task": task, "agent": "/root/other"}) as r:
            assert r.status == 200, await r.text()


# ---- (1) items that came in with a rollover are filed in the window whose bootstrap they follow ----------

@pytest.mark.timeout(120)
async def test_a_steer_after_a_rollover_is_in_the_new_window(emulator, proxy_factory):
    """Audit seed000 3: the steer sent with new_context's output follows the w2 bootstrap with an [id: …]
    marker; history_read_item with w2 reads it, and history_list_items (w2, role=user) lists it."""
    import asyncio
    import re

    from tests.emulator import FunctionCall, Response, Text
    from tests.proxy.windows.test_context_rollover import start, text_of

    agent = await start(emulator, proxy_factory)
    emulator.script(Response([FunctionCall("new_context", {}, call_id="c_nc")]), Text("resumed"))
    resp = await agent.sample({"role": "user", "content": "do the work"})
    outs = await agent.run_calls(resp)
    await agent.sample(*outs, {"role": "user", "content": "steer: also check X"})
    forwarded = emulator.responses_requests[1].input_items
    assert any("context window w2" in text_of(i) for i in forwarded if i.get("role") == "developer")
    steer = text_of(forwarded[-1])
    found = re.match(r"\[id: ([^\]]+)\]", steer)
    assert found is not None and steer.endswith("steer: also check X"), steer
    item_id = found.group(1)
    read: dict = {}
    for _ in range(100):  # the journal's writer commits the window a moment after it opens
        async with aiohttp.ClientSession() as http, http.post(
                f"{agent.proxy.tools_url}/v1/tools/history_read_item", headers=agent.tool_headers,
                json={"item_id": item_id, "window_id": "w2"}) as r:
            read = await r.json()
        if read.get("ok"):
            break
        await asyncio.sleep(0.1)
    assert read.get("ok") and "steer: also check X" in read["text"], read
    users = (await agent.tool("history_list_items", {"window_id": "w2", "role": "user"}))["text"]
    assert "steer: also check X" in users
    old = (await agent.tool("history_list_items", {"window_id": "w1", "role": "user"}))["text"]
    assert "do the work" in old and "steer" not in old


# ---- (4) the identity in the first window ---------------------------------------------------------------

@pytest.mark.timeout(120)
async def test_the_first_window_names_the_agent_and_w1(emulator, proxy_factory):
    """Audit seed000 7: the first forwarded request of a session that can call the history tools names its
    agent address and "w1" (what history_read_item takes), once, after the guidance; the next keeps it."""
    from proxy.windows.notes.bootstrap import GUIDANCE_MARKER
    from tests.emulator import Text
    from tests.proxy.windows.test_context_rollover import start, text_of

    agent = await start(emulator, proxy_factory)
    emulator.script(Text("hi"), Text("again"))
    await agent.sample({"role": "developer", "content": "be brief"}, {"role": "user", "content": "hello"})
    first = emulator.responses_requests[0].input_items
    texts = [text_of(i) for i in first]
    assert texts[1].startswith(GUIDANCE_MARKER)
    assert texts[2] == f"You are agent /root of task {agent.task}. This is context window w1."
    assert sum(t.startswith("You are agent ") for t in texts) == 1
    await agent.sample({"role": "user", "content": "more"})
    second = emulator.responses_requests[1].input_items
    assert [text_of(i) for i in second[:3]] == texts[:3]  # byte-stable within the window (prompt cache)


# ---- (2) a pending rollover applies to stateful clients too ----------------------------------------------

@pytest.mark.timeout(120)
async def test_new_context_rolls_a_stateful_chain_over(emulator, proxy_factory):
    """Audit seed000 4(a): a client chaining by previous_response_id. After new_context, its next request
    goes up without the id, as the w2 bootstrap plus its new message; the chain then continues from that
    answer (forwarded unchanged), and nothing is pending any more."""
    import openai

    from tests.emulator import Text
    from tests.proxy.windows.test_context_rollover import start, text_of

    agent = await start(emulator, proxy_factory)
    emulator.script(Text("one"), Text("two"), Text("three"))
    async with openai.AsyncOpenAI(**agent.client_args) as c:
        r1 = await c.responses.create(model="gpt-4.1", store=True, input="hello stateful")
        assert (await agent.tool("new_context", {}))["details"]["pending_rollover"] == "new_context"
        r2 = await c.responses.create(model="gpt-4.1", store=True, previous_response_id=r1.id, input="next")
        assert r2.output_text == "two"
        second = emulator.responses_requests[1]
        assert "previous_response_id" not in second.json
        texts = [text_of(i) for i in second.input_items]
        # (no guidance: this client declares no history/notes/context tool, so it is sent to none either)
        assert texts[0] == f"You are agent /root of task {agent.task}. This is context window w2. The previous " \
                           "window is w1; earlier windows are not readable from here (no history tool is available " \
                           "to you)."
        assert texts[1].startswith("Existing notes for /root") and "Resume the unfinished work" in texts[2]
        assert texts[3:] == ["next"]
        left = await agent.tool("get_context_remaining", {})
        assert left["details"]["pending_rollover"] is None and "pending" not in left["text"]
        assert left["details"]["window_id"] == "w2"
        r3 = await c.responses.create(model="gpt-4.1", store=True, previous_response_id=r2.id, input="more")
        assert r3.output_text == "three"
        third = emulator.responses_requests[2]
        assert third.json["previous_response_id"] == r2.id  # the chain goes on, in the new window
        assert [text_of(i) for i in third.input_items] == ["more"]


@pytest.mark.timeout(120)
async def test_a_manual_checkpoint_rolls_a_stateful_chain_over(emulator, proxy_factory):
    """Issue 29 (2): `ctproxy context checkpoint` for a client chaining by previous_response_id. Its next request
    runs the checkpoint turn on the upstream's chain (the id kept, the write tool offered), then goes up without
    the id in w2, whose bootstrap names the note; nothing is left pending."""
    import openai

    from tests.emulator import FunctionCall, Text
    from tests.proxy.windows.test_context_rollover import start, text_of

    agent = await start(emulator, proxy_factory)
    emulator.script(Text("one"), FunctionCall("notes_write_file", {"path": "chain.md", "text": "where I am"},
                                              call_id="c_ck"), Text("two"), Text("three"))
    async with openai.AsyncOpenAI(**agent.client_args) as c:
        r1 = await c.responses.create(model="gpt-4.1", store=True, input="hello stateful")
        assert (await agent.checkpoint())["pending_rollover"] == "checkpoint"
        r2 = await c.responses.create(model="gpt-4.1", store=True, previous_response_id=r1.id, input="next")
        assert r2.output_text == "two"
        turn, second = emulator.responses_requests[1], emulator.responses_requests[2]
        assert turn.json["tool_choice"] == CHECKPOINT_CHOICE
        assert turn.json["previous_response_id"] == r1.id  # the turn sees the window: the upstream's chain
        assert [t["name"] for t in turn.json["tools"]] == ["notes_write_file"]
        assert [p.read_text() for p in (agent.proxy.state_dir / "notes").rglob("chain.md")] == ["where I am"]
        assert "previous_response_id" not in second.json
        texts = [text_of(i) for i in second.input_items]
        assert "This is context window w2" in texts[0] and '"path":"/root/notes/chain.md"' in texts[1]
        assert texts[-1] == "next"
        left = await agent.tool("get_context_remaining", {})
        assert left["details"]["pending_rollover"] is None and left["details"]["window_id"] == "w2"
        r3 = await c.responses.create(model="gpt-4.1", store=True, previous_response_id=r2.id, input="more")
        assert r3.output_text == "three"
        assert emulator.responses_requests[3].json["previous_response_id"] == r2.id  # the chain goes on in w2


@pytest.mark.timeout(120)
async def test_a_stateful_rollover_keeps_an_output_with_its_call(emulator, proxy_factory):
    """Issue 29 (2), issue 28: the request that applies the rollover drops previous_response_id, so the outputs
    it carries would answer calls the upstream no longer sees ("No tool call found …"). Each goes up right after
    its call, carried from the journal (without the stored item's id); the chain then continues in w2."""
    import openai

    from tests.emulator import FunctionCall, Text
    from tests.proxy.windows.test_context_rollover import start, text_of

    agent = await start(emulator, proxy_factory)
    shell = {"type": "function", "name": "shell", "description": "run a command",
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
    emulator.script(FunctionCall("shell", {"cmd": "ls"}, call_id="c_sh"), Text("two"), Text("three"))
    async with openai.AsyncOpenAI(**agent.client_args) as c:
        r1 = await c.responses.create(model="gpt-4.1", store=True, input="list the files", tools=[shell])
        assert (await agent.tool("new_context", {}))["details"]["pending_rollover"] == "new_context"
        out = {"type": "function_call_output", "call_id": "c_sh", "output": "a.txt"}
        r2 = await c.responses.create(model="gpt-4.1", store=True, previous_response_id=r1.id, input=[out],
                                      tools=[shell])
        assert r2.output_text == "two"
        second = emulator.responses_requests[1]
        assert "previous_response_id" not in second.json
        items = second.input_items
        assert "context window w2" in text_of(items[0])
        call, output = items[-2:]
        assert (call["type"], call["call_id"], call["name"]) == ("function_call", "c_sh", "shell")
        assert "id" not in call and output == out
        left = await agent.tool("get_context_remaining", {})
        assert left["details"]["pending_rollover"] is None and left["details"]["window_id"] == "w2"
        r3 = await c.responses.create(model="gpt-4.1", store=True, previous_response_id=r2.id, input="more",
                                      tools=[shell])
        assert r3.output_text == "three"
        third = emulator.responses_requests[2]
        assert third.json["previous_response_id"] == r2.id  # the chain goes on, in the new window
        assert [text_of(i) for i in third.input_items] == ["more"]


@pytest.mark.timeout(120)
async def test_a_bridged_new_context_rolls_a_stateful_turn_over(emulator, proxy_factory):
    """Issue 29 (2) over the bridge's own rounds: a client chaining by previous_response_id, the model calls the
    bridged new_context; the bridge's next round goes up in w2 (no previous_response_id, the bootstrap), not
    as the old window's continuation; the agent's next request chains from the merged id (the last round)."""
    import openai

    from tests.emulator import FunctionCall, Text
    from tests.proxy.windows.test_context_rollover import start, text_of

    agent = await start(emulator, proxy_factory, ["--bridge", "context,notes"])
    emulator.script(Text("one"), FunctionCall("new_context", {}, call_id="c_nc"), Text("after"), Text("three"))
    async with openai.AsyncOpenAI(**agent.client_args) as c:
        r1 = await c.responses.create(model="gpt-4.1", store=True, input="hello stateful")
        r2 = await c.responses.create(model="gpt-4.1", store=True, previous_response_id=r1.id, input="go on")
        assert r2.output_text == "after"
        rolled = emulator.responses_requests[2]
        assert "previous_response_id" not in rolled.json
        texts = [text_of(i) for i in rolled.input_items]
        assert any("context window w2" in t for t in texts) and "hello stateful" not in texts, texts
        left = await agent.tool("get_context_remaining", {})
        assert left["details"]["pending_rollover"] is None and left["details"]["window_id"] == "w2"
        r3 = await c.responses.create(model="gpt-4.1", store=True, previous_response_id=r2.id, input="more")
        assert r3.output_text == "three"
        third = emulator.responses_requests[3]  # (the emulator knows the id it chains from: the round in w2)
        assert third.json.get("previous_response_id") and [text_of(i) for i in third.input_items] == ["more"]


# ---- (1) a bridged mid-turn rollover: earlier rounds in the old window, later ones in the new -------------

@pytest.mark.timeout(120)
async def test_a_bridged_mid_turn_rollover_files_each_round_in_its_window(emulator, proxy_factory):
    """Issue 29 (1), its second half: the answer of a turn whose bridged new_context rolled the window over is
    journaled once, at its end; what the model said before the rollover stays in w1 (it followed w1's
    context), what it said after goes in w2 (it followed w2's bootstrap)."""
    import asyncio

    import openai

    from tests.emulator import FunctionCall, Response, Text
    from tests.proxy.windows.test_context_rollover import start

    agent = await start(emulator, proxy_factory, ["--bridge", "context,notes"])
    emulator.script(Response([Text("saving the state first"), FunctionCall("new_context", {}, call_id="c_nc")]),
                    Text("resumed in the new window"))
    async with openai.AsyncOpenAI(**agent.client_args) as c:
        resp = await c.responses.create(model="gpt-4.1", store=False, input="do the work")
    assert resp.output_text.endswith("resumed in the new window")
    w1 = w2 = ""
    for _ in range(100):  # the journal commits the answer a moment after it ends
        w1 = (await agent.tool("history_list_items", {"window_id": "w1", "role": "assistant"}))["text"]
        w2 = (await agent.tool("history_list_items", {"window_id": "w2", "role": "assistant"}))["text"]
        if "resumed" in w1 + w2:
            break
        await asyncio.sleep(0.1)
    assert "saving the state first" in w1 and "resumed in the new window" not in w1, w1
    assert "resumed in the new window" in w2 and "saving the state first" not in w2, w2


# ---- (5) a first turn's budget: an estimate of the request, labelled as one ---------------------------

@pytest.mark.timeout(120)
async def test_a_first_turn_budget_is_an_estimate_labelled_as_one(emulator, proxy_factory):
    """Before the session's first answer with usage, get_context_remaining said "unknown". Now it reports an
    estimate of the forwarded request (text and details say it is one); the first answer's usage replaces it."""
    import asyncio

    import openai

    from tests.emulator import Text
    from tests.proxy.windows.test_context_rollover import start

    agent = await start(emulator, proxy_factory)
    emulator.script(Text("a slow first answer", latency=6.0))
    async with openai.AsyncOpenAI(**agent.client_args) as c:
        pending = asyncio.ensure_future(c.responses.create(model="gpt-4.1", input="x" * 4000))
        left: dict = {}
        for _ in range(50):  # while the upstream has not answered yet
            await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as http, http.post(
                    f"{agent.proxy.tools_url}/v1/tools/get_context_remaining", headers=agent.tool_headers,
                    json={}) as r:
                left = await r.json()
            if r.status == 200 and left["details"]["state"] == "estimated":
                break
        assert not pending.done()
        assert left["details"]["state"] == "estimated" and left["details"]["estimated"] is True, left
        assert left["text"].startswith("You have about ") and "an estimate" in left["text"]
        assert 900 <= left["details"]["used_tokens"] <= 2000, left["details"]  # 4,000 characters, 4 a token
        await pending
    after = await agent.tool("get_context_remaining", {})
    assert after["details"]["state"] == "known" and after["details"]["estimated"] is False
    assert after["text"].startswith("You have ") and "estimate" not in after["text"].splitlines()[0]
