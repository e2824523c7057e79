"""Bridged tools of several kinds (issue 12): apply_patch as the Lark custom tool a GPT-5 model expects
(its custom_tool_call run, the output sent back as custom_tool_call_output); sequential notes writes run in
the order the model wrote them, as the caller's task (x-ctp-task)."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest

from tests.emulator import CustomToolCall, FunctionCall, Response, Text
from tests.support.proxyproc import REPO

pytestmark = pytest.mark.timeout(120)
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello from the bridge\n*** End Patch\n"


async def test_apply_patch_as_custom_tool(emulator, proxy_factory, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    proxy = await proxy_factory(upstream=emulator.url, extra_args=[
        "--bridge", "apply_patch", "--enable", "apply_patch", "--workspace", str(ws)])
    emulator.script(CustomToolCall("apply_patch", PATCH, call_id="c_patch"), Text("patched"))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
    async with c.responses.stream(model="gpt-5", input="add hello.txt") as stream:
        final = await stream.get_final_response()
    assert (ws / "hello.txt").read_text() == "hello from the bridge\n"
    assert [o.type for o in final.output] == ["mcp_call", "message"]
    assert final.output[0].name == "apply_patch" and final.output[0].status == "completed"
    first, second = (r.json for r in emulator.responses_requests)
    spec = next(t for t in first["tools"] if t.get("name") == "apply_patch")
    assert spec["type"] == "custom" and spec["format"]["syntax"] == "lark"
    kinds = [i.get("type") for i in second["input"]]
    assert "custom_tool_call" in kinds and "custom_tool_call_output" in kinds


async def test_sequential_writes_in_order_as_the_callers_task(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "notes"])
    task = subprocess.run([sys.executable, "-m", "proxy.app.cli", "task", "new", "--state-dir", str(proxy.state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout.strip()
    writes = [FunctionCall("notes_write_file", {"path": "order.md", "text": f"write {i}\n"}, call_id=f"c_w{i}")
              for i in range(4)]
    emulator.script(Response(writes), Text("written"))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                           default_headers={"x-ctp-task": task, "x-ctp-agent": "/root"})
    resp = await c.responses.create(model="gpt-4.1", input="write four times")
    assert [o.status for o in resp.output if o.type == "mcp_call"] == ["completed"] * 4
    notes = list((proxy.state_dir / "notes").rglob("order.md"))
    assert len(notes) == 1 and notes[0].read_text() == "write 3\n"  # the last one the model wrote
    assert task in str(notes[0])  # written as the caller's task
    assert not any(k.startswith("x-ctp-") for k, _ in emulator.responses_requests[0].headers)


async def test_executed_calls_are_journal_items(emulator, proxy_factory):
    """History tools find the executed calls: filed under their concept namespace (`notes`, `write_file`),
    found by the server label and the tool's name too (seed 000 defect 12)."""
    import asyncio

    import aiohttp

    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "notes"])
    task = subprocess.run([sys.executable, "-m", "proxy.app.cli", "task", "new", "--state-dir", str(proxy.state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout.strip()
    emulator.script(FunctionCall("notes_write_file", {"path": "j.md", "text": "journal me\n"}), Text("ok"))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                           default_headers={"x-ctp-task": task, "x-ctp-agent": "/root"})
    await c.responses.create(model="gpt-4.1", input="note it")
    token = (proxy.state_dir / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": "/root"}
    body: dict = {}
    async with aiohttp.ClientSession() as http:
        for _ in range(100):  # the journal writes in the background
            async with http.post(proxy.tools_url + "/v1/tools/history_list_items", headers=headers,
                                 json={"tool_namespace": "ctproxy", "tool_name": "notes_write_file"}) as r:
                body = await r.json()
            if "notes.write_file" in body.get("text", ""):
                break
            await asyncio.sleep(0.1)
        text = body.get("text", "")
        assert '"type":"mcp_call"' in text and '"tool":"notes.write_file"' in text, body
        async with http.post(proxy.tools_url + "/v1/tools/history_list_items", headers=headers,
                             json={"tool_namespace": "notes"}) as r:
            assert '"tool":"notes.write_file"' in (await r.json())["text"]
        async with http.post(proxy.tools_url + "/v1/tools/history_list_items", headers=headers, json={}) as r:
            assert "notes.write_file" not in (await r.json())["text"]  # the recovery tools' own: hidden
