"""Issue 13, end to end (openai SDK → `ctproxy up --bridge context,notes` → the scripted emulator, validating
requests against the official OpenAPI description where it is available): the model saves a note and calls
`new_context` through the bridge, and the bridge goes on with more rounds of the same agent request. Those
later rounds are forwarded in the new window (the notes bootstrap, then what follows), not the old one; the
agent's next request stays in that window, with a byte-identical prefix (prompt cache), whether the agent
resends the answer as the SDK dumps it (null fields dropped) or as it came over the wire."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import orjson
import pytest

from tests.emulator import FunctionCall, Text
from tests.proxy.windows.test_context_rollover import assert_bootstrap, start, text_of

pytestmark = [pytest.mark.validate_requests, pytest.mark.timeout(120)]
NOTE = "checkpoint: the parser is done, the writer is next"




class BridgedAgent:
    """A stateless agent that knows none of ctproxy's tools: the bridge offers and runs them."""

    def __init__(self, agent: Any, stream: bool, resend: str):
        self.agent, self.stream, self.resend = agent, stream, resend
        self.history: list[dict[str, Any]] = []

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(**self.agent.client_args)

    async def sample(self, text: str) -> list[dict[str, Any]]:
        """One agent request; returns the answer's output items in the form this agent resends them."""
        self.history.append({"role": "user", "content": text})
        args = {"model": "gpt-4.1", "store": False, "input": list(self.history)}
        async with self.client() as c:
            if self.stream:
                async with c.responses.stream(**args) as s:
                    resp = await s.get_final_response()
                out = [o.model_dump(mode="json", exclude_none=True) for o in resp.output]
            elif self.resend == "raw":  # the answer's items exactly as they came over the wire
                raw = await c.responses.with_raw_response.create(**args)
                out = orjson.loads(raw.http_response.content)["output"]
            else:
                resp = await c.responses.create(**args)
                out = [o.model_dump(mode="json", exclude_none=True) for o in resp.output]
        self.history.extend(out)
        return out


CASES = [(True, "sdk"), (False, "sdk"), (False, "raw")]


@pytest.mark.parametrize(("stream", "resend"), CASES, ids=["stream", "json", "json-raw"])
async def test_later_rounds_of_the_same_request_go_up_in_the_new_window(emulator, proxy_factory, stream, resend):
    agent = BridgedAgent(await start(emulator, proxy_factory, ["--bridge", "context,notes"]), stream, resend)
    emulator.script(FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": NOTE}, call_id="c_w"),
                    FunctionCall("new_context", {}, call_id="c_nc"),
                    FunctionCall("get_context_remaining", {}, call_id="c_gr"),
                    Text("resumed from the checkpoint"), Text("second answer"))
    out = await agent.sample("do the work")
    assert [(o["type"], o.get("name")) for o in out] == [
        ("mcp_call", "notes_write_file"), ("mcp_call", "new_context"), ("mcp_call", "get_context_remaining"),
        ("message", None)]
    assert out[-1]["content"][0]["text"] == "resumed from the checkpoint"
    reqs = emulator.responses_requests
    assert len(reqs) == 4  # one agent request, four rounds
    # rounds 1 and 2: the old window (the agent's message, then the note write)
    assert "do the work" in orjson.dumps(reqs[1].input_items).decode()
    # round 3, right after the bridged new_context: only the new window's bootstrap, nothing of the old one
    third = reqs[2].input_items
    assert_bootstrap(third, "/root/notes/checkpoint.md")
    assert len(third) == 4 and "do the work" not in orjson.dumps(third).decode()
    assert NOTE not in orjson.dumps(third).decode()  # the index names the note, never its contents
    # round 4: the bootstrap, then what the turn did after it (get_context_remaining's call and output)
    fourth = reqs[3].input_items
    assert orjson.dumps(fourth[:4]) == orjson.dumps(third)
    assert [i.get("type") for i in fourth[4:]] == ["function_call", "function_call_output"]
    assert fourth[4]["call_id"] == fourth[5]["call_id"] == "c_gr"
    assert "window: w2." in fourth[5]["output"]  # the turn's later calls run in the new window too

    # The agent's next request: the same window, byte for byte (no second rollover), then the turn's later
    # items, then the new message; nothing before the boundary (the note write, new_context) comes back.
    await agent.sample("and now?")
    nxt = emulator.responses_requests[4].input_items
    assert orjson.dumps(nxt[:4]) == orjson.dumps(third), [text_of(i)[:80] for i in nxt]
    blob = orjson.dumps(nxt).decode()
    assert "do the work" not in blob and "c_w" not in blob and "c_nc" not in blob
    kinds = [i.get("type", "message") for i in nxt[4:]]
    assert kinds == ["function_call", "function_call_output", "message", "message"], kinds
    assert text_of(nxt[-1]).endswith("and now?") and nxt[-2]["role"] == "assistant"
    assert orjson.dumps(nxt[:6]) == orjson.dumps(fourth[:6])  # what the turn's last round began with, too

    # the journal: both windows; the old window's items readable by the history tools
    async def windows() -> str:
        text = (await agent.agent.tool("history_list_windows", {}))["text"]
        return text if '"w2"' in text else ""

    listing = await until(windows)
    assert '"window_id":"w1"' in listing and '"strategy":"notes"' in listing
    users = (await agent.agent.tool("history_list_items", {"window_id": "w1", "role": "user"}))["text"]
    assert "do the work" in users


async def test_a_bridged_new_context_in_a_mixed_round_waits_for_the_agents_next_request(emulator, proxy_factory):
    """A round with the agent's own call too ends the bridged turn: no further round, so the rollover is
    left for the agent's next request, which starts in the new window."""
    agent = BridgedAgent(await start(emulator, proxy_factory, ["--bridge", "context,notes"]), False, "sdk")
    shell = {"type": "function", "name": "shell", "description": "Run a command.", "strict": False,
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
    from tests.emulator import Response

    emulator.script(Response([FunctionCall("new_context", {}, call_id="c_nc2"),
                              FunctionCall("shell", {"cmd": "ls"}, call_id="c_sh")]), Text("listed"))
    agent.history.append({"role": "user", "content": "list the files"})
    async with agent.client() as c:
        resp = await c.responses.create(model="gpt-4.1", store=False, input=list(agent.history), tools=[shell])
        assert [o.type for o in resp.output] == ["mcp_call", "function_call"]
        agent.history.extend(o.model_dump(mode="json", exclude_none=True) for o in resp.output)
        agent.history.append({"type": "function_call_output", "call_id": "c_sh", "output": "a.txt"})
        await c.responses.create(model="gpt-4.1", store=False, input=list(agent.history), tools=[shell])
    second = emulator.responses_requests[1].input_items
    texts = [text_of(i) for i in second[:4]]
    assert "context window w2" in texts[1] and "list the files" not in orjson.dumps(second).decode()


async def until(check: Any) -> Any:
    for _ in range(200):  # the journal commits windows a moment after they open (≤ 20 s)
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError("not journaled in time")


# ---------------------------------------------------------------- the pure parts (proxy/windows/notes/midturn.py)


def test_reanchored_finds_the_boundary_in_another_form_and_nothing_else():
    from proxy.items.canonical import chain_at, session_root
    from proxy.windows.apply import WindowProjection, apply_window
    from proxy.windows.notes import midturn

    root = session_root("s1")
    shown = [{"type": "mcp_call", "id": "mcp_ctpf_c1", "name": "new_context", "arguments": "{}",
              "server_label": "ctproxy", "output": "ok", "error": None, "status": "completed"}]
    sent = [{"role": "user", "content": "go"}, *shown]
    proj = WindowProjection("w2", 2, chain_at(sent, root, 2) or "", root, ({"role": "developer", "content": "boot"},))
    assert midturn.anchor_of(shown) == "mcp_ctpf_c1" and midturn.anchor_of([]) is None
    # the SDK's resend drops the null field: the positional check fails, the anchor finds the boundary
    resent = [sent[0], {k: v for k, v in shown[0].items() if v is not None}, {"role": "user", "content": "more"}]
    assert apply_window({"input": resent}, proj)[1] == "diverged"
    moved = midturn.reanchored(resent, proj, "mcp_ctpf_c1")
    assert moved is not None and moved.boundary == 2
    out, outcome = apply_window({"input": resent}, moved, checked=True)
    assert outcome == "applied" and out["input"] == [proj.bootstrap[0], resent[2]]
    assert midturn.reanchored(resent, proj, "mcp_ctpf_other") is None  # another conversation: not applied
    assert midturn.reanchored(resent, proj, None) is None


def test_an_agent_that_drops_the_mcp_call_finds_the_boundary_by_an_older_anchor_or_its_own_items():
    """Codex resends no `mcp_call`: the boundary is after the newest shown item it kept, else right after
    the agent's own request items when the resend starts with exactly those."""
    from proxy.items.canonical import chain_at, session_root
    from proxy.windows.apply import WindowProjection, apply_window
    from proxy.windows.notes import midturn

    root = session_root("s1")
    agent = [{"role": "user", "content": "go"}]
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    call = {"type": "mcp_call", "id": "mcp_ctpf_c1", "name": "new_context", "arguments": "{}",
            "server_label": "ctproxy", "output": "ok", "status": "completed"}
    later = [{"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "shell", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c2", "output": "ran"}]
    for shown, kept in (([reasoning, call], [reasoning]), ([call], [])):
        full = [*agent, *shown]
        proj = WindowProjection("w2", len(full), chain_at(full, root, len(full)) or "", root,
                                ({"role": "developer", "content": "boot"},))
        anchors = midturn.anchors_of(shown)
        assert anchors == [i["id"] for i in reversed(shown)]
        prefix = [len(agent), chain_at(agent, root, len(agent))]
        resent = [*agent, *kept, *later]  # the mcp_call left out
        assert apply_window({"input": resent}, proj)[1] == "diverged"
        moved = midturn.reanchored(resent, proj, anchors, prefix)
        assert moved is not None and moved.boundary == len(agent) + len(kept)
        out, outcome = apply_window({"input": resent}, moved, checked=True)
        assert outcome == "applied" and out["input"] == [proj.bootstrap[0], *later]
        other = [{"role": "user", "content": "another conversation"}, *later]
        assert midturn.reanchored(other, proj, anchors, prefix) is None  # not its items: never applied


def test_in_new_window_keeps_everything_but_the_input_and_the_chain():
    from proxy.windows.notes import midturn

    payload = {"model": "m", "tools": [{"type": "function", "name": "t"}], "store": False, "x_unknown": 1,
               "previous_response_id": "resp_old", "input": [{"role": "user", "content": "old"}]}
    boot = [{"role": "developer", "content": "boot"}]
    out = midturn.in_new_window(payload, boot)
    assert out == {"model": "m", "tools": payload["tools"], "store": False, "x_unknown": 1, "input": boot}
    assert payload["input"] == [{"role": "user", "content": "old"}]  # the round's payload is not edited
