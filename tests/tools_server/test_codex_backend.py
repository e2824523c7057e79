"""Codex's history/notes backend routes (`{base_url}/alpha/{history|notes}/v2/<tool>`) answered by ctproxy.

End to end: `ctproxy up` in front of the emulator; a Codex-like client (the `openai` SDK with Codex's
`session_id` header) talks to the proxy, then POSTs backend calls to the proxy's base URL exactly as Codex's
history-notes extension does (arguments + `context`), with its OpenAI key as the bearer. The calls run on
the tool server as the session's task and agent; the upstream never sees them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow, tutils

from addons.codex_backend import CodexBackend, backend_call
from proxy.app import runtime
from proxy.db import connect
from proxy.journal.identity import auto_task_id
from proxy.journal.query import HistoryReader
from proxy.session import resolve_session
from tests.emulator import Emulator, Text
from tools_server.codex_backend import CodexContext, caller_identity, truncate_middle

SESSION = "0199a1b2-c3d4-7e5f-8a9b-codexsession"
AGENT_KEY = "sk-agent-key-not-for-the-tool-server"


def codex_task(session_id: str = SESSION) -> str:
    """The task the journal gives a Codex session (no x-ctp-task) with this session_id header."""
    return auto_task_id(resolve_session({"session_id": session_id}, {}).session_key)


async def backend(http: aiohttp.ClientSession, base: str, namespace: str, tool: str, args: dict[str, Any],
                  agent: str = "/root", headers: dict[str, str] | None = None,
                  session_id: str = SESSION) -> tuple[int, dict[str, Any]]:
    """One call the way Codex's HistoryNotesBackend makes it: POST {base}/alpha/<ns>/v2/<tool>."""
    body = {**args, "context": {"session_id": session_id, "current_agent_name": agent}}
    hdrs = {"Authorization": f"Bearer {AGENT_KEY}", "x-openai-actor-authorization": "actor-biscuit",
            **(headers or {})}
    async with http.post(f"{base}/alpha/{namespace}/v2/{tool}", json=body, headers=hdrs) as resp:
        return resp.status, await resp.json(content_type=None)


def _registered(state_dir: Path, task: str, agent: str | None) -> bool:
    """Whether the journal has the task (agent None) or that agent in it."""
    if not (state_dir / "ctproxy.db").exists():
        return False
    conn = connect(state_dir / "ctproxy.db")
    try:
        reader = HistoryReader(conn)
        return reader.task_exists(task) if agent is None else reader.agent_exists(task, agent)
    finally:
        conn.close()


async def codex_turn(proxy_url: str, state_dir: Path, text: str) -> None:
    """A Codex-like turn through the proxy; returns once the journal has the session's task."""
    client = openai.AsyncOpenAI(base_url=proxy_url + "/v1", api_key=AGENT_KEY, max_retries=0,
                                default_headers={"session_id": SESSION})
    await client.responses.create(model="gpt-5", input=text)
    for _ in range(200):  # the journal writes on its own thread
        if await asyncio.to_thread(_registered, state_dir, codex_task(), None):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the journal never recorded the Codex session's task")


async def test_codex_backend_calls_run_as_the_session(emulator: Emulator, proxy_factory) -> None:
    proxy = await proxy_factory(upstream=emulator.url)
    emulator.set_default(Text("the answer is 42", deltas=2))
    await codex_turn(proxy.url, proxy.state_dir, "remember the marker zebra-7731")
    base = proxy.url + "/v1"
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http:
        status, body = await backend(http, base, "notes", "write_file", {"path": "plan.md", "text": "step 1\nstep 2"})
        assert status == 200 and body["ok"] is True, body
        status, body = await backend(http, base, "notes", "read_file", {"path": "plan.md"})
        assert status == 200 and "step 2" in body["output"], body

        # Same identity as REST with the journal's task for this Codex session and its agent.
        async with http.post(proxy.tools_url + "/v1/tools/notes_read_file", json={"path": "plan.md"},
                             headers={"Authorization": f"Bearer {token}", "x-ctp-task": codex_task(),
                                      "x-ctp-agent": "/root"}) as resp:
            rest = await resp.json()
        assert resp.status == 200 and "step 2" in rest["text"], rest

        # History reads what the proxy journaled for this session (eventually consistent: wait for it).
        found: dict[str, Any] = {}
        for _ in range(200):
            status, found = await backend(http, base, "history", "search_contents", {"query": "zebra-7731"})
            if status == 200 and found.get("ok") and "zebra-7731" in found.get("output", ""):
                break
            await asyncio.sleep(0.05)
        assert "zebra-7731" in found["output"], found

        # A sub-agent the journal does not know in this task runs as the session's own agent (the history
        # and notes tools serve registered agents only): it reads the same note.
        status, body = await backend(http, base, "notes", "read_file", {"path": "plan.md"}, agent="/root/worker")
        assert status == 200 and "step 2" in body["output"], body
        # Once the journal knows /root/worker in the task (a turn of its own there), it has notes of its own.
        worker = openai.AsyncOpenAI(base_url=base, api_key=AGENT_KEY, max_retries=0,
                                    default_headers={"x-ctp-task": codex_task(), "x-ctp-agent": "/root/worker"})
        async with worker:  # closed here: a client left to the collector reports an error into the next test's loop
            await worker.responses.create(model="gpt-5", input="worker here")
        for _ in range(200):  # the journal registers the agent on its writer thread
            if await asyncio.to_thread(_registered, proxy.state_dir, codex_task(), "/root/worker"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the journal never registered /root/worker")
        status, body = await backend(http, base, "notes", "read_file", {"path": "plan.md"}, agent="/root/worker")
        assert "step 2" not in json.dumps(body), body
        status, body = await backend(http, base, "notes", "read_file", {"path": "/root/notes/plan.md"},
                                     agent="/root/worker")
        assert status == 200 and "step 2" in body["output"], body

        # The ChatGPT-auth base URL reaches it the same way.
        status, body = await backend(http, proxy.url + "/backend-api/codex", "notes", "list_files_by_prefix", {})
        assert status == 200 and "plan.md" in body["output"], body

        # Codex's output budget header caps the text the model gets.
        long_text = "x" * 5000
        await backend(http, base, "notes", "write_file", {"path": "long.md", "text": long_text})
        status, body = await backend(http, base, "notes", "read_file", {"path": "long.md"},
                                     headers={"x-openai-tool-output-truncation-policy":
                                              '{"mode":"bytes","limit":200}'})
        assert status == 200 and "bytes truncated" in body["output"] and len(body["output"]) < 300, body

    # None of it went upstream: the emulator saw the two Responses turns and nothing else.
    assert [r.route for r in emulator.requests] == ["responses", "responses"]


async def test_codex_backend_refusals_are_clear(emulator: Emulator, proxy_factory) -> None:
    proxy = await proxy_factory(upstream=emulator.url)
    base = proxy.url + "/v1"
    await codex_turn(proxy.url, proxy.state_dir, "hello")
    async with aiohttp.ClientSession() as http:
        status, body = await backend(http, base, "notes", "delete_everything", {})
        assert status == 404 and body["ok"] is False and body["error"] == "unknown_tool", body
        assert "write_file" in body["message"]
        status, body = await backend(http, base, "notes", "read_file", {"path": "a.md", "colour": "red"})
        assert status == 400 and body["error"] == "invalid_arguments" and "unknown field 'colour'" in body["message"]
        status, body = await backend(http, base, "notes", "write_file", {"path": "a.md"})
        assert status == 400 and "missing required field 'text'" in body["message"], body
        async with http.post(base + "/alpha/notes/v2/read_file", data=b"{not json",
                             headers={"Authorization": f"Bearer {AGENT_KEY}"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"] == "invalid_json"
        async with http.post(base + "/alpha/notes/v2/read_file", json={"path": "a", "context": {"agent": 1}},
                             headers={"Authorization": f"Bearer {AGENT_KEY}"}) as resp:
            refused = await resp.json()
        assert resp.status == 400 and refused["error"] == "invalid_context", refused
        # The tool server itself keeps the REST rules: no token, no call.
        async with http.post(proxy.tools_url + "/v1/alpha/notes/v2/read_file", json={"path": "a.md"},
                             headers={"Authorization": f"Bearer {AGENT_KEY}"}) as resp:
            assert resp.status == 401
    assert [r.route for r in emulator.requests] == ["responses"]


async def test_without_the_tool_server_the_proxy_says_so(emulator: Emulator, proxy_factory) -> None:
    proxy = await proxy_factory(upstream=emulator.url, with_tools=False)
    async with aiohttp.ClientSession() as http:
        status, body = await backend(http, proxy.url + "/v1", "notes", "read_file", {"path": "a.md"})
    assert status == 503 and body["error"]["code"] == "tool_server_unavailable", body
    assert emulator.requests == []


# ---- the pieces ---------------------------------------------------------------------------------


def test_identity_follows_the_journal_and_the_headers() -> None:
    ctx = CodexContext(session_id=SESSION, current_agent_name="/root")
    plain = caller_identity(ctx, {})
    assert (plain.task, plain.agent) == (codex_task(), "/root")
    assert plain.session == resolve_session({"session_id": SESSION}, {}).session_key
    worker_ctx = CodexContext(session_id=SESSION, current_agent_name="/root/worker")
    worker = caller_identity(worker_ctx, {}, registered=lambda task, agent: (task, agent) == (codex_task(),
                                                                                           "/root/worker"))
    assert (worker.task, worker.agent) == (codex_task(), "/root/worker")
    unknown = caller_identity(worker_ctx, {}, registered=lambda task, agent: False)
    assert (unknown.task, unknown.agent) == (codex_task(), "/root")
    joined = caller_identity(ctx, {"x-ctp-task": "task_given", "x-ctp-agent": "/root/lead"})
    assert (joined.task, joined.agent) == ("task_given", "/root/lead")
    direct = caller_identity(None, {"x-ctp-task": "task_given"})
    assert (direct.task, direct.agent) == ("task_given", None)
    with pytest.raises(Exception, match="current_agent_name"):
        caller_identity(CodexContext(session_id=SESSION, current_agent_name="/root/../etc"), {})


def test_truncate_middle_keeps_head_and_tail() -> None:
    assert truncate_middle("short", 100) == "short"
    cut = truncate_middle("a" * 50 + "é" * 50 + "z" * 50, 60)
    assert cut.startswith("a" * 30) and cut.endswith("z" * 30) and "bytes truncated" in cut


@pytest.mark.parametrize(("path", "prefix", "expected"), [
    ("/v1/alpha/notes/v2/read_file", "", ("/v1", "notes", "read_file")),
    ("/backend-api/codex/alpha/history/v2/list_items?x=1", "", ("/backend-api/codex", "history", "list_items")),
    ("/gw/v1/alpha/notes/v2/write_file", "/gw", ("/v1", "notes", "write_file")),
    ("/v1/alpha/shell/v2/exec", "", None),
    ("/v1/alpha/notes/v2/../../tools/exec_command", "", None),
    ("/v1/responses", "", None),
])
def test_backend_paths(path: str, prefix: str, expected: Any) -> None:
    assert backend_call(path, prefix) == expected


def test_the_agents_credentials_never_reach_the_tool_server(tmp_path) -> None:
    runtime.install(runtime.build(state_dir=str(tmp_path / "state"), upstream="http://127.0.0.1:9",
                                  trust_upstream=True))
    try:
        stage = CodexBackend()
        req = tutils.treq(method=b"POST", scheme=b"http", host="127.0.0.1", port=9,
                          path=b"/v1/alpha/notes/v2/read_file", content=b'{"path":"a"}',
                          headers=((b"authorization", f"Bearer {AGENT_KEY}".encode()),
                                   (b"x-openai-actor-authorization", b"actor-biscuit"),
                                   (b"chatgpt-account-id", b"acct"), (b"cookie", b"c=1"),
                                   (b"content-type", b"application/json")))
        flow = tflow.tflow(req=req)
        flow.client_conn.proxy_mode = ProxyMode.parse("reverse:http://127.0.0.1:9")
        with taddons.context(stage) as tctx:
            tctx.options.update(ctp_tools_url="http://127.0.0.1:8788")
            stage.request(flow)
        token = (tmp_path / "state" / "token").read_text().strip()
        assert (flow.request.host, flow.request.port, flow.request.path) == ("127.0.0.1", 8788,
                                                                              "/v1/alpha/notes/v2/read_file")
        assert flow.request.headers["authorization"] == f"Bearer {token}"
        for name in ("x-openai-actor-authorization", "chatgpt-account-id", "cookie"):
            assert name not in flow.request.headers
        assert AGENT_KEY not in str(flow.request.headers)
    finally:
        runtime.uninstall()
