"""Issue 13, end to end (openai SDK → `ctproxy up` → the emulator, validating requests against the official
OpenAPI description where it is available): what the hard trigger does besides a successful checkpoint turn.

- The checkpoint turn fails (no write, an upstream error): the session falls back to compaction, remote
  compaction v2 where compaction's own rule allows it (remote_compaction on, an eligible route, a known
  auth kind, no custom instructions), else the readable fallback. The agent gets its answer, never a
  `context_length_exceeded`, and the next request neither runs a turn nor compacts again (no loop).
- `context.strategy = "remote"` / `"fallback"`: at the hard trigger the proxy compacts instead of running a
  checkpoint turn (remote where eligible / always readable).
- The checkpoint turn's write is journaled (as the bridge journals the calls it runs: an `mcp_call` item),
  in the window it closes, and stays on the session's branch: the history tools find it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from proxy.app.status import capability_status
from proxy.config import Config
from proxy.windows.fallback import is_fallback_message
from proxy.windows.notes.checkpoint_turn import CHOICE as CHECKPOINT_CHOICE
from tests.emulator import FunctionCall, HttpError, Text, context_length_exceeded_400
from tests.proxy.windows.test_context_reminder import BIG
from tests.proxy.windows.test_context_rollover import TOOLS, Agent, plain, text_of
from tests.proxy.windows.test_context_rollover import start as start_agent

pytestmark = [pytest.mark.validate_requests, pytest.mark.timeout(120)]


# The official description requires `strict` on a function tool (null allowed): the agent's tools with it.
VALID_TOOLS = [{**t, "strict": False} for t in TOOLS]


class ValidAgent(Agent):
    async def sample(self, *new: dict[str, Any]) -> Any:
        self.history.extend(new)
        resp = await self.create(input=list(self.history), tools=VALID_TOOLS)
        self.history.extend(plain(o) for o in resp.output)
        return resp


async def start(emulator: Any, proxy_factory: Any, extra: list[str]) -> ValidAgent:
    agent = await start_agent(emulator, proxy_factory, extra)
    return ValidAgent(agent.proxy, agent.task)




async def configured(emulator: Any, proxy_factory: Any, tmp_path: Any, context: dict[str, Any] | None = None,
                     remote: dict[str, Any] | None = None) -> Any:
    cfg = tmp_path / "ctx.json"
    # compaction's own threshold at 100% of the window (its estimate of the second request stays below it):
    # only the hard trigger (15%) compacts here
    cfg.write_text(json.dumps({"model_windows": {"gpt-4.1": 16_000},
                               "context": {"reminder_ratio": 0.1, "hard_ratio": 0.15, **(context or {})},
                               "remote_compaction": {"threshold": 1.0, **(remote or {})}}))
    return await start(emulator, proxy_factory, ["--config", str(cfg)])


def is_turn(req: Any) -> bool:
    return (req.json or {}).get("tool_choice") == CHECKPOINT_CHOICE


def turns(emulator: Any) -> list[Any]:
    """The agent's own forwarded requests (neither a checkpoint turn nor a compaction call)."""
    return [r for r in emulator.responses_requests if not is_turn(r)]


def compacts(emulator: Any) -> list[Any]:
    return [r for r in emulator.requests if r.route == "compact"]


def is_compaction_item(item: dict[str, Any]) -> bool:
    return item.get("type") == "compaction" and isinstance(item.get("encrypted_content"), str)


async def fill(agent: Any) -> None:
    """One request, the session's first (no usage yet: the hard trigger does not act on it): its answer records
    ≈ 3,500 of 16,000 tokens, so the next request's estimate (that usage plus its new items) is above the
    trigger. (Sent as two requests, the second's estimate, the first's small usage plus BIG, would already be.)"""
    await agent.sample({"role": "user", "content": "small start"}, {"role": "user", "content": BIG})


async def until(check: Any, what: str) -> Any:
    for _ in range(200):  # the journal writes in the background: wait for it (≤ 20 s)
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(what)


def assert_remote_window(fwd: list[dict[str, Any]]) -> None:
    """The compacted window: retained user messages, the one opaque compaction item, the agent's message;
    the model's old answers are gone (the compaction item stands for them)."""
    kinds = [i.get("type", "message") for i in fwd]
    assert kinds.count("compaction") == 1 and is_compaction_item(fwd[kinds.index("compaction")])
    assert not any(map(is_fallback_message, fwd))
    assert not [i for i in fwd if i.get("role") == "assistant"]
    assert text_of(fwd[-1]).endswith("go on")


# the turn answered without a write, failed upstream, or overflowed itself (the window plus the instruction)
FAILURES = {"no_write": Text("I will not write"), "upstream_error": HttpError(500),
            "overflow": context_length_exceeded_400()}


@pytest.mark.parametrize("failure", sorted(FAILURES))
async def test_a_failed_turn_falls_back_to_remote_compaction_where_eligible(emulator, proxy_factory, tmp_path,
                                                                           failure):
    agent = await configured(emulator, proxy_factory, tmp_path, remote={"enabled": True})
    emulator.script(Text("a"), FAILURES[failure], Text("resumed"), Text("later"))
    await fill(agent)
    resp = await agent.sample({"role": "user", "content": "go on"})
    assert resp.output_text == "resumed"  # the agent gets its answer: no error, no overflow
    assert is_turn(emulator.responses_requests[1])
    (comp,) = compacts(emulator)  # exactly one remote compaction, to the compaction endpoint beside /responses
    assert comp.path == "/v1/responses/compact" and BIG in json.dumps(comp.json["input"])
    assert dict((k.lower(), v) for k, v in comp.headers)["authorization"] == "Bearer sk-test-ctx"
    fwd = turns(emulator)[1].input_items
    assert_remote_window(fwd)
    await agent.sample({"role": "user", "content": "next"})
    assert len(compacts(emulator)) == 1 and len(emulator.responses_requests) == 4  # no second turn, no loop
    later = turns(emulator)[2].input_items
    assert [i for i in later if is_compaction_item(i)] == [i for i in fwd if is_compaction_item(i)]  # replayed


async def test_a_checkpoint_turn_that_times_out_falls_back(emulator, proxy_factory, tmp_path):
    """The turn's upstream stays silent: past `context.checkpoint_timeout_seconds` it has failed, and the
    agent's request goes on in the compacted window."""
    agent = await configured(emulator, proxy_factory, tmp_path, context={"checkpoint_timeout_seconds": 1.0})
    emulator.script(Text("a"), Text("never sent", stall_before_headers=True), Text("resumed"))
    await fill(agent)
    assert (await agent.sample({"role": "user", "content": "go on"})).output_text == "resumed"
    assert is_turn(emulator.responses_requests[1])
    fwd = turns(emulator)[1].input_items
    assert any(map(is_fallback_message, fwd)) and BIG not in json.dumps(fwd)


async def test_a_failed_turn_gets_the_readable_fallback_where_remote_is_not_eligible(emulator, proxy_factory,
                                                                                    tmp_path):
    """Custom compaction instructions make remote compaction ineligible (compaction's rule): readable."""
    agent = await configured(emulator, proxy_factory, tmp_path,
                             remote={"enabled": True, "custom_instructions": "keep the file names"})
    emulator.script(Text("a"), Text("I will not write"), Text("resumed"), Text("later"))
    await fill(agent)
    assert (await agent.sample({"role": "user", "content": "go on"})).output_text == "resumed"
    assert compacts(emulator) == []
    fwd = turns(emulator)[1].input_items
    assert any(map(is_fallback_message, fwd)) and not any(map(is_compaction_item, fwd))
    assert BIG not in json.dumps(fwd) and text_of(fwd[-1]).endswith("go on")
    await agent.sample({"role": "user", "content": "next"})
    assert len(emulator.responses_requests) == 4 and any(map(is_fallback_message, turns(emulator)[2].input_items))


async def test_strategy_remote_compacts_at_the_hard_trigger_instead_of_a_turn(emulator, proxy_factory, tmp_path):
    agent = await configured(emulator, proxy_factory, tmp_path, context={"strategy": "remote"},
                             remote={"enabled": True})
    emulator.script(Text("a"), Text("resumed"), Text("later"))
    await fill(agent)
    assert (await agent.sample({"role": "user", "content": "go on"})).output_text == "resumed"
    assert not any(map(is_turn, emulator.responses_requests))  # no checkpoint turn under this strategy
    assert len(compacts(emulator)) == 1
    assert_remote_window(emulator.responses_requests[1].input_items)
    await agent.sample({"role": "user", "content": "next"})
    assert len(compacts(emulator)) == 1 and len(emulator.responses_requests) == 3


async def test_strategy_fallback_replaces_the_window_with_the_readable_fallback(emulator, proxy_factory, tmp_path):
    """Readable even where remote compaction would be eligible: no upstream call of its own at all."""
    agent = await configured(emulator, proxy_factory, tmp_path, context={"strategy": "fallback"},
                             remote={"enabled": True})
    emulator.script(Text("a"), Text("resumed"), Text("later"))
    await fill(agent)
    assert (await agent.sample({"role": "user", "content": "go on"})).output_text == "resumed"
    assert compacts(emulator) == [] and not any(map(is_turn, emulator.responses_requests))
    fwd = emulator.responses_requests[1].input_items
    assert any(map(is_fallback_message, fwd)) and BIG not in json.dumps(fwd)
    assert text_of(fwd[-1]).endswith("go on")
    await agent.sample({"role": "user", "content": "next"})
    assert len(emulator.responses_requests) == 3 and any(map(is_fallback_message,
                                                             emulator.responses_requests[2].input_items))


async def test_strategy_fallback_applies_with_compaction_entirely_off(emulator, proxy_factory, tmp_path):
    """The context stage's own compaction window applies while context is on, even with remote compaction
    and overflow recovery both off (nothing else would apply it)."""
    agent = await configured(emulator, proxy_factory, tmp_path, context={"strategy": "fallback"},
                             remote={"enabled": False, "recover_overflow": False})
    emulator.script(Text("a"), Text("resumed"), Text("later"))
    await fill(agent)
    await agent.sample({"role": "user", "content": "go on"})
    await agent.sample({"role": "user", "content": "next"})
    for req in emulator.responses_requests[1:]:
        assert any(map(is_fallback_message, req.input_items)) and BIG not in json.dumps(req.input_items)


def test_status_names_the_active_strategy():
    cfg = Config()
    notes = capability_status(cfg, "context").reason
    assert "strategy notes" in notes and "runs the checkpoint turn" in notes
    assert "when the turn fails, the readable compaction fallback (remote_compaction.enabled is false)" in notes
    cfg.remote_compaction.enabled = True
    assert "when the turn fails, remote compaction v2 where the route and auth kind are eligible" in \
        capability_status(cfg, "context").reason
    cfg.context.strategy = "remote"
    remote = capability_status(cfg, "context").reason
    assert "strategy remote: no checkpoint turn" in remote and "remote compaction v2" in remote
    cfg.remote_compaction.enabled = False
    assert "strategy remote: no checkpoint turn, the proxy compacts the window first: the readable compaction " \
           "fallback (remote_compaction.enabled is false)" in capability_status(cfg, "context").reason
    assert "a manual checkpoint compacts at the next request" in capability_status(cfg, "context").reason
    cfg.context.strategy = "fallback"
    assert "strategy fallback: no checkpoint turn" in capability_status(cfg, "context").reason
    cfg.context.strategy = "notes"
    assert "a manual checkpoint runs the checkpoint turn" in capability_status(cfg, "context").reason


# ---------------------------------------------------------------- the checkpoint turn's write, journaled


async def test_the_checkpoint_turns_write_is_journaled_in_the_window_it_closes(emulator, proxy_factory, tmp_path):
    agent = await configured(emulator, proxy_factory, tmp_path)
    emulator.script(Text("a"),
                    FunctionCall("notes_write_file", {"path": "../../escape.md", "text": "x"}, call_id="c_bad"),
                    FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": "plan: step 3 of 5"},
                                 call_id="c_ck"),
                    Text("resumed"), Text("later"))
    await fill(agent)
    assert (await agent.sample({"role": "user", "content": "go on"})).output_text == "resumed"
    assert "context window w2" in text_of(turns(emulator)[1].input_items[1])  # rolled over after the write

    # filed as the bridge files the calls it runs: found by namespace "ctproxy" and the tool's own name
    by_tool = {"window_id": "w1", "tool_namespace": "ctproxy", "tool_name": "notes_write_file"}

    async def listed() -> str:
        text = (await agent.tool("history_list_items", by_tool))["text"]
        return text if "plan: step 3 of 5" in text else ""

    text = await until(listed, "the checkpoint turn's write is not in the journal")
    # both executed writes, as ctproxy's mcp_call items of the old window: the failed one, then the note
    assert text.index("escape.md") < text.index("plan: step 3 of 5") and '"window_id":"w1"' in text
    assert text.count('"type":"mcp_call"') == 2 and "created checkpoint.md" in text
    # the recovery tools' own records: hidden from a default search, found with an explicit tool filter
    found = (await agent.tool("history_search_contents", {"query": "plan: step 3 of 5",
                                                          "tool_name": "notes_write_file"}))["text"]
    assert "notes.write_file" in found and '"window_id":"w1"' in found
    # the agent never resends those items: the journal's branch goes on past them (still found afterwards)
    await agent.sample({"role": "user", "content": "next"})

    async def still_listed() -> str:
        again = (await agent.tool("history_list_items", {"role": "user", "recent_first": True}))["text"]
        return again if "next" in again else ""

    assert "go on" in await until(still_listed, "the agent's next request is not journaled")
    text = (await agent.tool("history_list_items", by_tool))["text"]
    assert "plan: step 3 of 5" in text and "escape.md" in text
    events = [e["detail"].get("kind") for e in agent_events(agent) if e["kind"] == "branch"]
    assert "diverged" not in events and "prefix" not in events


def agent_events(agent: Any) -> list[dict[str, Any]]:
    from proxy.db import connect

    conn = connect(agent.proxy.state_dir / "ctproxy.db")
    try:
        rows = conn.execute("SELECT kind, detail FROM journal_events ORDER BY id").fetchall()
    finally:
        conn.close()
    return [{"kind": r[0], "detail": json.loads(r[1])} for r in rows]


def test_remote_eligibility_is_compactions_one_rule():
    from proxy.config import RemoteCompactionConfig
    from proxy.routes import Route
    from proxy.windows.remote.eligibility import remote_call

    key = b"k" * 32
    on = RemoteCompactionConfig(enabled=True)
    headers = {"authorization": "Bearer sk-test"}
    trusted = Route("api", official=False, trusted=True)

    def call(cfg: Any, route: Any = trusted, hdrs: Any = headers, model: str = "gpt-4.1") -> Any:
        return remote_call(cfg, route, "http", "127.0.0.1", 8080, "/v1/responses", hdrs, True, model, key)

    ok = call(on)
    assert ok.blocked is None and ok.target is not None and ok.target.url == "http://127.0.0.1:8080/v1/responses/compact"
    assert ok.target.headers["authorization"] == "Bearer sk-test" and ok.fingerprint.auth_kind != "none"
    assert call(RemoteCompactionConfig(enabled=False)).blocked == "off"
    assert call(RemoteCompactionConfig(enabled=True, custom_instructions="x")).blocked == "custom_instructions"
    assert call(on, Route("api", official=False, trusted=False)).blocked == "route"
    assert call(on, hdrs={}).blocked == "auth_unknown"
    assert call(on, model="").blocked == "auth_unknown"  # no model: no fingerprint to replay under


async def test_strategy_remote_on_the_codex_route_uses_remote_compaction_v2(emulator, proxy_factory, tmp_path):
    """The same hard trigger for a Codex-style client (the Codex backend route, OAuth bearer, streamed):
    remote compaction v2 is a streamed `compaction_trigger` turn on the same endpoint, and its one opaque
    item is what the forwarded request carries, then replays."""
    import aiohttp

    from tests.proxy.windows.test_compaction_harness import codex_turn, completed_output_text, user

    cfg = tmp_path / "codex.json"
    cfg.write_text(json.dumps({"model_windows": {"gpt-5": 16_000}, "remote_compaction": {"enabled": True,
                                                                                         "threshold": 1.0},
                               "context": {"reminder_ratio": 0.1, "hard_ratio": 0.15, "strategy": "remote"}}))
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--config", str(cfg)])
    emulator.script(Text("a"), Text("resumed"), Text("later"))
    history: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for texts in (("small start", BIG), ("go on",), ("next",)):  # the first request fills (see `fill`)
            history.extend(map(user, texts))
            status, events = await codex_turn(http, proxy.url, {"model": "gpt-5", "input": list(history),
                                                                "store": False}, session_id="sess-ctx-remote")
            assert status == 200, events
            history.append({"type": "message", "role": "assistant", "content": completed_output_text(events)})
    assert [m["content"] for m in history if m.get("role") == "assistant"] == ["a", "resumed", "later"]
    comps = [r for r in emulator.requests if r.route == "compaction"]
    assert len(comps) == 1 and comps[0].path == "/backend-api/codex/responses"
    assert comps[0].json["input"][-1] == {"type": "compaction_trigger"}
    assert not any(map(is_turn, emulator.responses_requests))
    fwd = [r for r in emulator.requests if r.route == "responses"]
    assert len(fwd) == 3
    items = [[i for i in r.json["input"] if is_compaction_item(i)] for r in fwd[1:]]
    assert len(items[0]) == 1 and items[0] == items[1]  # compacted at "go on", replayed at "next"
    # retained user messages, then the item: the old answers are gone (the item stands for them)
    assert not [i for i in fwd[1].json["input"] if i.get("role") == "assistant"]


async def test_a_manual_checkpoint_under_strategy_fallback_compacts_a_session_without_tools(emulator,
                                                                                          proxy_factory, tmp_path):
    """`ctproxy context checkpoint` (here its REST call) on a session that declares no tools: under strategy
    notes it would wait for notes_write_file; under `fallback` the next request compacts at once."""
    agent = await configured(emulator, proxy_factory, tmp_path, context={"strategy": "fallback"})
    emulator.script(Text("a"), Text("resumed"), Text("later"))
    history: list[dict[str, Any]] = [{"role": "user", "content": "do the work"}]
    resp = await agent.create(input=list(history))
    history += [plain(o) for o in resp.output]
    assert (await agent.checkpoint())["pending_rollover"] == "checkpoint"
    history.append({"role": "user", "content": "continue"})
    assert (await agent.create(input=list(history))).output_text == "resumed"
    fwd = emulator.responses_requests[1].input_items
    k = next(i for i, item in enumerate(fwd) if is_fallback_message(item))
    assert "do the work" not in json.dumps(fwd[k + 1:])
    # the one bootstrap builder (issue 29 (4)): identity and notes index before, the continuation after
    texts = [text_of(i) for i in fwd]
    assert "This is context window w2" in texts[k - 2] and texts[k - 1].startswith("Existing notes for /root")
    assert "Resume the unfinished work" in texts[k + 1]
    assert text_of(fwd[-1]).endswith("continue") and not any(map(is_turn, emulator.responses_requests))
