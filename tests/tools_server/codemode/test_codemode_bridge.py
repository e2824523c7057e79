"""Code mode through the proxy's tool bridge: `ctproxy up --bridge code_mode,notes --enable code_mode`
between the `openai` SDK and the upstream emulator. The emulator plays the model: it calls `exec` with a
script that reads the notes, then answers; the agent sees one response with the executed call."""

from __future__ import annotations

import json

import openai
import pytest

from tests.emulator import FunctionCall, Text

pytestmark = pytest.mark.timeout(180)

SCRIPT = ("const list = await tools.notes_list_files_by_prefix({});\n"
          "const [a, b] = await Promise.all([tools.notes_search_contents({query: 'x'}),\n"
          "                                  tools.notes_search_contents({query: 'y'})]);\n"
          "print('notes', list.ok, a.ok, b.ok);\nreturn 7")


async def test_a_bridged_exec_round(emulator, proxy_factory) -> None:
    proxy = await proxy_factory(upstream=emulator.url,
                                extra_args=["--bridge", "code_mode,notes", "--enable", "code_mode"])
    emulator.script(FunctionCall("exec", {"code": SCRIPT}, call_id="call_exec1"), Text("done", deltas=2))
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-bridge", max_retries=0)
    final = await client.responses.create(model="gpt-4.1", input="look at my notes in one go")
    assert final.output_text == "done"
    call = next(o for o in final.output if o.type == "mcp_call")
    assert call.name == "exec" and (call.output or "").startswith("Script completed\nWall time ")
    assert "Output:\nnotes true true true\n" in (call.output or "") and (call.output or "").endswith("Result:\n7")
    first, second = (r.json for r in emulator.responses_requests)
    offered = {t.get("name") for t in first["tools"]}
    assert {"exec", "wait", "notes_read_file"} <= offered
    out = next(i for i in second["input"] if i.get("type") == "function_call_output")
    assert out["call_id"] == "call_exec1" and "notes true true true" in out["output"]
    assert len(emulator.responses_requests) == 2  # one upstream round for four tool calls
    assert json.dumps(second).count("Traceback") == 0
