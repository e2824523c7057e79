"""Issue 13: Codex CLI (`codex exec`, npm @openai/codex, installed by scripts/bootstrap.sh) through `ctproxy up`
with the context tools reachable, against the validating emulator (every request checked against the official
OpenAPI description and the real API's input rules). A rollover happens and Codex completes its turn (exit 0,
its final message), in the three ways a window changes for Codex:

1. over MCP (`ctproxy codex-config`): the model calls `new_context` in Codex's `mcp__ctproxy` namespace, Codex
   runs it on the tool server, and Codex's very next sampling request starts in the new window;
2. bridged (`--bridge context,notes`): ctproxy runs `new_context` itself and continues the turn in the new
   window; the model then calls Codex's own shell tool and Codex completes, and Codex's next request stays
   in the new window (Codex resends no `mcp_call`: the boundary is found after its own request items);
3. the hard trigger: the model's answer used 90% of the window; before forwarding Codex's next request ctproxy
   runs the checkpoint turn (one own-notes write), rolls over, and forwards Codex's request in the new window.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from proxy.windows.notes.checkpoint_turn import CHOICE as CHECKPOINT_CHOICE
from tests.emulator import CustomToolCall, Emulator, FunctionCall, Text
from tests.openapi_schema import spec_available
from tests.proxy.windows.test_context_rollover import text_of
from tests.support.cli import ctproxy_out as cli
from tests.support.codex import codex_env, isolated_dirs, run_codex
from tests.support.proxyproc import ProxyProcess

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 180.0
PROMPT = "count the files, then tell me"
ANSWER = "Resumed in a new context window; done."
SETTINGS = """\
model = "gpt-5"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"""




async def codex_exec(tmp: Path, proxy: ProxyProcess, emulator: Emulator,
                     mcp: bool = True) -> tuple[str, list[dict[str, Any]]]:
    """`codex exec --json` with the config `ctproxy codex-config` writes (the provider, and the MCP server unless
    `mcp=False`: with the bridge, Codex's own MCP tools of the same names would displace the bridged ones), no
    sandbox (the shell tool runs), a fresh HOME; asserts exit 0 and returns the final message and the events."""
    home, codex_home, work = isolated_dirs(tmp)
    config = codex_home / "config.toml"
    config.write_text(SETTINGS)
    no_mcp = [] if mcp else ["--no-mcp"]
    await asyncio.to_thread(cli, proxy.state_dir, "codex-config", "--write", str(config), *no_mcp)
    last = tmp / "last-message.txt"
    env = codex_env(home, codex_home, OPENAI_API_KEY="sk-codex-test-not-real")
    code, out, err = await run_codex(["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                                      "--json", "--output-last-message", str(last), PROMPT], work, env, TIMEOUT)
    statuses = [(r.route, r.status) for r in emulator.requests]
    assert code == 0, (f"codex exec failed ({code}): {statuses}\n{err.decode()[-3000:]}\n"
                                  f"proxy log:\n{proxy.log()[-3000:]}")
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    return (last.read_text() if last.exists() else ""), events


def task_of(codex_home: Path) -> str:
    data = tomllib.loads((codex_home / "config.toml").read_text())
    return data["model_providers"]["ctproxy"]["http_headers"]["x-ctp-task"]


def assert_new_window(items: list[dict[str, Any]]) -> None:
    """The forwarded request starts with the notes bootstrap of window w2; Codex's prompt (window w1) is gone."""
    texts = [text_of(i) for i in items if i.get("role") == "developer"]
    assert any("context window w2" in t and "previous window is w1" in t for t in texts), texts
    assert any(t.startswith("Existing notes for /root at this context-window reset") for t in texts), texts
    assert any("Resume the unfinished work" in t for t in texts), texts
    assert PROMPT not in json.dumps(items)


def all_valid(emulator: Emulator) -> None:
    """validate_requests: a body that violates CreateResponse (or the input rules) would have had a 400."""
    turns = emulator.responses_requests
    assert turns and all(r.status == 200 for r in turns), [(r.status, r.extra.get("error_body")) for r in turns]


async def start(tmp_path: Path, emulator: Emulator, extra: list[str]) -> ProxyProcess:
    return await ProxyProcess(tmp_path / "state", upstream=emulator.url, extra_args=extra).astart()


async def test_codex_calls_new_context_over_mcp_and_its_next_request_is_in_the_new_window(tmp_path: Path) -> None:
    async with Emulator(validate_requests=spec_available()) as emulator:
        proxy = await start(tmp_path, emulator, [])
        try:
            emulator.script(FunctionCall("new_context", {}, namespace="mcp__ctproxy", call_id="call_nc"),
                            Text(ANSWER, deltas=3))
            last, events = await codex_exec(tmp_path, proxy, emulator)
            assert last.strip() == ANSWER
            calls = [e["item"] for e in events if e.get("type") == "item.completed"
                     and e.get("item", {}).get("type") == "mcp_tool_call"]
            assert [(c["tool"], c["status"]) for c in calls] == [("new_context", "completed")], calls
            all_valid(emulator)
            first, second = emulator.responses_requests
            assert PROMPT in json.dumps(first.input_items)
            assert_new_window(second.input_items)
            # the new_context call and its output are before the boundary: replaced, as the rest of window w1
            assert "call_nc" not in json.dumps(second.input_items)
            windows = cli(proxy.state_dir, "tasks")
            assert f"task {task_of(tmp_path / 'codex-home')}" in windows
        finally:
            await proxy.astop()


async def bridged_run(tmp_path: Path) -> list[Any]:
    """Codex with `--bridge context,notes`: the model calls the bridged `new_context`, then Codex's own shell;
    Codex completes. Returns the three requests the emulator received (round 1, the bridge's round 2, and
    Codex's next request with the shell's output)."""
    async with Emulator(validate_requests=spec_available()) as emulator:
        proxy = await start(tmp_path, emulator, ["--bridge", "context,notes"])
        try:
            emulator.script(FunctionCall("new_context", {}, call_id="call_nc"),  # bridged: ctproxy runs it
                            FunctionCall("exec_command", {"cmd": "ls | wc -l"}, call_id="call_sh"),  # Codex's own
                            Text(ANSWER, deltas=3))
            last, _ = await codex_exec(tmp_path, proxy, emulator, mcp=False)
            assert last.strip() == ANSWER
            all_valid(emulator)
            return list(emulator.responses_requests)
        finally:
            await proxy.astop()


async def test_codex_with_a_bridged_new_context_rolls_over_mid_turn(tmp_path: Path) -> None:
    first, round2, second = await bridged_run(tmp_path)
    assert "new_context" in first.tool_names and PROMPT in json.dumps(first.input_items)
    # the bridge's next round of the same agent request is already in the new window (docs/context.md)
    assert_new_window(round2.input_items)
    assert "call_nc" not in json.dumps(round2.input_items)
    assert any(i.get("type") == "function_call_output" and i.get("call_id") == "call_sh"
               for i in second.input_items)  # Codex ran its shell and sent the output


async def test_codex_after_a_bridged_new_context_stays_in_the_new_window(tmp_path: Path) -> None:
    _, _, second = await bridged_run(tmp_path)
    assert_new_window(second.input_items)


async def test_codex_at_the_hard_trigger_gets_its_answer_after_the_checkpoint_turn(tmp_path: Path) -> None:
    cfg = tmp_path / "ctx.json"
    cfg.write_text(json.dumps({"model_windows": {"gpt-5": 100_000}, "context": {"hard_ratio": 0.85}}))
    async with Emulator(validate_requests=spec_available()) as emulator:
        proxy = await start(tmp_path, emulator, ["--config", str(cfg), "--bridge", "notes,context"])
        try:
            emulator.script(
                FunctionCall("exec_command", {"cmd": "ls | wc -l"}, call_id="call_sh",
                             usage={"input_tokens": 90_000}),  # the window is 90% full after this answer
                FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": "counting files; ls ran\n"},
                             call_id="call_ck"),  # the checkpoint turn's one write
                Text(ANSWER, deltas=3))
            last, _ = await codex_exec(tmp_path, proxy, emulator, mcp=False)
            assert last.strip() == ANSWER
            all_valid(emulator)
            first, turn, forwarded = emulator.responses_requests
            assert PROMPT in json.dumps(first.input_items) and PROMPT in json.dumps(turn.input_items)
            assert turn.json["tool_choice"] == CHECKPOINT_CHOICE
            # the tools the request before went up with, kept (the prompt's cached head, issue 47)
            assert turn.json["tools"][: len(first.json["tools"])] == first.json["tools"]
            assert "notes_write_file" in [t.get("name") for t in turn.json["tools"]] and turn.json["stream"] is False
            assert any(i.get("call_id") == "call_sh" for i in turn.input_items)  # the window, whole
            notes = list((proxy.state_dir / "notes").rglob("checkpoint.md"))
            assert [p.read_text() for p in notes] == ["counting files; ls ran\n"]
            assert_new_window(forwarded.input_items)
            assert '"path":"/root/notes/checkpoint.md"' in json.dumps(forwarded.input_items).replace('\\"', '"')
            assert forwarded.json["stream"] is True  # Codex's own request, streaming as sent
        finally:
            await proxy.astop()


def developer_texts(items: list[dict[str, Any]]) -> list[str]:
    return [text_of(i) for i in items if i.get("role") == "developer"]


async def test_codex_config_session_gets_guidance_identity_markers_reminder_and_the_checkpoint_turn(
        tmp_path: Path) -> None:
    """Issue 46 defect 1 with the real client: `ctproxy codex-config` makes Codex declare ctproxy's tools inside
    its `mcp__ctproxy` namespace; that session is a context-managed one like any other. Its first request carries
    the guidance naming the tools as the model sees them (`mcp__ctproxy.history_read_item`) and the window
    identity; the next carries `[id: …]` markers and, past reminder_ratio, the reminder; past hard_ratio ctproxy
    runs the checkpoint turn (the write through the tool server) and forwards Codex's request in window w2.
    On the old code none of this happened (the namespace was not read)."""
    cfg = tmp_path / "ctx.json"
    cfg.write_text(json.dumps({"model_windows": {"gpt-5": 100_000},
                               "context": {"reminder_ratio": 0.5, "hard_ratio": 0.85}}))
    async with Emulator(validate_requests=spec_available()) as emulator:
        proxy = await start(tmp_path, emulator, ["--config", str(cfg)])
        try:
            emulator.script(
                FunctionCall("exec_command", {"cmd": "ls | wc -l"}, call_id="call_sh1",
                             usage={"input_tokens": 60_000}),  # 60 %: the reminder is due on the next request
                FunctionCall("exec_command", {"cmd": "ls -a | wc -l"}, call_id="call_sh2",
                             usage={"input_tokens": 90_000}),  # 90 %: the hard trigger on the next one
                FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": "counting files; ls ran\n"},
                             call_id="call_ck"),  # the checkpoint turn's one write
                Text(ANSWER, deltas=3))
            last, _ = await codex_exec(tmp_path, proxy, emulator)
            assert last.strip() == ANSWER
            all_valid(emulator)
            first, second, turn, forwarded = emulator.responses_requests
            namespaces = [t for t in first.json["tools"] if t.get("type") == "namespace"]
            assert "mcp__ctproxy" in [t["name"] for t in namespaces], first.json["tools"]

            guidance = [t for t in developer_texts(first.input_items) if t.startswith("<ctproxy_context_guidance>")]
            assert len(guidance) == 1
            assert "mcp__ctproxy.history_read_item" in guidance[0] and "mcp__ctproxy.notes_write_file" in guidance[0]
            assert any(t.startswith("You are agent /root") and "context window w1" in t
                       for t in developer_texts(first.input_items)), developer_texts(first.input_items)

            body = json.dumps(second.input_items)
            assert "[id: " in body  # the markers history_read_item takes
            reminders = [t for t in developer_texts(second.input_items) if "<ctproxy_context_reminder>" in t]
            assert len(reminders) == 1 and "mcp__ctproxy.notes_write_file" in reminders[0], reminders
            assert second.input_items[-1].get("role") == "developer"  # the reminder goes last

            assert turn.json["tool_choice"] == CHECKPOINT_CHOICE
            assert turn.json["stream"] is False
            notes = list((proxy.state_dir / "notes").rglob("checkpoint.md"))
            assert [p.read_text() for p in notes] == ["counting files; ls ran\n"]
            assert_new_window(forwarded.input_items)
            assert forwarded.json["stream"] is True
        finally:
            await proxy.astop()


async def test_codex_0171_default_model_lite_path_gets_the_guidance_for_its_mcp_tools(tmp_path: Path) -> None:
    """Issue 44 (2) with Codex 0.171's default kind of model (`gpt-6.2-astra`: `use_responses_lite`,
    `tool_mode: "code_mode_only"`), set up by codex-config: Codex sends its tools in an `additional_tools` input
    item and names ctproxy's MCP tools in its namespace there or only as a deferred namespace in a developer
    message. Either way ctproxy sees them: one guidance naming `mcp__ctproxy.…`, and the window identity; the
    `additional_tools` item stays first, as Codex sent it."""
    async with Emulator(validate_requests=spec_available()) as emulator:
        proxy = await start(tmp_path, emulator, [])
        try:
            emulator.script(Text(ANSWER, deltas=3))
            home, codex_home, work = isolated_dirs(tmp_path)
            config = codex_home / "config.toml"
            config.write_text(SETTINGS.replace('model = "gpt-5"', 'model = "gpt-6.2-astra"'))
            await asyncio.to_thread(cli, proxy.state_dir, "codex-config", "--write", str(config))
            env = codex_env(home, codex_home, OPENAI_API_KEY="sk-codex-test-not-real")
            code, _, err = await run_codex(["exec", "--skip-git-repo-check",
                                            "--dangerously-bypass-approvals-and-sandbox", PROMPT], work, env,
                                           TIMEOUT)
            assert code == 0, f"{err.decode()[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
            all_valid(emulator)
            first = emulator.responses_requests[0]
            items = first.input_items
            assert items[0].get("type") == "additional_tools", items[0]
            body = json.dumps(first.json)
            assert "mcp__ctproxy" in body  # Codex declared ctproxy's tools somewhere: namespace or deferred
            guidance = [t for t in developer_texts(items) if t.startswith("<ctproxy_context_guidance>")]
            assert len(guidance) == 1, developer_texts(items)
            # in ctproxy's namespace, or (deferred, code mode) as `exec` calls it
            assert ("mcp__ctproxy.history_read_item" in guidance[0]
                    or "mcp__ctproxy__history_read_item" in guidance[0]), guidance[0]
            assert any(t.startswith("You are agent /root") and "context window w1" in t
                       for t in developer_texts(items))
        finally:
            await proxy.astop()


async def test_codex_0171_code_mode_calls_ctproxys_deferred_tool_through_exec(tmp_path: Path) -> None:
    """Issue 44 (2), `code_mode_only`: the model only calls Codex's `exec`; its JavaScript calls ctproxy's MCP
    tool (`tools.mcp__ctproxy__notes_write_file`, the name the guidance gives in code mode), Codex runs it on
    the tool server, and the note is written in the task codex-config made."""
    async with Emulator(validate_requests=spec_available()) as emulator:
        proxy = await start(tmp_path, emulator, [])
        try:
            script = ('const r = await tools.mcp__ctproxy__notes_write_file({path: "plan.md", text: "from exec\\n"});\n'
                      "text(JSON.stringify(r));\n")
            emulator.script(CustomToolCall("exec", script, call_id="call_exec"), Text(ANSWER, deltas=3))
            home, codex_home, work = isolated_dirs(tmp_path)
            config = codex_home / "config.toml"
            config.write_text(SETTINGS.replace('model = "gpt-5"', 'model = "gpt-6.2-astra"'))
            await asyncio.to_thread(cli, proxy.state_dir, "codex-config", "--write", str(config))
            env = codex_env(home, codex_home, OPENAI_API_KEY="sk-codex-test-not-real")
            code, _, err = await run_codex(["exec", "--skip-git-repo-check",
                                            "--dangerously-bypass-approvals-and-sandbox", PROMPT], work, env,
                                           TIMEOUT)
            assert code == 0, f"{err.decode()[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
            all_valid(emulator)
            notes = list((proxy.state_dir / "notes").rglob("plan.md"))
            assert [p.read_text() for p in notes] == ["from exec\n"], emulator.responses_requests[-1].input_items[-2:]
            guidance = [t for t in developer_texts(emulator.responses_requests[0].input_items)
                        if t.startswith("<ctproxy_context_guidance>")]
            assert guidance and "mcp__ctproxy__notes_write_file" in guidance[0]
        finally:
            await proxy.astop()
