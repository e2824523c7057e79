"""One road (issue 30; DESIGN §4): the same tool call made over REST, MCP, the proxy's bridge, Codex's backend
route and from a code-mode cell takes `ToolService.call`: it is journaled the same way, reaches the policy
hook exactly once, and obeys tool discovery. The tool server runs on loopback with the real clients of each
road (aiohttp for REST and the bridge and Codex's backend route as Codex POSTs it, the official `mcp`
client, a real V8 cell)."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import aiohttp
import pytest

from tests.support.toolserver import ToolServerHandle
from tests.tools_server.history.test_history_tools import build_world
from tools_server.metrics_endpoint import METRICS_KEY, ToolCallRecord

pytestmark = pytest.mark.timeout(120)

TOOL = "notes_list_files_by_prefix"


class Hooks:
    """The policy seam's hooks (`shell.policy`): records what each call told it."""

    calls: ClassVar[list[dict[str, Any]]] = []

    def policy(self, call: Any) -> None:
        Hooks.calls.append(call.as_dict())


async def _post(srv: ToolServerHandle, path: str, body: Any, task: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(
            f"{srv.url}{path}", data=json.dumps(body), headers=srv.headers(task, "/root")) as resp:
        return resp.status, await resp.json()


async def over(road: str, srv: ToolServerHandle, task: str) -> tuple[bool, str]:
    """The same call over one road: (answered without error, the answer's text)."""
    if road == "rest":
        res = await srv.rest(TOOL, {}, task=task, agent="/root")
        return res.ok, json.dumps(res.body)
    if road == "mcp":
        m = await srv.mcp(TOOL, {}, task=task, agent="/root")
        return not m.is_error, m.text
    if road == "bridge":
        _, body = await _post(srv, "/v1/bridge/call", {"name": TOOL, "arguments": "{}", "task": task,
                                                       "agent": "/root", "call_id": "fc_1"}, task)
        return not body["is_error"], body["output"]
    if road == "codex":
        status, body = await _post(srv, "/v1/alpha/notes/v2/list_files_by_prefix", {}, task)
        return status == 200 and body["ok"], json.dumps(body)
    assert road == "cell"
    # a cell whose nested call is refused fails with that call's error, as the script did not catch it
    res = await srv.rest("exec", {"code": f"const r = await tools.{TOOL}({{}}); return r.ok",
                                  "yield_time_ms": 20000}, task=task, agent="/root")
    assert res.status == 200 and res.details["status"] in ("completed", "failed"), res.body
    return res.ok and res.details["status"] == "completed", res.text


ROADS = ("rest", "mcp", "bridge", "codex", "cell")
TRANSPORT = {"rest": "rest", "mcp": "mcp", "bridge": "bridge", "codex": "codex", "cell": "cell"}


def journal_of(srv: ToolServerHandle, name: str) -> list[ToolCallRecord]:
    assert srv.app is not None
    return [r for r in srv.app[METRICS_KEY].recent if r.name == name]


async def test_the_same_call_over_five_roads_takes_one_road(tool_server) -> None:
    srv = await tool_server({"code_mode.enabled": True, "tool_discovery.enabled": True,
                             "tool_discovery.deferred": [TOOL],
                             "shell.policy": "tests.tools_server.test_one_road:Hooks"})
    world = build_world(srv.services.state, srv.services)
    try:
        task = world.task
        Hooks.calls.clear()
        # Discovery: deferred and not loaded, the call is refused on every road, before the policy hook.
        for road in ROADS:
            ok, text = await over(road, srv, task)
            assert not ok and "not loaded" in text and "find_tools" in text, (road, text)
        assert [c for c in Hooks.calls if c["tool"] == TOOL] == []
        refused = journal_of(srv, TOOL)
        assert [(r.transport, r.outcome) for r in refused] == [(TRANSPORT[r], "refused") for r in ROADS]

        # Not deferred any more: each road runs it, reaches the hook once, and journals one record.
        srv.services.config.tool_discovery.deferred = []
        for road in ROADS:
            before_hooks, before_journal = len(Hooks.calls), len(journal_of(srv, TOOL))
            ok, text = await over(road, srv, task)
            assert ok, (road, text)
            reached = [c for c in Hooks.calls[before_hooks:] if c["tool"] == TOOL]
            assert len(reached) == 1, (road, reached)
            call = reached[0]
            assert (call["transport"], call["task"], call["agent"]) == (TRANSPORT[road], task, "/root")
            if road == "cell":
                assert call["path"] == "nested" and call["cell_id"]
                exec_call = [c for c in Hooks.calls[before_hooks:] if c["tool"] == "exec"]
                assert len(exec_call) == 1 and exec_call[0]["path"] == "direct"
                assert exec_call[0]["cell_id"] is None
            else:
                assert call["path"] == "direct" and call["cell_id"] is None
            records = journal_of(srv, TOOL)[before_journal:]
            assert [(r.transport, r.outcome, r.agent) for r in records] == [(TRANSPORT[road], "ok", "/root")]
    finally:
        world.journal.close()


class Deny:
    """A policy that refuses one agent everything, and records what it was asked."""

    calls: ClassVar[list[dict[str, Any]]] = []

    def policy(self, call: Any) -> str | None:
        Deny.calls.append(call.as_dict())
        return "agent /denied may not change anything" if call.agent == "/denied" else None


async def test_the_policy_seam_covers_apply_patch_direct_and_nested(tool_server, tmp_path) -> None:
    """Seed 004 defect 4: the policy hook is asked for apply_patch, called directly or from a cell, and a
    nested call names its cell; what it refuses changes nothing."""
    srv = await tool_server({"code_mode.enabled": True, "apply_patch.enabled": True, "shell.enabled": True,
                             "code_mode.approval_mode": "always",
                             "shell.policy": "tests.tools_server.test_one_road:Deny"},
                            workspace=tmp_path)
    Deny.calls.clear()
    patch = "*** Begin Patch\n*** Add File: x.txt\n+x\n*** End Patch"
    direct = await srv.rest("apply_patch", {"patch": patch}, task="t", agent="/denied")
    assert not direct.ok and direct.details["error"] == "policy-refused", direct.body
    assert "may not change anything" in direct.text
    code = f"try {{ await tools.apply_patch({{patch: {json.dumps(patch)}}}) }} catch (e) {{ print('refused', e.code) }}"
    nested = await srv.rest("exec", {"code": code, "yield_time_ms": 20000}, task="t", agent="/denied")
    assert nested.details["error"] == "policy-refused"  # the exec itself is refused by the same policy
    allowed = await srv.rest("exec", {"code": code, "yield_time_ms": 20000}, task="t", agent="/ok")
    assert allowed.ok and "refused" not in allowed.text, allowed.text
    assert (tmp_path / "x.txt").read_text() == "x\n"  # only the allowed agent's nested patch applied
    patches = [c for c in Deny.calls if c["tool"] == "apply_patch"]
    assert [(c["agent"], c["path"], c["transport"], bool(c["cell_id"])) for c in patches] == [
        ("/denied", "direct", "rest", False), ("/ok", "nested", "cell", True)]
    assert patches[1]["cell_id"] == allowed.details["cell_id"]
    (tmp_path / "x.txt").unlink()

    # a policy that refuses only nested patches: the cell's call is refused, a direct one goes through
    Deny.calls.clear()
    srv.services.config.shell.policy = "tests.tools_server.test_one_road:DenyNested"
    nested = await srv.rest("exec", {"code": code, "yield_time_ms": 20000}, task="t", agent="/ok")
    assert nested.ok and "refused policy-refused" in nested.text, nested.text
    assert not (tmp_path / "x.txt").exists()
    assert (await srv.rest("apply_patch", {"patch": patch}, task="t", agent="/ok")).ok


class DenyNested:
    def policy(self, call: Any) -> str | None:
        return "no patches from code cells" if call.tool == "apply_patch" and call.path == "nested" else None
