"""Issue 13, end to end: at `context.reminder_ratio` of the model's window (from the session's recorded
usage) the forwarded copy ends with a hidden developer reminder to save a checkpoint note and call
new_context; the agent's own history never holds it, a resent one is dropped, it is not shown on the
request that starts a new window, and a session that cannot call new_context never gets it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.windows.notes.reminder import REMINDER_MARKER
from tests.emulator import FunctionCall, Text
from tests.proxy.windows.test_context_rollover import start, text_of

pytestmark = pytest.mark.timeout(120)
BIG = "y" * 12_000  # ≈ 3,000 tokens for the emulator: above half of a 4,000-token window


def is_reminder(item: dict[str, Any]) -> bool:
    return item.get("role") == "developer" and text_of(item).startswith(REMINDER_MARKER)


async def configured(emulator: Any, proxy_factory: Any, tmp_path: Any, extra: list[str] | None = None) -> Any:
    cfg = tmp_path / "ctx.json"
    cfg.write_text(json.dumps({"model_windows": {"gpt-4.1": 4_000},
                               "context": {"reminder_ratio": 0.5, "hard_ratio": 0.95}}))
    return await start(emulator, proxy_factory, ["--config", str(cfg), *(extra or [])])


async def test_reminder_at_the_ratio_hidden_and_not_in_the_new_window(emulator, proxy_factory, tmp_path):
    agent = await configured(emulator, proxy_factory, tmp_path)
    emulator.script(Text("a"), FunctionCall("new_context", {}, call_id="c_nc"), Text("resumed"))
    # the session's first request fills (its answer records ≈ 3,000 tokens): sent after a small one, its new items
    # would put that request's estimate above the hard trigger (95%), which acts on the estimate (ADR 0011, 11)
    await agent.sample({"role": "user", "content": "small start"}, {"role": "user", "content": BIG})
    reqs = emulator.responses_requests
    assert not any(is_reminder(i) for i in reqs[0].input_items)  # no usage so far
    resp = await agent.sample({"role": "user", "content": "go on"})
    last = emulator.responses_requests[1].input_items
    assert is_reminder(last[-1]) and sum(map(is_reminder, last)) == 1
    text = text_of(last[-1])
    assert "notes_write_file" in text and "new_context" in text and "of 4000 tokens" in text
    assert not any(is_reminder(i) for i in agent.history)  # hidden: the agent's copy never has it
    # the model calls new_context; the rollover request starts the new window without a reminder
    agent.history.append(last[-1])  # even if an agent resent it, it is dropped
    await agent.sample(*await agent.run_calls(resp))
    third = emulator.responses_requests[2].input_items
    assert not any(is_reminder(i) for i in third)
    assert "context window w2" in text_of(third[1])


async def test_no_reminder_without_new_context(emulator, proxy_factory, tmp_path):
    agent = await configured(emulator, proxy_factory, tmp_path)
    emulator.script(Text("a"), Text("b"))
    for content in (BIG, "more"):
        agent.history.append({"role": "user", "content": content})
        resp = await agent.create(input=list(agent.history))
        agent.history.append({"role": "assistant", "content": resp.output_text})
    assert not any(is_reminder(i) for r in emulator.responses_requests for i in r.input_items)
