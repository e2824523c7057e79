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

from bench.bench_cache import BRIDGE, MODEL, TOOLS, Model, Session, config, is_checkpoint_turn, new_task
from proxy.windows.notes import checkpoint_turn as ckturn
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


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_bridged_session_with_rollovers_keeps_the_prefix_inside_each_window(
        proxy_factory: Any, tmp_path: Path, transport: str) -> None:
    emu, _proxy, opened = await run(proxy_factory, tmp_path, turns=16, bridge=True, transport=transport)
    turns = [r for r in emu.responses_requests if is_checkpoint_turn((r.json or {}).get("tool_choice"))]
    assert turns and opened >= 2, (len(turns), opened)  # the hard trigger ran: checkpoint turns, new windows
    assert_prefix_kept(emu, opened)
    answered = [r for r in emu.responses_requests if "cache" in r.extra]
    for turn in turns:  # the turn extends the request before it: its whole prompt but the instruction cached
        before = answered[answered.index(turn) - 1].extra["cache"].parts
        assert turn.extra["cache"].parts[: len(before)] == before
        assert turn.extra["cache"].cached_tokens > 0


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_a_chained_bridged_session_keeps_the_prefix(proxy_factory: Any, tmp_path: Path, transport: str) -> None:
    """previous_response_id: the prompt is the upstream's chain plus each request's new items (guidance, markers
    and bridged rounds included)."""
    emu, _proxy, opened = await run(proxy_factory, tmp_path, turns=12, bridge=True, stateless=False,
                                    transport=transport)
    assert len(emu.responses_requests) > 12
    assert_prefix_kept(emu, opened)


async def test_compaction_without_the_bridge_keeps_the_prefix(proxy_factory: Any, tmp_path: Path) -> None:
    emu, _proxy, opened = await run(proxy_factory, tmp_path, turns=10, bridge=False, full={6: 0.99})
    assert opened >= 2
    assert_prefix_kept(emu, opened)


async def test_an_assistant_message_keeps_the_shape_it_was_first_forwarded_in(proxy_factory: Any,
                                                                              tmp_path: Path) -> None:
    """The client resends output items with `annotations: []`, `logprobs: []`: a request must never carry another
    copy of the same item (the journal's) between two that carry the client's."""
    emu, _proxy, _opened = await run(proxy_factory, tmp_path, turns=16, bridge=True)
    seen: dict[str, str] = {}
    for rec in emu.responses_requests:
        for item in rec.input_items:
            if isinstance(item, dict) and item.get("type") == "message" and item.get("role") == "assistant" \
                    and isinstance(item.get("id"), str):
                shape = json.dumps(item, sort_keys=False)
                assert seen.setdefault(item["id"], shape) == shape, (seen[item["id"]], shape)


async def test_the_session_cache_is_shown_and_new_windows_are_prewarmed(proxy_factory: Any, tmp_path: Path) -> None:
    """`ctproxy show --json` and /metrics carry the session's cached share, per window; after each rollover the new
    window's bootstrap went up once with `prompt_cache_options.prewarm` (the model supports it), and the window's
    first request read it from the cache."""
    import re
    import subprocess
    import sys

    import aiohttp

    emu, proxy, opened = await run(proxy_factory, tmp_path, turns=12, bridge=True)
    reqs = [r for r in emu.responses_requests if "cache" in r.extra]
    warms = [k for k, r in enumerate(reqs) if ((r.json or {}).get("prompt_cache_options") or {}).get("prewarm")]
    assert warms and opened >= 2, (warms, opened)
    for k in warms:
        warm, first = reqs[k], reqs[k + 1]
        assert warm.json["tools"] == first.json["tools"] and warm.json["prompt_cache_key"] == first.json[
            "prompt_cache_key"]
        assert first.extra["cache"].cached_tokens >= warm.extra["cache"].input_tokens - 256  # served warm
    out = subprocess.run([sys.executable, "-m", "proxy.app.cli", "show", "--state-dir", str(proxy.state_dir), "--json",
                          _sessions(proxy.state_dir)[0]],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    cache = json.loads(out)[0]["prompt_cache"]
    assert cache["prewarms"] == len(warms) and cache["requests"] >= 12 and cache["misses"] == 0, cache
    assert cache["cached_share"] > 0.5 and len(cache["windows"]) == opened, cache
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.tools_url}/metrics",
                                                         headers={"Authorization": f"Bearer {token}"}) as r:
        text = await r.text()
    cached = re.search(r'^ctproxy_prompt_tokens_total\{kind="cached"\} (\S+)$', text, re.M)
    assert cached is not None and float(cached.group(1)) > 0, text[-3000:]


def _sessions(state_dir: Path) -> list[str]:
    with sqlite3.connect(f"file:{state_dir / 'ctproxy.db'}?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("SELECT session_key FROM prompt_cache GROUP BY session_key "
                                                "ORDER BY sum(requests) DESC")]
