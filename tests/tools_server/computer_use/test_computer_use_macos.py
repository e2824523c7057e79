"""The macOS Computer Use client against a faithful double of ChatGPT.app's `codex app-server`
(tests/apps/app_server_double.py): the handshake, one action, approval accept / decline / always,
foreign elicitations declined, a crash mid-call and the restart after it, timeouts, bad images."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.toolserver import make_services
from tools_server.computer_use.family import ComputerUseFamily
from tools_server.computer_use.macos.backend import Budgets, MacBackend
from tools_server.computer_use.macos.paths import Runtime
from tools_server.registry import CallContext

pytestmark = pytest.mark.timeout(120)

DOUBLE = Path(__file__).resolve().parents[2] / "apps" / "app_server_double.py"
STATE, CLICK, LIST = "computer_use_get_app_state", "computer_use_click", "computer_use_list_apps"


class Harness:
    def __init__(self, tmp: Path, mode: str = "", approval: str = "confirm", budgets: Budgets | None = None):
        self.log = tmp / "double.log"
        codex = tmp / "codex"
        # the client gives the app-server a clean environment: the wrapper carries the double's settings
        codex.write_text(f"#!/bin/sh\nexport CU_DOUBLE_MODE='{mode}' CU_DOUBLE_LOG='{self.log}'\n"
                         f"exec '{sys.executable}' '{DOUBLE}' \"$@\"\n")
        codex.chmod(0o755)
        node_repl = tmp / "node_repl"
        node_repl.write_text("#!/bin/sh\nexit 0\n")
        node_repl.chmod(0o755)
        helper = tmp / "codex-home" / "computer-use" / "Codex Computer Use.app"
        helper.mkdir(parents=True)
        self.services = make_services(tmp, {"computer_use.enabled": True, "computer_use.backend": "macos",
                                            "computer_use.approval_mode": approval})
        self.backend = MacBackend(self.services.config.computer_use, Runtime(codex, node_repl, helper),
                                  budgets or Budgets(outer=30.0, rpc=10.0, startup=10.0))
        self.family = ComputerUseFamily(self.services, backend=self.backend)
        self.tools = {t.name: t for t in self.family.tools()}
        self.asked: list[str] = []
        self.answers: list[str] = []
        self.gate: asyncio.Event | None = None

    async def confirm(self, message: str) -> str:
        self.asked.append(message)
        if self.gate is not None:
            await self.gate.wait()
        return self.answers.pop(0)

    async def call(self, name: str, args: dict[str, Any], *, can_ask: bool = True) -> Any:
        ctx = CallContext(services=self.services, transport="mcp")
        if can_ask:
            ctx.confirm = self.confirm  # type: ignore[attr-defined]
        return await self.tools[name].call(args, ctx)

    def messages(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def received(self) -> list[dict]:
        return [m["in"] for m in self.messages() if "in" in m]

    async def close(self) -> None:
        await self.family.close()


@pytest.fixture
async def harness(tmp_path: Path) -> Any:
    made: list[Harness] = []

    def make(**kw: Any) -> Harness:
        h = Harness(tmp_path / f"h{len(made)}", **kw)
        made.append(h)
        return h

    for d in range(4):
        (tmp_path / f"h{d}").mkdir()
    yield make
    for h in made:
        await h.close()


async def test_handshake_and_one_action(harness: Any) -> None:
    h = harness(approval="always")
    res = await h.call(STATE, {"app": " Calculator "})
    assert not res.is_error, res.text
    assert 'button "7"' in res.text
    (image,) = res.images
    assert image.mime_type == "image/png"
    sent = h.received()
    assert all("jsonrpc" not in m for m in sent)
    methods = [m.get("method") for m in sent]
    assert methods[:4] == ["initialize", "initialized", "thread/start", "mcpServerStatus/list"]
    start = next(m for m in sent if m.get("method") == "thread/start")["params"]
    assert start["ephemeral"] is True and list(start["config"]["mcp_servers"]) == ["node_repl"]
    assert start["config"]["mcp_servers"]["node_repl"]["enabled_tools"] == ["js"]
    call = next(m for m in sent if m.get("method") == "mcpServer/tool/call")["params"]
    assert call["server"] == "node_repl" and call["tool"] == "js" and list(call["arguments"]) == ["code"]
    # the app id is trimmed, not re-cased; it travels as data only
    assert '\\"app\\": \\"Calculator\\"' in call["arguments"]["code"]
    assert not (await h.call(CLICK, {"app": "Calculator", "element_index": 1})).is_error
    listing = await h.call(LIST, {})
    assert not listing.is_error and listing.details["apps"][0]["ident"] == "com.apple.calculator"
    shas = {m["template_sha"] for m in h.messages() if "template_sha" in m}
    assert len(shas) == 1  # one fixed source: only its JSON data changed between the three calls
    assert h.backend.starts == 1
    # the elicitation was answered by the approval mode alone
    answers = [m for m in sent if "result" in m and "method" not in m and isinstance(m.get("id"), int)
               and m["id"] > 1000]
    assert answers and answers[0]["result"] == {"action": "accept", "content": {}, "_meta": {"persist": "session"}}


async def test_confirm_accept_once_per_app_and_decline_not_kept(harness: Any) -> None:
    h = harness()
    h.answers = ["decline", "accept"]
    no = await h.call(STATE, {"app": "Calculator"})
    assert no.is_error and no.details["error"] == "approval-declined"
    decline = [m for m in h.received() if m.get("id", 0) > 1000][-1]["result"]
    assert decline["action"] == "decline" and decline["content"] is None
    yes = await h.call(STATE, {"app": "Calculator"})
    assert not yes.is_error and len(h.asked) == 2
    accept = [m for m in h.received() if m.get("id", 0) > 1000][-1]["result"]
    assert accept == {"action": "accept", "content": {}, "_meta": {"persist": "session"}}
    assert not (await h.call(CLICK, {"app": "Calculator", "x": 3, "y": 4})).is_error
    assert len(h.asked) == 2  # granted for this client's lifetime: not asked again
    h.answers = ["accept"]
    assert not (await h.call(STATE, {"app": "TextEdit"})).is_error and len(h.asked) == 3  # another app: asked


async def test_confirm_without_a_way_to_ask_is_approval_unavailable(harness: Any) -> None:
    h = harness()
    res = await h.call(STATE, {"app": "Calculator"}, can_ask=False)
    assert res.is_error and res.details["error"] == "approval-unavailable"


async def test_foreign_elicitation_is_declined(harness: Any) -> None:
    h = harness(mode="foreign_elicitation", approval="always")
    assert not (await h.call(STATE, {"app": "Calculator"})).is_error
    (foreign,) = [m["foreign_answer"] for m in h.messages() if "foreign_answer" in m]
    assert foreign["action"] == "decline"


async def test_crash_mid_call_fails_clearly_and_the_next_call_restarts(harness: Any) -> None:
    h = harness(mode="crash_on_action", approval="always")
    assert not (await h.call(STATE, {"app": "Calculator"})).is_error
    res = await h.call(CLICK, {"app": "Calculator", "element_index": 1})
    assert res.is_error and res.details["error"] == "app-server-exited", res.text
    assert "unknown" in res.text
    blocked = await h.call(CLICK, {"app": "Calculator", "element_index": 1})
    assert blocked.is_error and blocked.details["error"] == "state-required"
    assert h.backend.starts == 1  # refused before anything was sent
    again = await h.call(STATE, {"app": "Calculator"})
    assert not again.is_error and h.backend.starts == 2


async def test_timeout_leaves_the_outcome_unknown(harness: Any) -> None:
    h = harness(mode="hang_on_action", approval="always", budgets=Budgets(outer=1.0, rpc=10.0, startup=10.0))
    assert not (await h.call(STATE, {"app": "Calculator"})).is_error
    res = await h.call(CLICK, {"app": "Calculator", "element_index": 1})
    assert res.is_error and res.details["error"] == "outcome-unknown"
    assert (await h.call(CLICK, {"app": "Calculator", "element_index": 1})).details["error"] == "state-required"


async def test_a_live_confirmation_pauses_the_outer_budget(harness: Any) -> None:
    h = harness(budgets=Budgets(outer=0.5, rpc=10.0, startup=10.0))
    h.answers = ["accept"]
    h.gate = asyncio.Event()
    call = asyncio.create_task(h.call(STATE, {"app": "Calculator"}))
    while not h.asked:
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)  # three outer budgets pass while the user decides
    assert not call.done()
    h.gate.set()
    res = await call
    assert not res.is_error, res.text


async def test_node_repl_not_ready_is_reported_as_such(harness: Any) -> None:
    h = harness(mode="node_repl_failed", approval="always")
    res = await h.call(STATE, {"app": "Calculator"})
    assert res.is_error and res.details["error"] == "node-repl-unavailable"


async def test_jpeg_is_labelled_jpeg_and_unknown_bytes_fail(harness: Any) -> None:
    h = harness(mode="jpeg", approval="always")
    res = await h.call(STATE, {"app": "Calculator"})
    assert not res.is_error and res.images[0].mime_type == "image/jpeg"
    bad = harness(mode="bad_image", approval="always")
    res = await bad.call(STATE, {"app": "Calculator"})
    assert res.is_error and res.details["error"] == "bad-image"


async def test_on_linux_the_real_backend_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    services = make_services(tmp_path, {"computer_use.enabled": True, "computer_use.backend": "macos",
                                        "computer_use.approval_mode": "always"})
    family = ComputerUseFamily(services)
    tool = {t.name: t for t in family.tools()}[STATE]
    res = await tool.call({"app": "Calculator"}, CallContext(services=services))
    assert res.is_error and res.details["error"] == "backend-unavailable"
    if sys.platform != "darwin":
        assert "macOS only" in res.text
    await family.close()


async def test_confirm_through_mcp_elicitation_with_the_official_client(harness: Any) -> None:
    """The chain Sky → app-server → our client → MCP form elicitation → the official `mcp` client's callback,
    with the Confirm that `approval.mcp_confirm_for` builds from the MCP request (the tool server's endpoint
    sets it for clients that can be asked)."""
    import mcp_types as types
    from mcp.client.client import Client
    from mcp.server.lowlevel import Server

    from tools_server.computer_use.approval import mcp_confirm_for

    h = harness()
    asked: list[str] = []

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=n, input_schema=t.json_schema())
                                            for n, t in h.tools.items()])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        call_ctx = CallContext(services=h.services, transport="mcp")
        call_ctx.confirm = mcp_confirm_for(ctx)  # type: ignore[attr-defined]
        result = await h.tools[params.name].call(dict(params.arguments or {}), call_ctx)
        return types.CallToolResult(content=[types.TextContent(type="text", text=result.text)],
                                    structured_content=result.structured(), is_error=result.is_error)

    async def answer(ctx: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept" if len(asked) == 1 else "decline", content={})

    server = Server("cu-test", on_list_tools=list_tools, on_call_tool=call_tool)
    async with Client(server, elicitation_callback=answer, mode="legacy") as client:
        first = await client.call_tool(STATE, {"app": "Calculator"})
        assert not first.is_error and len(asked) == 1 and "Calculator" in asked[0]
        second = await client.call_tool(STATE, {"app": "Calculator"})
        assert not second.is_error and len(asked) == 1  # approved once for this server's lifetime
        other = await client.call_tool(STATE, {"app": "Notes"})
        assert other.is_error and other.structured_content["error"] == "approval-declined" and len(asked) == 2
    async with Client(server, mode="legacy") as client:  # a client without elicitation cannot be asked
        res = await client.call_tool(STATE, {"app": "Notes"})
        assert res.is_error and res.structured_content["error"] == "approval-unavailable"
