"""`ctproxy tasks` counts what the tool bridge ran (issue 12): rounds of bridged calls and the calls, per
session and per task, in the text listing and in `--json`, read from the journal's `mcp_call` items."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.emulator import FunctionCall, Reasoning, Response, Text
from tests.support.cli import ctproxy

pytestmark = pytest.mark.timeout(120)


def cli(*args: str) -> str:
    return ctproxy(*args, timeout=60, check=True).stdout


async def test_tasks_counts_bridged_rounds_and_calls(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    state = ["--state-dir", str(proxy.state_dir)]
    task = cli("task", "new", *state).strip()
    emulator.script(
        Response([Reasoning(summary="two at once"), FunctionCall("get_context_remaining", {}, call_id="c1"),
                  FunctionCall("get_context_remaining", {}, call_id="c2")]),
        Response([Reasoning(summary="once more"), FunctionCall("get_context_remaining", {}, call_id="c3")]),
        Text("done"),
        Text("no tools this time"))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                           default_headers={"x-ctp-task": task, "x-ctp-agent": "/root"})
    resp = await c.responses.create(model="gpt-4.1", input="check twice")
    assert [o.type for o in resp.output].count("mcp_call") == 3
    assert len(emulator.responses_requests) == 3
    await c.responses.create(model="gpt-4.1", previous_response_id=resp.id, input="thanks")  # nothing bridged
    await c.close()

    entry: dict = {}
    for _ in range(100):  # the journal writes in the background
        [entry] = [t for t in json.loads(cli("tasks", "--json", *state)) if t["task_id"] == task]
        if entry["bridged_calls"] == 3 and sum(s["responses"] for a in entry["agents"] for s in a["sessions"]) >= 2:
            break
        await asyncio.sleep(0.1)
    assert entry["bridged_rounds"] == 2 and entry["bridged_calls"] == 3, entry
    [session] = [s for a in entry["agents"] for s in a["sessions"]]
    assert session["bridged_rounds"] == 2 and session["bridged_calls"] == 3
    assert "bridged: 2 round(s), 3 call(s)" in cli("tasks", *state)
