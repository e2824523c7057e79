"""Usage after a bridged turn: the agent's merged `response.completed` sums every round (billing), but
the context budget counts the last round's input + output (the window holds only that): what the tap
records (`FlowState.context_usage`), so `get_context_remaining` reports the last round's tokens."""

from __future__ import annotations

import asyncio
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
    task = subprocess.run([sys.executable, "-m", "proxy.cli", "task", "new", "--state-dir", str(proxy.state_dir)],
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
    assert final.usage.input_tokens == 12000 and final.usage.output_tokens == 70  # the agent sees the sum
    assert await used_tokens(proxy, task, 7030) == 7030  # the window: the last round's input + output
