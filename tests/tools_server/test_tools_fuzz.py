"""Fuzz every registered tool with random and hostile arguments over REST and the official MCP client.

Whatever the arguments, the server answers a tool result or a 400 for malformed arguments: never a
500, never an `internal_error` (an exception no code path expected), never a logged traceback.

The shell tools run for real, so they are fuzzed in a temporary workspace with hostile *shapes*
only: `cmd` (and its alias `command`) is always `true`, an `echo`, or not a string at all; the other
fields and unknown fields get anything. Nothing else here runs a command.

The server, a journal with a task, and one MCP session live on an event loop in a background
thread for the whole module; Hypothesis drives it from the test thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from proxy.config import CAPABILITIES, Config, set_key
from proxy.notes import NotesStore
from proxy.state import StateDir
from tests.support.toolserver import ToolServerHandle
from tests.tools_server.history.test_history_tools import build_world
from tools_server.families import build_registry
from tools_server.registry import Services

pytestmark = pytest.mark.timeout(300)

EXAMPLES = settings(max_examples=25, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.large_base_example])

# ------------------------------------------------------------------------------------------ strategies

HOSTILE_STRINGS = [
    "", " ", ".", "..", "../../../../etc/passwd", "/etc/passwd", "/", "//", "a//b", "./a", "a/./b", "~", "~root",
    "$HOME", "`id`", "\x00", "a\x00b", "\\", "C:\\Windows", "\ud800", "x\udfffy", "\n", "\r\n", "\u202e", "😀" * 70,
    "a/" * 1500 + "b", "d/" * 40 + "leaf", "x" * 300, "é" * 200, "y" * 5000, "z" * 100_000,
    "/root/notes/x", "/root/reviewer/notes/../x", "/root/" + "a/" * 300 + "notes/x", "/root/notes/" + "n/" * 50,
    "/root/ghost/notes/x", "/root/NOTES/x", "/proc/self/environ", "/dev/zero", "notes", "w1", "w2", "-1", "1e309",
    "*** Begin Patch\n*** End Patch", "null", "{}", "[]",
    "link.md", "linkdir/secret.txt", "linkdir", "escape/secret.txt", "escape/new.txt",  # links out (see Rig)
]
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40), st.sampled_from(HOSTILE_STRINGS),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=8)

hostile_paths = st.one_of(st.sampled_from(HOSTILE_STRINGS), st.text(max_size=30),
                          st.builds(lambda a, b: f"{a}/{b}", st.sampled_from(HOSTILE_STRINGS), st.text(max_size=10)))


@st.composite
def patch_texts(draw: st.DrawFn) -> str:
    path = draw(hostile_paths)
    body = draw(st.sampled_from(["+x", "+" + "w" * 10_000, "", "-a\n+b", "+\ud800"]))
    kind = draw(st.sampled_from(["Add File", "Update File", "Delete File"]))
    hunk = f"*** {kind}: {path}\n" + ("@@\n-alpha\n+beta" if kind == "Update File" else body)
    extra = draw(st.sampled_from(["", "\n*** Move to: " + draw(hostile_paths), "\n*** End of File"]))
    text = f"*** Begin Patch\n{hunk}{extra}\n*** End Patch"
    return draw(st.sampled_from([text, text.replace("\n", "\r\n"), text[: len(text) // 2], draw(st.text())]))


SAFE_COMMANDS = st.sampled_from(["true", "echo fuzz", "echo " + "z" * 200_000])  # the last: over one argv limit
COMMAND_FIELDS = {"cmd", "command"}
PLAUSIBLE = ["w1", "w2", "plan.md", "dir/note.md", "needle", "/root/reviewer/notes/plan.md", "reviewer", "/root",
             "link.md", "linkdir/secret.txt", "linkdir/new.md", "escape", "escape/secret.txt", "escape/new.txt"]
integers = st.one_of(st.integers(-5, 50), st.integers(-(2**63), 2**63),
                     st.sampled_from([0, -1, 2**31, 2**53 + 1, 10**18, 2**64]))


def schema_types(schema: dict[str, Any]) -> tuple[set[str], list[Any]]:
    """The JSON types a property allows (`type`, a list of them, or `anyOf`) and its enum values."""
    types: set[str] = set()
    enum: list[Any] = list(schema.get("enum") or [])
    declared = schema.get("type")
    types.update([declared] if isinstance(declared, str) else declared or [])
    for option in schema.get("anyOf") or []:
        sub_types, sub_enum = schema_types(option)
        types |= sub_types
        enum += sub_enum
    return types, enum


def typed_values(schema: dict[str, Any], vocabulary: list[str]) -> st.SearchStrategy[Any]:
    """Values of the right JSON type, chosen to hurt: hostile strings, extreme numbers."""
    types, enum = schema_types(schema)
    options: list[st.SearchStrategy[Any]] = [st.sampled_from(enum)] if enum else []
    if "string" in types:
        options += [hostile_paths, st.sampled_from(PLAUSIBLE + vocabulary), st.text(max_size=60)]
    if "integer" in types:
        options.append(integers)
    if "number" in types:
        options += [integers, st.floats(-1e12, 1e12, allow_nan=False)]
    if "boolean" in types:
        options.append(st.booleans())
    if "null" in types:
        options.append(st.none())
    return st.one_of(options) if options else json_values


def field_values(tool: str, name: str, schema: dict[str, Any], vocabulary: list[str],
                 shaped: bool) -> st.SearchStrategy[Any]:
    if tool == "exec_command" and name in COMMAND_FIELDS:
        # never a real command: one of ours, or a value that is not a string at all
        return SAFE_COMMANDS if shaped else st.one_of(SAFE_COMMANDS, st.none(), st.integers(),
                                                      st.lists(st.just("true"), max_size=2), st.just({"cmd": "true"}))
    if tool == "apply_patch" and name in ("patch", "input"):
        return patch_texts() if shaped else st.one_of(patch_texts(), json_values)
    typed = typed_values(schema, vocabulary)
    return typed if shaped else st.one_of(typed, json_values)


@st.composite
def arguments(draw: st.DrawFn, tool: str, schema: dict[str, Any], vocabulary: list[str]) -> dict[str, Any]:
    """Half the time well-shaped (required fields, right types: the executors run on hostile values),
    else anything: wrong types, missing fields, unknown fields and other tools' fields."""
    shaped = draw(st.booleans(), label="well-shaped")
    props: dict[str, Any] = dict(schema.get("properties") or {})
    required = set(schema.get("required") or [])
    if tool == "exec_command" and not shaped:
        props.setdefault("command", {"type": "string"})  # the alias: it must never carry a real command either
    args: dict[str, Any] = {}
    for name, sub in props.items():
        if (shaped and name in required) or draw(st.booleans()):
            args[name] = draw(field_values(tool, name, sub if isinstance(sub, dict) else {}, vocabulary, shaped))
    for _ in range(0 if shaped else draw(st.integers(0, 2))):  # unknown fields, or another tool's
        key = draw(st.one_of(st.text(max_size=12), st.sampled_from(["query", "path", "text", "session_id", "chars",
                                                                    "k" * 10_000, "", "__proto__", "tty", "shell"])))
        if key not in COMMAND_FIELDS and key not in args:
            args[key] = draw(json_values)
    return args


# ------------------------------------------------------------------------------------------ the rig

class Rig:
    """The tool server, a task, an aiohttp client and one MCP session, on a loop in another thread."""

    def __init__(self, tmp: Path):
        config = Config()
        for capability in CAPABILITIES:  # every tool there is: the guard test below compares with FUZZED
            config = set_key(config, f"{capability}.enabled", "true")
        # discovery on, nothing held back: every tool is callable by the fuzzer (not_loaded is its own test)
        config = set_key(config, "tool_discovery.deferred", "[]")
        config = set_key(config, "web_search.sidecar_model", '"gpt-5-mini"')  # the sidecar needs an executor
        config = set_key(config, "web_search.enabled", "true")  # turned on explicitly, whatever the default
        self.workspace = tmp / "ws"
        self.workspace.mkdir()
        (self.workspace / "alpha.txt").write_text("alpha\n")
        # Outside everything the tools may touch; links from the workspace and the notes point here.
        self.outside = tmp / "outside"
        self.outside.mkdir()
        (self.outside / "secret.txt").write_text("secret\n")
        os.symlink(self.outside, self.workspace / "escape")
        self.services = Services(config=config, state=StateDir.open(tmp / "state"), workspace=self.workspace)
        # every registered tool; one this machine cannot run (Computer Use without a desktop) answers 503
        self.schemas = {t.name: t.json_schema() for t in build_registry(self.services).all_tools()}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-rig", daemon=True)
        self.thread.start()
        self._run(self._start())

    def _run(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        self.srv = ToolServerHandle(self.services, self.services.state.token())
        await self.srv.start()
        self.world = build_world(self.services.state, self.services)
        self.task = self.world.task
        self.vocabulary = sorted(self.world.ids.values())  # real item ids: reads that find something
        notes = NotesStore(self.services.state.subdir("notes"), self.task)
        notes.write("/root", "plan.md", "the plan\n")
        os.symlink(self.outside / "secret.txt", notes.agent_dir("/root") / "link.md")
        os.symlink(self.outside, notes.agent_dir("/root") / "linkdir")
        self.http = aiohttp.ClientSession()
        self.queue: asyncio.Queue[tuple[str, dict[str, Any], asyncio.Future[Any]] | None] = asyncio.Queue()
        ready: asyncio.Future[None] = self.loop.create_future()
        self.mcp_owner = asyncio.create_task(self._mcp_session(ready))
        await ready

    async def _mcp_session(self, ready: asyncio.Future[None]) -> None:
        """One task owns the MCP session from start to end (anyio scopes must close where they opened)."""
        headers = self.srv.headers(self.task, "/root")
        try:
            async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0)) as client, \
                    streamable_http_client(f"{self.srv.url}/mcp", http_client=client) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                ready.set_result(None)
                while (item := await self.queue.get()) is not None:
                    name, args, fut = item
                    try:
                        fut.set_result(await session.call_tool(name, args))
                    except Exception as exc:
                        fut.set_exception(exc)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    async def _rest(self, name: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, Any]:
        async with self.http.post(f"{self.srv.url}/v1/tools/{name}", data=body, headers=headers) as resp:
            text = await resp.text()
            return resp.status, resp.content_type, json.loads(text) if resp.content_type == "application/json" else text

    async def _mcp(self, name: str, args: dict[str, Any]) -> Any:
        fut: asyncio.Future[Any] = self.loop.create_future()
        await self.queue.put((name, args, fut))
        return await fut

    def rest(self, name: str, args: Any, agent: str | None, cwd: str | None) -> tuple[int, str, Any]:
        headers = self.srv.headers(self.task, agent, cwd)
        return self._run(self._rest(name, json.dumps(args).encode(), headers))

    def mcp(self, name: str, args: dict[str, Any]) -> Any:
        return self._run(self._mcp(name, args))

    def close(self) -> None:
        async def stop() -> None:
            await self.queue.put(None)
            await self.mcp_owner
            await self.http.close()
            await self.srv.close()
            # Whatever the SDKs left running (sse-starlette's shutdown watcher) ends with the loop.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        try:
            self._run(stop())
        finally:
            self.world.journal.close()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()


# Every tool the registry has with every capability on; test_every_registered_tool_is_fuzzed keeps it true.
FUZZED = ("get_context_remaining", "apply_patch", "exec_command", "write_stdin",
          "history_list_windows", "history_list_items", "history_read_item", "history_search_contents",
          "notes_list_files_by_prefix", "notes_read_file", "notes_search_contents", "notes_append_to_file",
          "notes_write_file",
          "computer_use_list_apps", "computer_use_get_app_state", "computer_use_click", "computer_use_type_text",
          "computer_use_press_key", "computer_use_scroll",  # approval 'confirm' over REST/MCP: nothing is done
          "new_context", "find_tools",
          "exec", "wait",  # random text is not a program that calls a tool; a cell that spins is stopped
          "openai_generate_image", "openai_web_search")  # no credentials here (the rig unsets OPENAI_API_KEY)
AGENTS = st.one_of(st.none(), st.sampled_from(["/root", "reviewer", "/root/reviewer", "../x", "ROOT", "/root//x",
                                               "/root/" + "a/" * 1500, "/etc"]))
CWDS = st.one_of(st.none(), st.sampled_from([".", "..", "sub", "/", "/etc", "../..", "a" * 5000, "x/" * 1500]))


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    bad = [f"{r.name}: {r.getMessage()[:300]}" for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, bad


def check_rest(status: int, content_type: str, body: Any) -> None:
    assert content_type == "application/json", (status, str(body)[:300])
    assert status in (200, 400, 503), (status, body)
    if status == 503:  # the capability cannot work on this machine: said, never a crash
        assert body["error"]["code"] == "unavailable", body
        return
    if status == 400:
        assert body["error"]["code"] in ("invalid_arguments", "invalid_json"), body
        assert isinstance(body["error"]["message"], str) and len(body["error"]["message"]) < 5000
        return
    assert isinstance(body["ok"], bool) and isinstance(body["text"], str)
    if not body["ok"]:
        assert body["details"].get("error") != "internal_error", body["text"]
        assert body["text"]


def check_mcp(result: Any) -> None:
    if result.is_error:
        structured = result.structured_content
        assert structured is not None and structured["ok"] is False, result
        assert structured["error"] != "internal_error", structured["message"]
        assert structured["message"]


def utf8_clean(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    key = os.environ.pop("OPENAI_API_KEY", None)  # the credentialed tools must find none: no upstream call
    r = Rig(tmp_path_factory.mktemp("fuzz"))
    try:
        yield r
    finally:
        r.close()
        if key is not None:
            os.environ["OPENAI_API_KEY"] = key


def test_every_registered_tool_is_fuzzed(rig: Rig) -> None:
    assert {t.name for t in build_registry(rig.services).all_tools()} == set(FUZZED)  # offered or not here


@pytest.mark.parametrize("tool", FUZZED)
@EXAMPLES
@given(data=st.data())
def test_hostile_arguments_never_break_the_server(rig: Rig, caplog: pytest.LogCaptureFixture, tool: str,
                                                  data: st.DataObject) -> None:
    args = data.draw(arguments(tool, rig.schemas[tool], rig.vocabulary), label="arguments")
    agent, cwd = data.draw(AGENTS, label="x-ctp-agent"), data.draw(CWDS, label="x-ctp-cwd")
    check_rest(*rig.rest(tool, args, agent, cwd))
    if utf8_clean(args):  # the MCP client cannot even encode a lone surrogate; REST carries it escaped
        check_mcp(rig.mcp(tool, args))
    no_tracebacks(caplog)
    assert [p.name for p in rig.outside.iterdir()] == ["secret.txt"]
    assert (rig.outside / "secret.txt").read_text() == "secret\n"


def test_hostile_json_bodies_never_break_the_server(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """Bodies that are not tool arguments at all: still a JSON 400, never a 500."""
    for body in (b"[", b"\xff\xfe", b"[]", b"1", b'"x"', b"null", b"[" * 50_000 + b"]" * 50_000,
                 b'{"a":' * 20_000 + b"1" + b"}" * 20_000, b"{" + b'"k":1,' * 50_000 + b'"k":2}'):
        for tool in FUZZED:
            status, content_type, answer = rig._run(rig._rest(tool, body, rig.srv.headers(rig.task)))
            check_rest(status, content_type, answer)
    no_tracebacks(caplog)
