"""Item types ctproxy does not interpret pass through unchanged and are journaled in order (issue 31):
`tool_search_call`/`tool_search_output`, `shell_call`/`shell_call_output`, `apply_patch_call`/
`apply_patch_call_output`, `compaction_trigger`, and a type that does not exist yet. The `openai` SDK through
`ctproxy up` (history on, the bridge on) in front of the emulator, which validates the known types against
the official OpenAPI description."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from proxy.state import StateDir
from proxy.windows.notes.bootstrap import is_guidance, is_identity
from tests.emulator import Emulator, Text
from tests.openapi_schema import spec_available, validate
from tests.proxy.app.test_cli_codex_config import cli

pytestmark = pytest.mark.timeout(180)
FN = {"type": "function", "name": "get_weather", "strict": True, "description": "weather",
      "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False}}
NEW_ITEMS = [
    {"type": "tool_search_call", "call_id": "ts_1", "execution": "client", "arguments": {"query": "weather"},
     "status": "completed"},
    {"type": "tool_search_output", "call_id": "ts_1", "execution": "client", "tools": [FN], "status": "completed"},
    {"type": "shell_call", "call_id": "sh_1", "action": {"commands": ["ls"]}, "status": "completed"},
    {"type": "shell_call_output", "call_id": "sh_1",
     "output": [{"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
    {"type": "apply_patch_call", "call_id": "ap_1", "status": "completed",
     "operation": {"type": "create_file", "path": "b.txt", "diff": "+hello\n"}},
    {"type": "apply_patch_call_output", "call_id": "ap_1", "status": "completed", "output": "created b.txt"},
]
USER = {"role": "user", "content": [{"type": "input_text", "text": "look around"}]}


async def journaled_types(proxy, task: str, want: int) -> list[str]:
    """The journaled items' types of the task, oldest first, once `want` are there (the journal writes in
    the background)."""
    token = StateDir.open(proxy.state_dir).token()
    headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task}
    types: list[str] = []
    async with aiohttp.ClientSession() as http, asyncio.timeout(60):
        while True:
            async with http.post(f"{proxy.tools_url}/v1/tools/history_list_items", json={"limit": 200},
                                 headers=headers) as r:
                body = await r.json()
            lines = str(body.get("text", "")).splitlines()[1:]  # after the header: one JSON line per item
            types = [json.loads(line).get("type") for line in lines if line.startswith("{")]
            if len(types) >= want:
                return types
            await asyncio.sleep(0.1)


async def test_new_item_types_reach_the_upstream_unchanged_and_are_journaled_in_order(proxy_factory):
    async with Emulator(validate_requests=spec_available()) as emulator:
        emulator.set_default(Text("seen"))
        proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "notes"])
        task = (await asyncio.to_thread(cli, "task", "new", "--state-dir", str(proxy.state_dir))).stdout.strip()
        c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-items", max_retries=0,
                               default_headers={"x-ctp-task": task, "x-ctp-agent": "/root"})
        sent = [USER, *NEW_ITEMS]
        if spec_available():
            validate("CreateResponse", {"model": "gpt-5", "input": sent})
        await c.responses.create(model="gpt-5", input=sent, tools=[FN])
        [req] = emulator.responses_requests
        assert req.status == 200
        # unchanged, in order (the context stage's guidance and the window's identity are what ctproxy adds)
        assert [i for i in req.json["input"] if not is_guidance(i) and not is_identity(i)] == sent
        types = await journaled_types(proxy, task, len(sent) + 1)
    assert [t for t in types if t in {i["type"] for i in NEW_ITEMS}] == [i["type"] for i in NEW_ITEMS], types


async def test_a_type_that_does_not_exist_yet_and_compaction_trigger_pass(proxy_factory):
    """What comes next: an unknown item type is no reason to refuse or drop (the emulator here checks the
    input's rules, not the schema); `compaction_trigger` (must be last) too."""
    async with Emulator(validate_requests=False) as emulator:
        emulator.set_default(Text("seen"))
        proxy = await proxy_factory(upstream=emulator.url)
        task = (await asyncio.to_thread(cli, "task", "new", "--state-dir", str(proxy.state_dir))).stdout.strip()
        future = {"type": "hologram_call", "call_id": "h_1", "scene": {"depth": 3}, "x_unknown": [1, None]}
        sent = [USER, future, {"type": "compaction_trigger"}]
        async with aiohttp.ClientSession() as http, http.post(
                proxy.url + "/v1/responses", data=json.dumps({"model": "gpt-5", "input": sent}),
                headers={"Authorization": "Bearer sk-test-items", "content-type": "application/json",
                         "x-ctp-task": task, "x-ctp-agent": "/root"}) as r:
            await r.read()
        [req] = [r for r in emulator.requests if r.path == "/v1/responses"]
        assert req.json["input"] == sent
        types = await journaled_types(proxy, task, 3)
    assert types[:3] == ["message", "hologram_call", "compaction_trigger"], types
