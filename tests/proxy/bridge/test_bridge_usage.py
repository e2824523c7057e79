"""Usage after a bridged turn (issue 29 (6)): the agent's merged answer carries the LAST round's usage
(input, output, total and cached tokens: what its context window now holds; Pi and Codex read
`usage.input_tokens` as their context size), and `get_context_remaining` reports it. What the turn cost,
every round summed, goes to the journal, `/metrics` and the `x-ctp-turn-usage` header of a held answer.
Inside the turn, a bridged `get_context_remaining` reads the round that called it (issue 29 (5))."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import openai
import pytest

from tests.emulator import FunctionCall, Text
from tests.support.proxyproc import REPO

pytestmark = pytest.mark.timeout(120)


async def used_tokens(proxy, task: str, want: int) -> int | None:
    token = (proxy.state_dir / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": "/root"}
    used = None
    async with aiohttp.ClientSession() as http:
        for _ in range(100):  # the usage row is written in the background
            async with http.post(proxy.tools_url + "/v1/tools/get_context_remaining", headers=headers,
                                 json={}) as r:
                used = (await r.json())["details"].get("used_tokens")
            if used == want:
                break
            await asyncio.sleep(0.1)
    return used


@pytest.mark.parametrize("stream", [True, False])
async def test_context_budget_counts_the_last_round(emulator, proxy_factory, stream):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    task = subprocess.run([sys.executable, "-m", "proxy.app.cli", "task", "new", "--state-dir", str(proxy.state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout.strip()
    emulator.script(FunctionCall("get_context_remaining", {}, usage={"input_tokens": 5000, "output_tokens": 40}),
                    Text("fine", usage={"input_tokens": 7000, "output_tokens": 30}))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                           default_headers={"x-ctp-task": task, "x-ctp-agent": "/root"})
    if stream:
        async with c.responses.stream(model="gpt-4.1", input="how much is left?") as s:
            final = await s.get_final_response()
    else:
        final = await c.responses.create(model="gpt-4.1", input="how much is left?")
    await c.close()
    assert len(emulator.responses_requests) == 2
    # the agent sees the last round's usage: what its window holds, never the sum (47,013 for 5,625 in Pi)
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (7000, 30, 7030)
    assert final.usage.input_tokens_details.cached_tokens == 0
    assert await used_tokens(proxy, task, 7030) == 7030  # the window: the last round's input + output
    # the bridged call inside the turn read round 1's usage (recorded before it ran), not "unknown"
    [call] = [i for i in final.output if i.type == "mcp_call"]
    assert "5040 used by the last answer" in call.output and "unknown" not in call.output


async def test_turn_cost_goes_to_the_header_the_journal_and_metrics(emulator, proxy_factory):
    from proxy.db import connect

    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    task = subprocess.run([sys.executable, "-m", "proxy.app.cli", "task", "new", "--state-dir", str(proxy.state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout.strip()
    emulator.script(FunctionCall("get_context_remaining", {}, usage={"input_tokens": 5000, "output_tokens": 40,
                                                                     "input_tokens_details": {"cached_tokens": 4000}}),
                    FunctionCall("get_context_remaining", {}, usage={"input_tokens": 6000, "output_tokens": 50}),
                    Text("fine", usage={"input_tokens": 7000, "output_tokens": 30,
                                        "input_tokens_details": {"cached_tokens": 6000}}))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                           default_headers={"x-ctp-task": task, "x-ctp-agent": "/root"})
    raw = await c.responses.with_raw_response.create(model="gpt-4.1", input="how much is left?")
    final = raw.parse()
    await c.close()
    assert final.usage.input_tokens == 7000 and final.usage.input_tokens_details.cached_tokens == 6000
    assert raw.headers["x-ctp-turn-usage"] == ("input_tokens=18000, output_tokens=120, total_tokens=18120, "
                                               "cached_tokens=10000, rounds=3")
    calls = [i for i in final.output if i.type == "mcp_call"]
    assert "5040 used" in calls[0].output and "6050 used" in calls[1].output  # each round's own
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http:
        text = ""
        for _ in range(100):  # the metrics of the proxy process reach the tool server's /metrics when scraped
            async with http.get(proxy.tools_url + "/metrics", headers={"Authorization": f"Bearer {token}"}) as r:
                text = await r.text()
            if 'ctproxy_bridged_turn_tokens_total{kind="input"} 18000.0' in text:
                break
            await asyncio.sleep(0.1)
    assert 'ctproxy_bridged_turn_tokens_total{kind="input"} 18000.0' in text
    assert 'ctproxy_bridged_turn_tokens_total{kind="cached"} 10000.0' in text
    conn = connect(proxy.state_dir / "ctproxy.db")
    try:
        for _ in range(100):  # the journal's writer commits in the background
            row = conn.execute("SELECT usage FROM journal_responses WHERE usage LIKE '%ctp_turn%'").fetchone()
            if row is not None:
                break
            await asyncio.sleep(0.1)
    finally:
        conn.close()
    assert row is not None
    kept = json.loads(row[0])
    assert kept["input_tokens"] == 7000  # what the agent was shown
    assert kept["ctp_turn"]["input_tokens"] == 18000 and kept["ctp_turn"]["rounds"] == 3
