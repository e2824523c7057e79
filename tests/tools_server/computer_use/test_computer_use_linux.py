"""Computer Use on a real X11 desktop (Xvfb + openbox + the AT-SPI bus) with the GTK test app, through the
tool server's REST and MCP endpoints. No mocks: the clicks, keys and screenshots are real."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageChops

from tests.support import desktop as desktop_support
from tests.support.procs import processes_mentioning
from tools_server.computer_use.images import PNG_MAGIC

pytestmark = pytest.mark.timeout(240)

MISSING = desktop_support.missing()
if MISSING:
    pytest.skip(MISSING, allow_module_level=True)

LIST, STATE, CLICK, TYPE, KEY, SCROLL = (
    "computer_use_list_apps", "computer_use_get_app_state", "computer_use_click", "computer_use_type_text",
    "computer_use_press_key", "computer_use_scroll")


@pytest.fixture(scope="module")
def desk() -> Iterator[desktop_support.Desktop]:
    d = desktop_support.Desktop()
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def app(desk: desktop_support.Desktop, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh test app per test, named after the test (so no state leaks between tests)."""
    title = "CU " + request.node.name.removeprefix("test_").replace("_", " ")[:40]
    proc = desk.start_app(title)
    yield title
    desk.stop(proc)


def name_of(title: str) -> str:
    return title.lower().replace(" ", "-")


async def until(probe: Any, what: str, timeout: float = 60.0) -> Any:
    """Poll `probe()` until it returns something true (AT-SPI is slow on a loaded machine)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def listed(srv: Any, title: str) -> dict:
    async def probe() -> dict | None:
        res = await srv.rest(LIST, {})
        assert res.ok, res.body
        return next((a for a in res.details["apps"] if title in a["windows"]), None)
    return await until(probe, f"{title} in list_apps")


def element(state: dict, role: str, name: str | None = None) -> dict:
    hits = [e for e in state["details"]["tree"] if e["role"] == role and (name is None or e["name"] == name)]
    assert len(hits) == 1, (role, name, [(e["role"], e["name"]) for e in state["details"]["tree"]])
    return hits[0]


def png_of(body: dict) -> Image.Image:
    (image,) = body["images"]
    assert image["mime_type"] == "image/png"
    data = base64.b64decode(image["data"])
    assert data.startswith(PNG_MAGIC)
    return Image.open(io.BytesIO(data)).convert("RGB")


async def state(srv: Any, app: str) -> dict:
    res = await srv.rest(STATE, {"app": app})
    assert res.ok, res.body
    return res.body


async def test_list_apps_state_and_click_change_the_label_and_the_pixels(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    found = await listed(srv, app)
    assert found["name"] == name_of(app) and found["pid"] > 0 and found["ident"] == f"pid:{found['pid']}"
    before = await state(srv, name_of(app))
    assert 'push button "Press me"' in before["text"] and 'label "not clicked"' in before["text"]
    assert before["details"]["screenshot"]["width"] > 100
    button = element(before, "push button", "Press me")
    assert "Click" in button["actions"] and button["bounds"][2] > 0
    shot_before = png_of(before)
    assert shot_before.size == (before["details"]["screenshot"]["width"], before["details"]["screenshot"]["height"])
    click = await srv.rest(CLICK, {"app": name_of(app), "element_index": button["index"]})
    assert click.ok, click.body

    async def relabelled() -> dict | None:
        after = await state(srv, name_of(app))
        return after if 'label "clicked 1"' in after["text"] else None
    after = await until(relabelled, "the label to change")
    assert ImageChops.difference(shot_before, png_of(after)).getbbox() is not None  # the pixels changed
    # the window title works as the app's name too
    assert (await srv.rest(STATE, {"app": app})).ok


async def test_mcp_type_text_reads_back_and_keys_take_effect(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    await listed(srv, app)
    names = {t.name for t in await srv.mcp_list()}
    assert {LIST, STATE, CLICK, TYPE, KEY, SCROLL} <= names
    first = await srv.mcp(STATE, {"app": name_of(app)})
    assert not first.is_error, first.text
    images = [c for c in first.content if getattr(c, "type", "") == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)
    entry = next(e for e in first.structured["tree"] if e["role"] == "text")
    assert not (await srv.mcp(CLICK, {"app": name_of(app), "element_index": entry["index"]})).is_error
    typed = await srv.mcp(TYPE, {"app": name_of(app), "text": "hello desk"})
    assert not typed.is_error, typed.text

    async def entry_text() -> str | None:
        now = await srv.mcp(STATE, {"app": name_of(app)})
        return next(e["text"] for e in now.structured["tree"] if e["role"] == "text")
    assert await until(lambda: _equals(entry_text, "hello desk"), "the typed text to read back")
    assert not (await srv.mcp(KEY, {"app": name_of(app), "key": "ctrl+a"})).is_error
    assert not (await srv.mcp(KEY, {"app": name_of(app), "key": "BackSpace"})).is_error
    assert await until(lambda: _equals(entry_text, ""), "ctrl+a, BackSpace to empty the entry")
    bad = await srv.mcp(KEY, {"app": name_of(app), "key": "ctrl+NoSuchKey"})
    assert bad.is_error and bad.structured["error"] == "bad-key"


async def _equals(probe: Any, want: str) -> bool:
    return await probe() == want


async def test_scroll_moves_the_list(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    await listed(srv, app)
    before = await state(srv, name_of(app))
    rows = [e["name"] for e in before["details"]["tree"] if e["role"] == "table cell"]
    assert rows[0] == "row 000"
    table = element(before, "table")
    res = await srv.rest(SCROLL, {"app": name_of(app), "element_index": table["index"], "direction": "down",
                                  "amount": 5})
    assert res.ok, res.body

    async def moved() -> bool:
        now = await state(srv, name_of(app))
        cells = [e["name"] for e in now["details"]["tree"] if e["role"] == "table cell"]
        return bool(cells) and cells[0] != "row 000"
    await until(moved, "the list to scroll")


async def test_focus_loss_refuses_typing(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    await listed(srv, app)
    other = desk.start_app("CU focus thief")
    try:
        await listed(srv, "CU focus thief")
        mine = await state(srv, name_of(app))
        entry = element(mine, "text")
        assert (await srv.rest(CLICK, {"app": name_of(app), "element_index": entry["index"]})).ok
        thief = await state(srv, "cu-focus-thief")
        assert (await srv.rest(CLICK, {"app": "cu-focus-thief", "element_index": element(thief, "text")["index"]})).ok
        refused = await srv.rest(TYPE, {"app": name_of(app), "text": "should not land"})
        assert not refused.ok and refused.body["details"]["error"] == "focus-lost", refused.body
        for who in (name_of(app), "cu-focus-thief"):
            assert element(await state(srv, who), "text")["text"] == ""
    finally:
        desk.stop(other)


async def test_closed_app_gives_a_clear_error(desk: Any, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    proc = desk.start_app("CU closing")
    await listed(srv, "CU closing")
    button = element(await state(srv, "cu-closing"), "push button")
    desk.stop(proc)

    async def gone() -> bool:
        res = await srv.rest(LIST, {})
        return all("CU closing" not in a["windows"] for a in res.details["apps"])
    await until(gone, "the app to leave the list")
    res = await srv.rest(CLICK, {"app": "cu-closing", "element_index": button["index"]})
    assert not res.ok and res.body["details"]["error"] == "app-closed", res.body
    assert "no longer running" in res.body["text"]
    never = await srv.rest(STATE, {"app": "cu-never-started"})
    assert not never.ok and never.body["details"]["error"] == "app-not-found"


async def test_two_concurrent_calls_run_one_after_the_other(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    await listed(srv, app)
    family = srv.services.extras["computer_use.family"]
    mark = len(family.served)
    a, b = await asyncio.gather(srv.rest(STATE, {"app": name_of(app)}), srv.rest(STATE, {"app": name_of(app)}))
    assert a.ok and b.ok
    first, second = sorted(family.served[mark:], key=lambda s: s.seq)
    assert second.started >= first.ended  # the second began only after the first had finished


async def test_confirm_without_elicitation_is_approval_unavailable(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides())  # approval_mode defaults to confirm
    await listed(srv, app)  # listing names apps only: no approval needed
    res = await srv.rest(STATE, {"app": name_of(app)})
    assert not res.ok and res.body["details"]["error"] == "approval-unavailable", res.body
    res = await srv.mcp(CLICK, {"app": name_of(app), "x": 10, "y": 10})
    assert res.is_error and res.structured["error"] in ("approval-unavailable", "approval-declined")


async def test_confirm_asks_once_per_app_and_a_no_is_not_remembered(desk: Any, app: str, tool_server: Any) -> None:
    from tools_server.registry import CallContext

    srv = await tool_server(desk.overrides())
    await listed(srv, app)
    family = srv.services.extras["computer_use.family"]
    tool = {t.name: t for t in family.tools()}[STATE]
    asked: list[str] = []
    answers = ["decline", "accept"]

    async def confirm(message: str) -> str:
        asked.append(message)
        return answers.pop(0)

    def ctx() -> CallContext:
        c = CallContext(services=srv.services, transport="mcp")
        c.confirm = confirm  # type: ignore[attr-defined]  # what the MCP endpoint sets for eliciting clients
        return c

    no = await tool.call({"app": name_of(app)}, ctx())
    assert no.is_error and no.details["error"] == "approval-declined"
    yes = await tool.call({"app": name_of(app)}, ctx())
    assert not yes.is_error and yes.images
    again = await tool.call({"app": name_of(app)}, ctx())
    assert not again.is_error
    assert len(asked) == 2 and name_of(app) in asked[0]


async def test_ambiguous_name_fails_closed_and_pid_picks_one(desk: Any, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    twins = [desk.start_app("CU twin"), desk.start_app("CU twin")]
    try:
        async def both() -> list | None:
            res = await srv.rest(LIST, {})
            hits = [a for a in res.details["apps"] if "CU twin" in a["windows"]]
            return hits if len(hits) == 2 else None
        hits = await until(both, "both twins")
        res = await srv.rest(CLICK, {"app": "cu-twin", "x": 5, "y": 5})
        assert not res.ok and res.body["details"]["error"] == "ambiguous-app"
        assert all(h["ident"] in res.body["text"] for h in hits)
        assert (await srv.rest(STATE, {"app": hits[0]["ident"]})).ok
    finally:
        for p in twins:
            desk.stop(p)


async def test_unknown_outcome_requires_a_fresh_state(desk: Any, app: str, tool_server: Any) -> None:
    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    await listed(srv, app)
    family = srv.services.extras["computer_use.family"]
    button = element(await state(srv, name_of(app)), "push button")
    family.action_timeout = 0.0  # every dispatched action now ends before its answer: outcome unknown
    res = await srv.rest(CLICK, {"app": name_of(app), "element_index": button["index"]})
    assert not res.ok and res.body["details"]["error"] == "outcome-unknown", res.body
    family.action_timeout = 60.0
    res = await srv.rest(CLICK, {"app": name_of(app), "element_index": button["index"]})
    assert not res.ok and res.body["details"]["error"] == "state-required"
    await state(srv, name_of(app))
    assert (await srv.rest(CLICK, {"app": name_of(app), "element_index": button["index"]})).ok


async def test_ctproxy_starts_a_private_desktop_when_there_is_none(tool_server: Any, monkeypatch: Any) -> None:
    import subprocess

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("XAUTHORITY", raising=False)  # the private desktop sets it; restored afterwards
    srv = await tool_server({"computer_use.enabled": True, "computer_use.start_xvfb": True})
    res = await srv.rest(LIST, {})
    assert res.ok, res.body
    family = srv.services.extras["computer_use.family"]
    desktop = family.backend.desktop
    assert desktop is not None and desktop.display.startswith(":") and desktop.window_manager == "openbox"
    # only holders of its cookie may connect to it
    probe = ["xdotool", "getmouselocation"]
    assert subprocess.run(probe, env=desktop.env(), capture_output=True).returncode == 0
    stranger = {**desktop.env(), "XAUTHORITY": "/nonexistent"}
    assert subprocess.run(probe, env=stranger, capture_output=True).returncode != 0
    assert processes_mentioning("Xvfb", "-displayfd")
    pids = [p.pid for p in desktop._procs]
    await srv.close()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


async def test_the_private_desktop_is_published_to_the_shell_tools(tool_server: Any, monkeypatch: Any,
                                                                   tmp_path: Path) -> None:
    """Seed 004 defect 14: list_apps names the private desktop, and exec_command runs with its DISPLAY,
    XAUTHORITY and session bus: an app a command starts shows up in computer_use_list_apps."""
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("XAUTHORITY", raising=False)
    srv = await tool_server({"computer_use.enabled": True, "computer_use.start_xvfb": True,
                             "computer_use.approval_mode": "always", "shell.enabled": True,
                             # the sandbox's private /tmp hides the desktop's X socket (docs/shell.md)
                             "shell.sandbox": "danger-full-access"}, workspace=tmp_path)
    first = await srv.rest(LIST, {})
    assert first.ok and first.details["desktop"]["private"], first.body
    display = first.details["desktop"]["display"]
    assert f"DISPLAY={display}" in first.text and "start an app on it with exec_command" in first.text
    started = await srv.rest("exec_command", {"cmd": f"exec {desktop_support.SYSTEM_PYTHON} "
                                                     f"{desktop_support.APP} 'Private Probe'",
                                              "yield_time_ms": 250}, task="t", agent="/root")
    assert started.ok and started.details.get("session_id"), started.body

    async def shown() -> bool:
        res = await srv.rest(LIST, {})
        return res.ok and any(a["name"] == "private-probe" for a in res.details["apps"])
    try:
        await until(shown, "the app the shell started on the private desktop")
    finally:
        await srv.rest("write_stdin", {"session_id": started.details["session_id"], "terminate": True},
                       task="t", agent="/root")


async def test_list_apps_does_not_send_a_sandboxed_shell_to_the_private_desktop(tool_server: Any, monkeypatch: Any,
                                                                               tmp_path: Path) -> None:
    """seed004 N5: under the default sandbox exec_command cannot reach the desktop, and list_apps says so."""
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("XAUTHORITY", raising=False)
    srv = await tool_server({"computer_use.enabled": True, "computer_use.start_xvfb": True,
                             "computer_use.approval_mode": "always", "shell.enabled": True,
                             "shell.sandbox": "workspace-write"}, workspace=tmp_path)
    first = await srv.rest(LIST, {})
    assert first.ok and first.details["desktop"]["private"], first.body
    assert "start an app on it with exec_command" not in first.text
    assert "exec_command cannot start an app on it" in first.text and "danger-full-access" in first.text


async def test_waiting_for_the_private_desktop_never_activates_a_second_launcher() -> None:
    """org.a11y.Bus is activatable on a session bus: asking it for the address before our own launcher has
    claimed the name starts a stray launcher that wins the race about once in thirty starts, and then the
    desktop's registry never answers. The readiness wait asks only whether the name is owned."""
    import os
    import subprocess

    from tools_server.computer_use.linux import desktop

    bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"], stdout=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert bus.stdout is not None
        address = bus.stdout.readline().decode().strip()
        loop = asyncio.get_running_loop()
        with pytest.raises(desktop.DesktopError, match="was not claimed"):
            await desktop._wait_for_owner(address, desktop.A11Y_BUS_NAME, loop.time() + 1.0)
        # a launcher activated by that bus would carry its address in its environment
        strays = [pid for pid in processes_mentioning("at-spi-bus-launcher")
                  if address.encode() in _environ_of(pid)]
        assert strays == []
    finally:
        bus.terminate()
        bus.wait(10)
        assert bus.stdout is not None
        bus.stdout.close()
    assert os.environ.get("DBUS_SESSION_BUS_ADDRESS") != address


def _environ_of(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def test_status_names_what_is_missing(monkeypatch: Any) -> None:
    from proxy.app.status import capability_status
    from proxy.config import Config, set_key

    cfg = set_key(Config(), "computer_use.enabled", "true")
    monkeypatch.delenv("DISPLAY", raising=False)
    st = capability_status(cfg, "computer_use")
    assert st.state == "unavailable" and "no X display" in st.reason
    monkeypatch.setenv("DISPLAY", ":1")
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent")
    assert capability_status(cfg, "computer_use").state == "active"
    private = set_key(cfg, "computer_use.start_xvfb", "true")
    monkeypatch.delenv("DISPLAY")
    st = capability_status(private, "computer_use")
    assert st.state == "active" and "private Xvfb" in st.reason and "first use" in st.reason
    monkeypatch.setenv("DISPLAY", ":1")
    monkeypatch.setenv("PATH", "/nonexistent")
    st = capability_status(cfg, "computer_use")
    assert st.state == "unavailable" and "xdotool" in st.reason
    mac = set_key(cfg, "computer_use.backend", '"macos"')
    st = capability_status(mac, "computer_use")
    assert st.state == "unavailable" and "macOS only" in st.reason
    assert capability_status(Config(), "computer_use").state == "off"



async def test_without_a_window_manager_the_fallbacks_work(tool_server: Any) -> None:
    """No EWMH window manager: windows from the root's viewable children, focus from the X input focus,
    activation by raise + windowfocus."""
    bare = desktop_support.Desktop(window_manager=False)
    try:
        bare.start_app("CU bare")
        srv = await tool_server(bare.overrides(**{"computer_use.approval_mode": "always"}))
        await listed(srv, "CU bare")
        before = await state(srv, "cu-bare")
        entry, button = element(before, "text"), element(before, "push button")
        assert (await srv.rest(CLICK, {"app": "cu-bare", "element_index": button["index"]})).ok
        assert (await srv.rest(CLICK, {"app": "cu-bare", "element_index": entry["index"]})).ok
        typed = await srv.rest(TYPE, {"app": "cu-bare", "text": "no wm"})
        assert typed.ok, typed.body

        async def done() -> bool:
            now = await state(srv, "cu-bare")
            return 'label "clicked 1"' in now["text"] and element(now, "text")["text"] == "no wm"
        await until(done, "the click and the typing to take effect without a window manager")
        await srv.close()
    finally:
        bare.close()


async def test_a_client_hanging_up_mid_action_leaves_the_outcome_unknown(desk: Any, app: str, tool_server: Any) -> None:
    import json

    import aiohttp

    from tools_server.computer_use.linux.atspi import Atspi

    srv = await tool_server(desk.overrides(**{"computer_use.approval_mode": "always"}))
    await listed(srv, app)
    entry = element(await state(srv, name_of(app)), "text")
    assert (await srv.rest(CLICK, {"app": name_of(app), "element_index": entry["index"]})).ok
    family = srv.services.extras["computer_use.family"]
    snap = next(s for s in family.backend._snapshots.values() if s.app.name == name_of(app))
    ref = snap.elements[entry["index"]].ref
    atspi = await Atspi.connect(desk.bus)  # our own reader: the tool lock is held while it types
    try:
        async with aiohttp.ClientSession() as http:
            request = asyncio.create_task(http.post(f"{srv.url}/v1/tools/{TYPE}", headers=srv.headers(),
                                                    data=json.dumps({"app": name_of(app), "text": "q" * 2000})))

            async def typing() -> bool:
                return bool((await atspi.text(ref, 10))[0])
            await until(typing, "the typing to begin")
            request.cancel()  # the client hangs up mid-action
            with pytest.raises(asyncio.CancelledError):
                await request

        async def idle() -> bool:
            return not family._lock.locked()
        await until(idle, "the tool server to drop the call")
        typed = (await atspi.text(ref, 5000))[1]
    finally:
        atspi.close()
    assert 0 < typed < 2000  # it stopped part way
    res = await srv.rest(CLICK, {"app": name_of(app), "element_index": entry["index"]})
    assert not res.ok and res.body["details"]["error"] == "state-required", res.body
    await state(srv, name_of(app))
    assert (await srv.rest(CLICK, {"app": name_of(app), "element_index": entry["index"]})).ok


async def test_through_the_bridge(desk: Any, app: str, emulator: Any, proxy_factory: Any, tmp_path: Path) -> None:
    """`ctproxy up --bridge computer_use`: the model (the emulator) calls get_app_state and a click by index
    (3 is the button in the test app's tree); the agent (the openai SDK) sees one response with both
    executed calls."""
    import json

    import openai

    from tests.emulator import FunctionCall, Text

    state_dir = tmp_path / "bridge-state"
    state_dir.mkdir()
    (state_dir / "config.json").write_text(json.dumps({"computer_use": {
        "enabled": True, "approval_mode": "always", "display": desk.display, "dbus_address": desk.bus}}))
    proxy = await proxy_factory(upstream=emulator.url, state_dir=state_dir,
                                extra_args=["--bridge", "computer_use"])
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-bridge", max_retries=0)

    async def app_listed() -> bool:  # the app's tree shows on the AT-SPI bus a little after its window
        emulator.script(FunctionCall(LIST, {}, call_id="call_list"), Text("listed"))
        await client.responses.create(model="gpt-4.1", input="what is open?")
        out = next(i for i in emulator.responses_requests[-1].json["input"] if i.get("type") == "function_call_output")
        return app in json.dumps(out)
    await until(app_listed, "the app in a bridged list_apps")
    emulator.script(FunctionCall(STATE, {"app": name_of(app)}, call_id="call_state"),
                    FunctionCall(CLICK, {"app": name_of(app), "element_index": 3}, call_id="call_click"),
                    Text("done"))
    final = await client.responses.create(model="gpt-4.1", input="press the button")
    assert final.output_text == "done"
    calls = [o for o in final.output if o.type == "mcp_call"]
    assert [c.name for c in calls] == [STATE, CLICK]
    assert 'push button "Press me"' in (calls[0].output or "")
    assert 'Clicked element [3] push button "Press me"' in (calls[1].output or ""), calls[1].output
    outputs = [i for r in emulator.responses_requests[-2:] for i in r.json["input"]
               if i.get("type") == "function_call_output" and i.get("call_id") == "call_state"]
    assert outputs
    assert "Press me" in json.dumps(outputs[-1])
    # The screenshot as `input_image` in the bridged output is the bridge's part (issue 12's helper): not
    # asserted here until the bridge carries ToolResult.images.
