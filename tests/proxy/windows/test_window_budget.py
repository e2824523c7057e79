"""Issue 46 (seed000-defects.md 4): one window size for every reader. After the upstream refused at a few thousand
tokens (`context_length_exceeded`), the proxy's decision used the smaller window it learned, but
`get_context_remaining` (and the reminder) still read the model table: "You have 356985 tokens left … of 400000"."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from proxy import usage
from proxy.windows import budget
from proxy.windows.hard_trigger import usage_ratio
from tests.emulator import Emulator, Text, context_length_exceeded_400
from tests.proxy.windows.test_context_rollover import start as start_agent
from tests.proxy.windows.test_window_instructions import tool

pytestmark = pytest.mark.timeout(180)
BIG = "x" * 1_080


@pytest.fixture
async def emulator():
    async with Emulator() as emu:
        yield emu


async def test_get_context_remaining_reads_the_window_an_overflow_taught(emulator, proxy_factory, tmp_path):
    cfg = tmp_path / "ctx.json"
    cfg.write_text(json.dumps({"model_windows": {"gpt-4.1": 400_000}, "context": {"hard_ratio": 0.9}}))
    agent = await start_agent(emulator, proxy_factory, ["--config", str(cfg)])
    emulator.script(*[Text(f"r{k}") for k in range(6)], context_length_exceeded_400(), Text("recovered"))
    for k in range(6):
        await agent.sample({"role": "user", "content": f"a{k} " + BIG * 3})
    assert (await agent.sample({"role": "user", "content": "small last"})).output_text == "recovered"
    details: dict[str, Any] = {}
    for _ in range(100):
        got = await tool(agent, "get_context_remaining", {})
        details = got["details"]
        if details["context_window"] is not None and details["context_window"] < 400_000:
            break
        await asyncio.sleep(0.1)  # the learned window is written in the background
    learned = details["context_window"]
    assert learned is not None and learned < 20_000, got["text"]
    assert details["hard_trigger_tokens"] == int(learned * 0.9)
    assert f"of {learned} tokens left" in got["text"] and "400000" not in got["text"]


def test_every_reader_reads_the_one_effective_window():
    table = {"gpt-4.1": 400_000}
    assert budget.effective_window("gpt-4.1", table, None) == 400_000
    assert budget.effective_window("gpt-4.1", table, 7_000) == 7_000
    assert budget.effective_window("gpt-4.1", table, 500_000) == 400_000  # never larger than the table says
    assert budget.effective_window("other", table, 7_000) == 7_000
    # the reminder (no decision): the last usage against the learned window, not the table's
    last = usage.Usage("s", "t", "/root", "gpt-4.1", 5_000, 100, None, None, time.time())
    assert usage_ratio(last, "gpt-4.1", table, 0.7, lambda: None) is None
    assert usage_ratio(last, "gpt-4.1", table, 0.7, lambda: None, learned=7_000) == (5_100, 7_000)
