"""Issue 46 (seed000-defects.md 2 and 3) and issue 47 (a window's bootstrap built once), end to end: openai SDK →
`ctproxy up` → the validating emulator, with a Pi-shaped agent (Pi sends its whole system prompt as the first input
message: `system`, or `developer` for reasoning models; @mariozechner/pi-ai openai-responses-shared.js).

- A readable-fallback window keeps the agent's leading instructions whole, in their roles; the excerpt covers only
  the conversation.
- Inside that window consecutive forwarded requests carry the earlier items byte for byte (the bootstrap is built
  once, when the window opens, and stored; never refitted per request).
- A window survives a changed leading instruction (Pi's date line at midnight): the new instruction replaces the old
  one in the next request, the window is kept, and w1 still holds its items.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.windows.fallback import is_fallback_message
from tests.emulator import Emulator, FunctionCall, Text
from tests.openapi_schema import spec_available
from tests.proxy.windows.test_context_fallbacks import ValidAgent, is_turn, turns, until
from tests.proxy.windows.test_context_rollover import start as start_agent
from tests.proxy.windows.test_context_rollover import text_of

pytestmark = pytest.mark.timeout(180)

BIG = "x" * 1_080  # the defects file's filler
RULES = "RULE-HEAD " + "a" * 2_900 + " RULE-MIDDLE-42 " + "b" * 2_900 + " RULE-TAIL"


@pytest.fixture
async def emulator():
    async with Emulator(validate_requests=spec_available()) as emu:
        yield emu


async def pi_agent(emulator: Any, proxy_factory: Any, tmp_path: Any, config: dict[str, Any],
                   system: dict[str, Any]) -> ValidAgent:
    cfg = tmp_path / "ctx.json"
    cfg.write_text(json.dumps(config))
    agent = await start_agent(emulator, proxy_factory, ["--config", str(cfg)])
    pi = ValidAgent(agent.proxy, agent.task)
    pi.history.append(system)
    return pi


def system_message(text: str, role: str = "system") -> dict[str, Any]:
    return {"role": role, "content": text}


def raw(items: list[dict[str, Any]]) -> list[bytes]:
    return [orjson.dumps(i) for i in items]


def assert_append_only(requests: list[Any]) -> None:
    """Each request's input starts, byte for byte, with the previous request's: ctproxy's hidden reminder too,
    which is said once in a window and then kept where it was said (issue 47)."""
    for before, after in itertools.pairwise(requests):
        earlier = raw(before.input_items)
        assert raw(after.input_items)[:len(earlier)] == earlier


FALLBACK_CONFIG = {"model_windows": {"gpt-4.1": 4000}, "context": {"reminder_ratio": 0.4, "hard_ratio": 0.5},
                   "remote_compaction": {"threshold": 1.0}}


async def into_fallback(agent: ValidAgent, emulator: Any) -> list[dict[str, Any]]:
    """Defect 2's reproduction: two turns, the second answer at 1,900 tokens, the third turn's checkpoint turn
    answered with text only: the window is replaced by the readable fallback. The forwarded w2 request."""
    emulator.script(Text("a1", usage={"input_tokens": 500}), Text("a2", usage={"input_tokens": 1900}),
                    Text("I will not write"), Text("resumed"), Text("r4"), Text("r5"), Text("r6"))
    await agent.sample({"role": "user", "content": "u1 " + BIG})
    await agent.sample({"role": "user", "content": "t2 " + BIG})
    assert (await agent.sample({"role": "user", "content": "t3 " + BIG})).output_text == "resumed"
    assert is_turn(emulator.responses_requests[2])
    fwd = turns(emulator)[2].input_items
    assert any(map(is_fallback_message, fwd))
    return fwd


@pytest.mark.parametrize("role", ["system", "developer"])
async def test_a_fallback_window_keeps_the_agents_instructions_whole_in_their_role(emulator, proxy_factory,
                                                                                  tmp_path, role):
    """Defect 2: the instructions were demoted into the user-role excerpt, each cut to 2,000 characters."""
    agent = await pi_agent(emulator, proxy_factory, tmp_path, FALLBACK_CONFIG, system_message(RULES, role))
    fwd = await into_fallback(agent, emulator)
    assert fwd[0] == {"role": role, "content": RULES}  # first, whole, in its own role
    excerpt = next(i for i in fwd if is_fallback_message(i))
    assert excerpt["role"] == "user"
    assert "RULE-HEAD" not in text_of(excerpt) and "u1 " in text_of(excerpt)  # only the conversation
    assert sum(RULES in json.dumps(i) for i in fwd) == 1


async def test_a_fallback_window_replays_its_bootstrap_byte_for_byte(emulator, proxy_factory, tmp_path):
    """Issue 47: a readable-fallback window's earlier items stay byte-identical from one request to the next. The
    excerpt was refitted to the threshold on every request (compaction's threshold at 55% of the window here), so
    each request of the window sent a different user-role excerpt."""
    config = {**FALLBACK_CONFIG, "remote_compaction": {"threshold": 0.55}}
    agent = await pi_agent(emulator, proxy_factory, tmp_path, config, system_message("You are Pi."))
    await into_fallback(agent, emulator)
    for k in (4, 5, 6):
        await agent.sample({"role": "user", "content": f"t{k} a short one"})
    window = turns(emulator)[2:]
    assert len(window) == 4 and all(any(map(is_fallback_message, r.input_items)) for r in window)
    assert_append_only(window)


async def tool(agent: ValidAgent, name: str, args: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.post(f"{agent.proxy.tools_url}/v1/tools/{name}", json=args,
                                                          headers=agent.tool_headers) as r:
        body = await r.json()
        assert r.status == 200, body
        return body


async def test_a_window_survives_pis_midnight_date_change(emulator, proxy_factory, tmp_path):
    """Defect 3: after a rollover, Pi changes only its date line. The whole old history went up again under w2,
    and w1 then showed 0 items."""
    config = {"model_windows": {"gpt-4.1": 400_000}}
    agent = await pi_agent(emulator, proxy_factory, tmp_path, config,
                           system_message("You are Pi. Current date: 2026-12-07", "developer"))
    emulator.script(FunctionCall("new_context", {}, call_id="c2"), Text("rolled"), Text("next"), Text("after"))
    resp = await agent.sample({"role": "user", "content": "task: do X " + BIG * 3})
    outs = await agent.run_calls(resp)
    await agent.sample(*outs, {"role": "user", "content": "steer"})
    w2 = turns(emulator)[1].input_items
    assert "task: do X" not in json.dumps(w2)  # the w2 bootstrap, then the steer
    agent.history[0] = system_message("You are Pi. Current date: 2026-12-08", "developer")
    await agent.sample({"role": "user", "content": "next day"})
    fwd = turns(emulator)[2].input_items
    assert "task: do X" not in json.dumps(fwd)  # still window w2
    assert fwd[0] == {"role": "developer", "content": "You are Pi. Current date: 2026-12-08"}
    assert "2026-12-07" not in json.dumps(fwd)  # the changed instruction replaced the old one
    assert raw(fwd)[1:len(w2)] == raw(w2)[1:]  # and the rest of the window's prefix is unchanged
    assert text_of(fwd[-1]).endswith("next day")
    await agent.sample({"role": "user", "content": "later"})
    assert_append_only(turns(emulator)[2:])

    async def windows() -> Any:
        text = (await tool(agent, "history_list_windows", {}))["text"]
        got = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        return got if len(got) == 2 and all(w["items"] for w in got) else None

    listed = await until(windows, "history_list_windows never showed both windows with their items")
    assert [w["window_id"] for w in listed] == ["w1", "w2"]
    found = await tool(agent, "history_search_contents", {"query": "task: do X"})
    assert "w1" in json.dumps(found)
