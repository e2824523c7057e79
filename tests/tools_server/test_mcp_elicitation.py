"""Approvals asked through MCP elicitation over the tool server's real /mcp (the official `mcp` client with an
elicitation callback): Computer Use `confirm` on the Linux backend (Xvfb + the GTK test app) — accept,
decline, asked once per app for the server's lifetime — and a client without the capability answered
`approval-unavailable`; code mode's nested `apply_patch` asked the same way (accept, decline, through the
call observing the cell, refused over REST and for clients that cannot be asked)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.support import desktop as desktop_support
from tests.support.toolserver import ToolServerHandle

pytestmark = pytest.mark.timeout(240)

STATE, CLICK = "computer_use_get_app_state", "computer_use_click"
CODE_ON = {"code_mode.enabled": True, "shell.enabled": True, "apply_patch.enabled": True}
PATCH = "*** Begin Patch\n*** Add File: made.txt\n+made by a cell\n*** End Patch\n"
DESKTOP_MISSING = desktop_support.missing()
needs_desktop = pytest.mark.skipif(bool(DESKTOP_MISSING), reason=DESKTOP_MISSING or "")


@dataclass
class Person:
    """The human behind an MCP client: answers each elicitation from `answers`, in order, after `before()`."""

    answers: list[str]
    before: Callable[[], Awaitable[None]] | None = None
    asked: list[str] = field(default_factory=list)
    schemas: list[Any] = field(default_factory=list)

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        self.asked.append(params.message)
        self.schemas.append(getattr(params, "requested_schema", None))
        if self.before is not None:
            await self.before()
        if not self.answers:
            return types.ErrorData(code=types.INVALID_REQUEST, message="the test did not expect this question")
        action = self.answers.pop(0)
        return types.ElicitResult(action=action, content={} if action == "accept" else None)  # type: ignore[arg-type]


@dataclass
class Reply:
    text: str
    is_error: bool
    structured: dict[str, Any] | None


@contextlib.asynccontextmanager
async def mcp_session(srv: ToolServerHandle, person: Person | None = None) -> AsyncIterator[Callable[..., Any]]:
    """One MCP session; with `person` the client declares elicitation and answers through it."""
    async with srv._mcp_client(None, None, None) as client, streamable_http_client(
        f"{srv.url}/mcp", http_client=client
    ) as (read, write), ClientSession(read, write, elicitation_callback=person) as session:
        await session.initialize()

        async def call(name: str, arguments: dict[str, Any]) -> Reply:
            result = await session.call_tool(name, arguments)
            texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
            return Reply("\n".join(texts), bool(result.is_error), result.structured_content)

        yield call


async def until(probe: Callable[[], Awaitable[Any]], what: str, timeout: float = 60.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await probe()):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)
    return value


# -- Computer Use on the Linux backend --------------------------------------------------------------------

@pytest.fixture(scope="module")
def desk() -> Any:
    if DESKTOP_MISSING:
        pytest.skip(DESKTOP_MISSING)
    d = desktop_support.Desktop()
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def app(desk: Any, request: pytest.FixtureRequest) -> Any:
    title = "EL " + request.node.name.removeprefix("test_").replace("_", " ")[:40]
    proc = desk.start_app(title)
    yield title.lower().replace(" ", "-")
    desk.stop(proc)


async def listed(srv: ToolServerHandle, app: str) -> None:
    async def probe() -> bool:
        res = await srv.rest("computer_use_list_apps", {})
        assert res.ok, res.body
        return any(a["name"] == app for a in res.details["apps"])
    await until(probe, f"{app} in list_apps")


def element(text_tree: list[dict], role: str) -> dict:
    (hit,) = [e for e in text_tree if e["role"] == role]
    return hit


@needs_desktop
async def test_accept_is_asked_once_per_app_and_caller(desk: Any, app: str, tool_server: Any) -> None:
    """Seed 004 defect 16: a grant is the caller's that gave it (its MCP session), for the server's life."""
    srv = await tool_server(desk.overrides())  # approval_mode: confirm, the default
    await listed(srv, app)
    person = Person(["accept"])
    async with mcp_session(srv, person) as call:
        first = await call(STATE, {"app": app})
        assert not first.is_error, first.text
        assert 'label "not clicked"' in first.text
        assert len(person.asked) == 1 and f"'{app}'" in person.asked[0]
        assert person.schemas[0]["type"] == "object"  # a form with no fields: a yes/no question
        button = element(first.structured["tree"], "push button")
        click = await call(CLICK, {"app": app, "element_index": button["index"]})
        assert not click.is_error, click.text
        assert len(person.asked) == 1  # the same app, the same session: not asked again
    # another client's session is asked for itself; REST (which can never ask) does not ride the grant
    later = Person(["accept"])
    async with mcp_session(srv, later) as call:
        assert not (await call(STATE, {"app": app})).is_error
    assert len(later.asked) == 1
    rest = await srv.rest(STATE, {"app": app})
    assert not rest.ok and rest.details["error"] == "approval-unavailable"
    # a fresh tool server has no grant: grants are in memory only
    fresh = await tool_server(desk.overrides())
    res = await fresh.rest(STATE, {"app": app})
    assert not res.ok and res.details["error"] == "approval-unavailable"


@needs_desktop
async def test_decline_does_nothing_and_is_asked_again(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "confirm"}))
    await listed(srv, app)
    person = Person(["decline", "cancel", "accept"])
    async with mcp_session(srv, person) as call:
        # the click would have changed the label: a decline must stop it before any action
        no = await call(CLICK, {"app": app, "x": 40, "y": 40})
        assert no.is_error and no.structured["error"] == "approval-declined", no.structured
        dismissed = await call(STATE, {"app": app})  # the person closed the dialog: not a yes either
        assert dismissed.is_error and dismissed.structured["error"] == "approval-declined"
        yes = await call(STATE, {"app": app})
        assert not yes.is_error and 'label "not clicked"' in yes.text  # nothing was clicked before
    assert len(person.asked) == 3 and all(f"'{app}'" in m for m in person.asked)


@needs_desktop
async def test_a_client_without_elicitation_gets_approval_unavailable(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides())
    await listed(srv, app)
    async with mcp_session(srv, None) as call:  # the official client declares elicitation only with a callback
        res = await call(CLICK, {"app": app, "x": 40, "y": 40})
    assert res.is_error and res.structured["error"] == "approval-unavailable", res.structured
    assert "elicitation" in res.structured["message"]
    # nothing was granted by it, and the app was not touched: an eliciting client is asked and sees the label
    person = Person(["accept"])
    async with mcp_session(srv, person) as call:
        res = await call(STATE, {"app": app})
    assert not res.is_error and 'label "not clicked"' in res.text and len(person.asked) == 1


# -- code mode's nested apply_patch ---------------------------------------------------------------------------

def cell_patch(patch: str = PATCH) -> str:
    return (f"try {{ const r = await tools.apply_patch({{patch: {json.dumps(patch)}}}); print('ok', r.ok) }}\n"
            "catch (e) { print('refused', e.code) }")


async def test_nested_apply_patch_is_asked_and_accept_applies_it(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(CODE_ON, workspace=tmp_path)
    person = Person(["accept"])
    async with mcp_session(srv, person) as call:
        res = await call("exec", {"code": cell_patch()})
    assert not res.is_error and "ok true" in res.text, res.text
    assert (tmp_path / "made.txt").read_text() == "made by a cell\n"
    assert len(person.asked) == 1 and "made.txt" in person.asked[0]


async def test_nested_apply_patch_declined_or_unaskable_changes_nothing(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(CODE_ON, workspace=tmp_path)
    person = Person(["decline"])
    async with mcp_session(srv, person) as call:
        res = await call("exec", {"code": cell_patch()})
    assert "refused approval-declined" in res.text, res.text
    assert len(person.asked) == 1 and not (tmp_path / "made.txt").exists()
    async with mcp_session(srv, None) as call:  # no elicitation capability
        res = await call("exec", {"code": cell_patch()})
    assert "refused approval-unavailable" in res.text, res.text
    rest = await srv.rest("exec", {"code": cell_patch()})  # REST can never ask
    assert rest.ok and "refused approval-unavailable" in rest.text
    bad = Person(["accept"])
    async with mcp_session(srv, bad) as call:  # a wrong patch is an argument error: nobody is asked
        res = await call("exec", {"code": cell_patch("nonsense")})
    assert "refused invalid_patch" in res.text and bad.asked == []
    assert not (tmp_path / "made.txt").exists()


async def test_a_question_holds_the_exec_call_open_past_its_yield_time(tool_server: Any, tmp_path: Path) -> None:
    """The question rides the exec call's own stream: the call does not return at its yield time while the
    person has not answered (the answer comes well after the 250 ms yield), and the cell's result is in it."""
    srv = await tool_server(CODE_ON, workspace=tmp_path)

    async def think() -> None:
        await asyncio.sleep(1.5)

    person = Person(["accept"], before=think)
    async with mcp_session(srv, person) as call:
        res = await call("exec", {"code": cell_patch(), "yield_time_ms": 250})
    assert not res.is_error and "ok true" in res.text and res.structured["status"] != "running", res.structured
    assert (tmp_path / "made.txt").exists()


async def test_two_open_questions_both_hold_the_call(tool_server: Any, tmp_path: Path) -> None:
    """Two patches at once from one cell: the call stays open until both are answered (the first answer
    alone does not release it), and both are applied."""
    srv = await tool_server(CODE_ON, workspace=tmp_path)
    second = PATCH.replace("made.txt", "also.txt")
    answered: list[int] = []

    async def think() -> None:
        # the first question is answered at once, the second only well after the 250 ms yield
        if answered:
            await asyncio.sleep(1.5)
        answered.append(1)

    person = Person(["accept", "accept"], before=think)
    code = (f"const rs = await Promise.all([tools.apply_patch({{patch: {json.dumps(PATCH)}}}), "
            f"tools.apply_patch({{patch: {json.dumps(second)}}})]);\nprint('both', rs.map(r => r.ok).join(','))")
    async with mcp_session(srv, person) as call:
        res = await call("exec", {"code": code, "yield_time_ms": 250})
    assert not res.is_error and "both true,true" in res.text, res.text
    assert len(person.asked) == 2 and (tmp_path / "made.txt").exists() and (tmp_path / "also.txt").exists()


async def test_the_question_goes_to_the_call_observing_the_cell(tool_server: Any, tmp_path: Path) -> None:
    """exec from a client that cannot be asked returns while the cell still runs; the patch comes later, while
    an eliciting client waits on the cell: that client is asked."""
    srv = await tool_server(CODE_ON, workspace=tmp_path)
    family = srv.services.extras["registry"].get("exec").execute.__self__  # the code-mode family
    code = ("await tools.exec_command({cmd: 'while [ ! -e go ]; do sleep 0.05; done', yield_time_ms: 30000});\n"
            + cell_patch())
    async with mcp_session(srv, None) as call:
        started = await call("exec", {"code": code, "yield_time_ms": 250})
    assert not started.is_error and started.structured["status"] == "running", started.structured
    cell_id = started.structured["cell_id"]
    person = Person(["accept"])
    async with mcp_session(srv, person) as call:
        waiting = asyncio.ensure_future(call("wait", {"cell_id": cell_id, "yield_time_ms": 30000}))
        await until(lambda: _async(cell_id in family._askers), "the wait call to observe the cell")
        (tmp_path / "go").touch()
        res = await asyncio.wait_for(waiting, 60)
    assert not res.is_error and "ok true" in res.text, res.text
    assert len(person.asked) == 1 and (tmp_path / "made.txt").exists()


async def _async(value: Any) -> Any:
    return value


async def test_stopping_a_cell_cancels_its_open_question_and_nothing_is_applied(tool_server: Any,
                                                                               tmp_path: Path) -> None:
    """Seed 004 defect 1: a nested apply_patch still waiting for approval never applies after its cell was
    terminated, even if the person then says accept: approval waiters are cancelled with the cell."""
    srv = await tool_server(CODE_ON, workspace=tmp_path)
    family = srv.services.extras["registry"].get("exec").execute.__self__  # the code-mode family
    release = asyncio.Event()

    async def hold() -> None:
        await release.wait()

    person = Person(["accept"], before=hold)
    async with mcp_session(srv, person) as call:
        running = asyncio.ensure_future(call("exec", {"code": cell_patch(), "yield_time_ms": 250}))
        await until(lambda: _async(bool(person.asked) and bool(family._asking)), "the question to be asked")
        cell_id = next(iter(family._asking))
        async with mcp_session(srv, None) as other:
            stopped = await other("wait", {"cell_id": cell_id, "terminate": True})
        # the stop happened: it reports the stopped cell, or the exec observing it did (one observer wins)
        assert "terminated" in stopped.text.lower() or "already returned" in stopped.text, stopped.text
        release.set()  # the person answers accept only now
        observed = await asyncio.wait_for(running, 60)
        assert "terminated" in (observed.text + stopped.text).lower()
    cell_calls = [c for c in family.manager.cells.values() if c.id == cell_id]
    for cell in cell_calls:  # whatever is left of it has settled
        await until(lambda c=cell: _async(all(n.state not in ("queued", "running") for n in c.calls.values())),
                    "the nested call to settle")
    await asyncio.sleep(0.5)  # a patch applied late would show by now; its absence is what is checked
    assert not (tmp_path / "made.txt").exists()


# -- Codex CLI 0.169 (a real client that declares elicitation) ------------------------------------------------

async def test_codex_exec_is_asked_and_its_headless_answer_changes_nothing(emulator: Any, proxy_factory: Any,
                                                                          tmp_path: Path) -> None:
    """Codex CLI 0.169 declares the elicitation capability (form and url), so the nested patch's question goes
    to it over the SSE answer; `codex exec` has nobody to show it to and declines it: the cell sees
    approval-declined and the workspace is unchanged — never a silent yes."""
    from tests.emulator import FunctionCall, Text
    from tests.proxy.app.test_cli_codex_config import TEST_SETTINGS, cli, codex_binary

    codex = codex_binary()
    work = tmp_path / "work"
    codex_home, home = tmp_path / "codex-home", tmp_path / "home"
    for d in (codex_home, home, work):
        d.mkdir()
    proxy = await proxy_factory(upstream=emulator.url, extra_args=[
        "--enable", "code_mode", "--enable", "shell", "--enable", "apply_patch", "--workspace", str(work)])
    config = codex_home / "config.toml"
    config.write_text(TEST_SETTINGS)
    out = await asyncio.to_thread(cli, "codex-config", "--state-dir", str(proxy.state_dir), "--write", str(config))
    assert out.returncode == 0, out.stderr
    emulator.script(FunctionCall("exec", {"code": cell_patch()}, namespace="mcp__ctproxy", call_id="call_cell"))
    emulator.set_default(Text("done", deltas=2))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(codex_home),
           "OPENAI_API_KEY": "sk-codex-test-not-real", "NO_COLOR": "1", "LANG": "C.UTF-8"}
    proc = await asyncio.create_subprocess_exec(
        str(codex), "exec", "--skip-git-repo-check", "--json", "patch it", cwd=work, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 180)
    except TimeoutError:
        proc.kill()
        stdout, stderr = await proc.communicate()
        pytest.fail(f"codex exec did not finish; stderr tail:\n{stderr.decode()[-2000:]}")
    assert proc.returncode == 0, f"{stderr.decode()[-3000:]}\n{stdout.decode()[-3000:]}"
    events = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
    calls = [e["item"] for e in events if e.get("type") == "item.completed"
             and e.get("item", {}).get("type") == "mcp_tool_call"]
    assert len(calls) == 1 and calls[0]["tool"] == "exec", events
    text = "\n".join(c.get("text", "") for c in calls[0]["result"]["content"])
    # the question reached Codex and its answer came back (an undelivered one would be approval-unavailable)
    assert "refused approval-declined" in text, calls[0]
    assert not (work / "made.txt").exists()
