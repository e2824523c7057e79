"""Issue 47, the prefix rule: inside one window each request ctproxy forwards extends the previous one byte for
byte (tools, instructions, input items, a `previous_response_id` chain included), so the upstream's prompt cache
and the model's reasoning survive; a window changes the prefix once, when it opens. Checked on every request the
emulator answered (tests/support/prefix.py), on each road: stateless and chained clients, HTTP and WebSocket, the
bridge's rounds, the checkpoint turn, compaction. The driver is bench/bench_cache.py's Codex-like session."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bench.bench_cache import BRIDGE, MODEL, TOOLS, Model, Session, config, new_task
from proxy.context import checkpoint_turn as ckturn
from tests.emulator import Emulator
from tests.support.prefix import prefix_breaks

pytestmark = pytest.mark.timeout(300)
WINDOW = 9_000  # tokens, as the run: the hard trigger fires every few turns


def windows_opened(db: Path, task: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM journal_windows WHERE task_id = ? AND address = '/root'",
                            (task,)).fetchone()[0]


async def wait_windows(db: Path, task: str, at_least: int) -> int:
    for _ in range(200):  # the journal writes in the background
        n = windows_opened(db, task)
        if n >= at_least:
            return n
        await asyncio.sleep(0.05)
    return windows_opened(db, task)


async def run(proxy_factory: Any, tmp_path: Path, *, turns: int, bridge: bool, stateless: bool = True,
              transport: str = "http", full: dict[int, float] | None = None) -> tuple[Emulator, Any, int]:
    async with Emulator() as emu:
        emu.set_default(Model(window=WINDOW, full=full or {}))
        extra = ["--config", str(config(tmp_path / "cfg.json", WINDOW))] + (["--bridge", BRIDGE] if bridge else [])
        proxy = await proxy_factory(upstream=emu.url, extra_args=extra)
        task = new_task(proxy.state_dir)
        headers = {"authorization": "Bearer sk-prefix", "x-ctp-task": task, "x-ctp-agent": "/root"}
        async with Session(proxy.url, headers, stateless=stateless, transport=transport, output_pad=400) as agent:
            for n in range(1, turns + 1):
                await agent.turn(n)
        opened = await wait_windows(proxy.state_dir / "ctproxy.db", task, 1)
        return emu, proxy, opened


def assert_prefix_kept(emu: Emulator, opened: int) -> list[Any]:
    """Every break is a window's opening: at most as many as windows opened after the first."""
    breaks = prefix_breaks(emu.responses_requests)
    assert len(breaks) <= max(0, opened - 1), "\n".join(str(b) for b in breaks)
    return breaks


def test_the_checkpoint_turn_keeps_the_tools_and_narrows_the_choice() -> None:
    spec = {"name": ckturn.WRITE_TOOL, "description": "write", "parameters": {"type": "object"}}
    forwarded = {"model": MODEL, "tools": TOOLS, "instructions": "i", "stream": True,
                 "input": [{"role": "user", "content": "hi"}]}
    body = ckturn.turn_body(forwarded, spec, None)
    assert body["tools"] == [*TOOLS, {**spec, "type": "function", "strict": False}]  # appended: it had none
    assert body["tools"][: len(TOOLS)] == TOOLS and body["instructions"] == "i"
    assert body["input"][:1] == forwarded["input"]
    assert body["tool_choice"] == {"type": "allowed_tools", "mode": "required",
                                   "tools": [{"type": "function", "name": "notes_write_file"}]}
    with_write = {**forwarded, "tools": [*TOOLS, {**spec, "type": "function"}]}
    assert ckturn.turn_body(with_write, spec, None)["tools"] == with_write["tools"]  # unchanged


@pytest.mark.parametrize(("transport", "stateless"), [("http", True), ("ws", True), ("http", False)])
async def test_bridged_session_with_rollovers_keeps_the_prefix_inside_each_window(
        proxy_factory: Any, tmp_path: Path, transport: str, stateless: bool) -> None:
    emu, proxy, opened = await run(proxy_factory, tmp_path, turns=16, bridge=True, stateless=stateless,
                                   transport=transport)
    turns = [r for r in emu.responses_requests if ckturn.is_turn_choice((r.json or {}).get("tool_choice"))]
    assert turns and opened >= 2, (len(turns), opened)  # the hard trigger ran: checkpoint turns, new windows
    assert_prefix_kept(emu, opened)
    answered = [r for r in emu.responses_requests if "cache" in r.extra]
    for turn in turns:  # the turn extends the request before it: its whole prompt but the instruction cached
        before = answered[answered.index(turn) - 1].extra["cache"].parts
        assert turn.extra["cache"].parts[: len(before)] == before
        assert turn.extra["cache"].cached_tokens > 0


async def test_compaction_without_the_bridge_keeps_the_prefix(proxy_factory: Any, tmp_path: Path) -> None:
    emu, proxy, opened = await run(proxy_factory, tmp_path, turns=10, bridge=False, full={6: 0.99})
    assert opened >= 2
    assert_prefix_kept(emu, opened)


async def test_an_assistant_message_keeps_the_shape_it_was_first_forwarded_in(proxy_factory: Any,
                                                                              tmp_path: Path) -> None:
    """The client resends output items with `annotations: []`, `logprobs: []`: a request must never carry another
    copy of the same item (the journal's) between two that carry the client's."""
    emu, proxy, opened = await run(proxy_factory, tmp_path, turns=16, bridge=True)
    seen: dict[str, str] = {}
    for rec in emu.responses_requests:
        for item in rec.input_items:
            if isinstance(item, dict) and item.get("type") == "message" and item.get("role") == "assistant" \
                    and isinstance(item.get("id"), str):
                shape = json.dumps(item, sort_keys=False)
                assert seen.setdefault(item["id"], shape) == shape, (seen[item["id"]], shape)
