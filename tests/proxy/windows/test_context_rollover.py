"""Issue 13, end to end (openai SDK → `ctproxy up` → the validating emulator): `new_context` rolls the
session over at its very next forwarded request, in each of the four cases seed 000 lists as Pi's
limits (only terminating tools; a mixed batch; a steer; a follow-up). The next forwarded request starts
with the notes bootstrap (guidance → identity → notes index → continuation), the agent's trailing
messages follow unchanged, the window's prefix is byte-identical from one request to the next (prompt
cache), the journal keeps every item and the history tools read the old window."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.windows.notes.bootstrap import GUIDANCE_MARKER, INCREMENTAL_NOTES_LINE
from tests.emulator import FunctionCall, Response, Text

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[3]

NEW_CONTEXT_SPEC = {"type": "function", "name": "new_context", "description": "Start a new context window.",
                    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}
SHELL_SPEC = {"type": "function", "name": "shell", "description": "Run a command.",
              "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
NOTES_SPEC = {"type": "function", "name": "notes_write_file", "description": "Write a note.",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                             "text": {"type": "string"}}}}
READ_ITEM_SPEC = {"type": "function", "name": "history_read_item", "description": "Read a history item.",
                  "parameters": {"type": "object", "properties": {"item_id": {"type": "string"},
                                                                 "window_id": {"type": "string"}}}}
TOOLS = [NEW_CONTEXT_SPEC, SHELL_SPEC, NOTES_SPEC, READ_ITEM_SPEC]


def text_of(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def plain(item: Any) -> dict[str, Any]:
    """An output item as the agent resends it (the SDK's model, as JSON)."""
    return item.model_dump(mode="json", exclude_none=True)


class Agent:
    """A stateless agent (like Codex): declares its own tools, runs new_context and notes writes through
    the tool server's REST API as its task's /root, and resends its whole history every turn."""

    def __init__(self, proxy: Any, task: str):
        self.proxy, self.task = proxy, task
        self.client_args = {"base_url": proxy.url + "/v1", "api_key": "sk-test-ctx", "max_retries": 0,
                            "default_headers": {"x-ctp-task": task, "x-ctp-agent": "/root"}}
        token = (proxy.state_dir / "token").read_text().strip()
        self.tool_headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": "/root"}
        self.history: list[dict[str, Any]] = []

    async def tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.post(
                f"{self.proxy.tools_url}/v1/tools/{name}", json=args, headers=self.tool_headers) as r:
            body = await r.json()
            assert r.status == 200, body
            return body

    async def checkpoint(self) -> dict[str, Any]:
        """POST /v1/context/checkpoint for this agent, once the journal has committed the agent's session."""
        body: dict[str, Any] = {}
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                async with http.post(f"{self.proxy.tools_url}/v1/context/checkpoint", headers=self.tool_headers,
                                     json={"task": self.task, "agent": "/root"}) as r:
                    body = await r.json()
                    if r.status == 200:
                        return body
                await asyncio.sleep(0.1)  # the journal writes the session in the background
        raise AssertionError(body)

    async def create(self, **kwargs: Any) -> Any:
        """One Responses call with a client closed right after (no client outlives its test's loop)."""
        async with openai.AsyncOpenAI(**self.client_args) as client:
            return await client.responses.create(model="gpt-4.1", store=False, **kwargs)

    async def sample(self, *new: dict[str, Any]) -> Any:
        self.history.extend(new)
        resp = await self.create(input=list(self.history), tools=TOOLS)
        self.history.extend(plain(o) for o in resp.output)
        return resp

    async def run_calls(self, resp: Any) -> list[dict[str, Any]]:
        """The outputs of the model's calls: new_context and notes writes run for real, shell is faked."""
        outs = []
        for o in resp.output:
            if o.type != "function_call":
                continue
            if o.name in ("new_context", "notes_write_file"):
                text = (await self.tool(o.name, orjson.loads(o.arguments or "{}")))["text"]
            else:
                text = "ran " + o.arguments
            outs.append({"type": "function_call_output", "call_id": o.call_id, "output": text})
        return outs


async def start(emulator: Any, proxy_factory: Any, extra: list[str] | None = None) -> Agent:
    proxy = await proxy_factory(upstream=emulator.url, extra_args=extra or [])
    task = subprocess.run([sys.executable, "-m", "proxy.app.cli", "task", "new", "--state-dir", str(proxy.state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout.strip()
    return Agent(proxy, task)


def is_inline_note(item: dict[str, Any]) -> bool:
    """The newest note's text, carried for an agent that cannot call notes_read_file (seed000-defects.md 5)."""
    return item.get("role") == "user" and text_of(item).startswith("Your newest note, ")


def bootstrap_of(items: list[dict[str, Any]]) -> list[str]:
    """The texts of the leading developer messages the proxy put in front (past an inline note)."""
    out = []
    for item in items:
        if is_inline_note(item):
            continue
        if item.get("role") != "developer":
            break
        out.append(text_of(item))
    return out


def assert_bootstrap(items: list[dict[str, Any]], note_path: str | None) -> int:
    texts = bootstrap_of(items)
    assert len(texts) == 4, texts
    guidance, identity, index, cont = texts
    assert guidance.startswith(GUIDANCE_MARKER) and INCREMENTAL_NOTES_LINE in guidance
    assert "new_context" in guidance and "notes_write_file" in guidance
    assert identity.startswith("You are agent /root of task ") and "context window w2" in identity
    assert "previous window is w1" in identity
    assert index.startswith("Existing notes for /root at this context-window reset")
    if note_path is None:
        assert "none (your notes directory is empty)" in index
    else:
        lines = [orjson.loads(line) for line in index.splitlines()[1:]]
        assert [x["path"] for x in lines] == [note_path] and lines[0]["bytes"] > 0 and "updated_at" in lines[0]
        assert "checkpoint: half done" not in index  # never the notes' contents
    assert "Resume the unfinished work" in cont and "wait for the user" in cont
    return len(texts) + sum(map(is_inline_note, items[:len(texts) + 1]))


def old_items_absent(items: list[dict[str, Any]]) -> None:
    blob = orjson.dumps(items).decode()
    assert "do the work" not in blob and "c_nc" not in blob


CASES = ["only_terminating", "mixed_batch", "steer", "follow_up"]


@pytest.mark.parametrize("case", CASES)
async def test_next_sampling_is_in_the_new_window(emulator, proxy_factory, case):
    agent = await start(emulator, proxy_factory)
    first = [FunctionCall("new_context", {}, call_id="c_nc")]
    if case == "mixed_batch":
        first = [FunctionCall("shell", {"cmd": "ls"}, call_id="c_sh"), *first,
                 FunctionCall("shell", {"cmd": "pwd"}, call_id="c_sh2")]
    emulator.script(Response(first), Text("resumed"), Text("second answer"))
    resp = await agent.sample({"role": "user", "content": "do the work"})
    outs = await agent.run_calls(resp)
    trailing: list[dict[str, Any]] = []
    if case == "steer":  # the user steers while the tools ran: sent with their outputs
        trailing = [{"role": "user", "content": "steer: also check the logs"}]
    elif case == "follow_up":  # the turn was stopped after the tools; the user follows up
        trailing = [{"role": "user", "content": "follow-up: and then?"},
                    {"role": "user", "content": "follow-up 2"}]
    await agent.sample(*outs, *trailing)
    second = emulator.responses_requests[1].input_items
    n = assert_bootstrap(second, None)
    old_items_absent(second)
    # the agent's trailing messages follow the bootstrap unchanged (the [id: …] marker beside them)
    tail = second[n:]
    assert [text_of(m).split("\n")[-1] for m in tail] == [t["content"] for t in trailing]
    assert all(m["content"][0]["text"].startswith("[id: ") for m in tail)
    # the next request stays in the window; its forwarded prefix is byte-identical (prompt cache)
    await agent.sample({"role": "user", "content": "one more"})
    third = emulator.responses_requests[2].input_items
    assert orjson.dumps(third[:len(second)]) == orjson.dumps(second)
    assert text_of(third[-1]).endswith("one more") and third[-2]["role"] == "assistant"


async def test_checkpoint_note_new_context_and_history_of_the_old_window(emulator, proxy_factory):
    """The session saves a note and calls new_context: the bootstrap indexes the note (metadata only),
    the journal keeps every item of both windows, and history_list_items reads the old one."""
    agent = await start(emulator, proxy_factory)
    emulator.script(FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": "checkpoint: half done"},
                                 call_id="c_w"),
                    FunctionCall("new_context", {}, call_id="c_nc"), Text("resumed"))
    resp = await agent.sample({"role": "user", "content": "do the work"})
    resp = await agent.sample(*await agent.run_calls(resp))
    await agent.sample(*await agent.run_calls(resp))
    third = emulator.responses_requests[2].input_items
    n = assert_bootstrap(third, "/root/notes/checkpoint.md")
    old_items_absent(third)
    assert len(third) == n  # nothing of the agent's history follows: the boundary is after the last output
    body: dict[str, Any] = {}
    for _ in range(100):  # the journal writes in the background
        body = await agent.tool("history_list_items", {"window_id": "w1", "tool_name": "new_context"})
        if "new_context" in body.get("text", ""):
            break
        await asyncio.sleep(0.1)
    assert '"window_id":"w1"' in body["text"] and "new_context" in body["text"], body
    users = (await agent.tool("history_list_items", {"window_id": "w1", "role": "user"}))["text"]
    assert "do the work" in users
    notes = (await agent.tool("history_list_items", {"window_id": "w1", "tool_name": "notes_write_file"}))["text"]
    assert "notes_write_file" in notes, notes
    windows = ""
    for _ in range(100):  # windows are committed by the journal's writer a moment after they open
        windows = (await agent.tool("history_list_windows", {}))["text"]
        if '"w2"' in windows:
            break
        await asyncio.sleep(0.1)
    assert '"window_id":"w1"' in windows and '"window_id":"w2"' in windows and '"strategy":"notes"' in windows


async def test_without_a_rollover_nothing_is_replaced(emulator, proxy_factory):
    """No pending rollover: the agent's items go up as sent (guidance and markers beside them)."""
    agent = await start(emulator, proxy_factory)
    emulator.script(Text("a"), Text("b"))
    await agent.sample({"role": "user", "content": "do the work"})
    await agent.sample({"role": "user", "content": "more"})
    items = emulator.responses_requests[1].input_items
    assert [i.get("role") for i in items] == ["developer", "developer", "user", "assistant", "user"]  # + identity
    assert "do the work" in text_of(items[2])


async def test_rest_checkpoint_route_is_mounted(emulator, proxy_factory):
    """`POST /v1/context/checkpoint` on the running tool server marks the session's agent."""
    agent = await start(emulator, proxy_factory)
    emulator.script(Text("a"))
    await agent.sample({"role": "user", "content": "do the work"})
    body = await agent.checkpoint()
    async with aiohttp.ClientSession() as http:
        assert body["ok"] and body["task"] == agent.task and body["pending_rollover"] == "checkpoint"
        async with http.post(f"{agent.proxy.tools_url}/v1/context/checkpoint",
                             json={"task": agent.task, "agent": "/root"}) as r:
            assert r.status == 401  # behind the bearer token
        async with http.post(f"{agent.proxy.tools_url}/v1/context/checkpoint", headers=agent.tool_headers,
                             json={"task": "task_nope", "agent": "/root"}) as r:
            assert r.status == 404 and (await r.json())["error"]["code"].startswith("unknown_")


async def test_a_rollover_is_counted_in_the_metrics(emulator, proxy_factory):
    from tests.proxy.app.test_metrics import _until, _value

    agent = await start(emulator, proxy_factory)
    emulator.script(Response([FunctionCall("new_context", {}, call_id="c_m")]), Text("resumed"))
    resp = await agent.sample({"role": "user", "content": "do the work"})
    await agent.sample(*await agent.run_calls(resp))
    token = (agent.proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http:
        await _until(http, agent.proxy, token,
                     lambda s: _value(s, "ctproxy_rollovers_total", strategy="notes") == 1)
