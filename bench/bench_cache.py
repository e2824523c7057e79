"""What ctproxy costs the prompt cache (issue 47), and a driver for the prefix-rule tests.

    .venv/bin/python bench/bench_cache.py [--turns 200] [--quick]

A Codex-like session (stateless: the whole history resent each request, streamed, long instructions, a shell
function tool and a custom tool, reasoning items with encrypted content, no `prompt_cache_key`) against the
emulator's prompt-cache model (tests/emulator/cache.py), three ways in one run:
- **direct**: the agent talks to the emulator;
- **ctproxy**: through `ctproxy up` with its defaults;
- **bridge**: through `ctproxy up --bridge context,notes,history`.
The scripted model fills the window once (the hard trigger: the checkpoint turn, a notes rollover) and once more
(remote compaction) along the way. Printed per way: requests, input tokens, cached share, billed input (uncached +
10% of cached, the published discount), its ratio to direct, and the prefix breaks inside a window.

The same driver (`Session`) runs the roads of tests/proxy/windows/test_prefix_rule.py: HTTP or WebSocket, stateless or
chained by
`previous_response_id`, with or without the bridge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: `tests.*` and `bench.*` from the repository root
    sys.path.insert(0, str(REPO))

from bench.common import print_table, write_result  # noqa: E402
from tests.emulator import (  # noqa: E402
    CustomToolCall,
    Emulator,
    FunctionCall,
    Reasoning,
    ReceivedRequest,
    Reply,
    Response,
    Text,
)
from tests.support.prefix import PrefixBreak, prefix_breaks  # noqa: E402
from tests.support.proxyproc import ProxyProcess  # noqa: E402

MODEL = "gpt-5.6"  # a model with prompt_cache_options (prewarm)
WINDOW = 80_000
CACHED_PRICE = 0.1  # cached input is billed at a tenth (the published discount of the GPT-5 family)
INSTRUCTIONS = ("You are a coding agent running in a terminal. Follow the repository's conventions, keep "
                "changes small, run the tests you touch, and explain what you changed. ") * 60  # ~10 KB, as Codex
SHELL = {"type": "function", "name": "shell", "description": "Run a shell command in the workspace.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
                        "additionalProperties": False}, "strict": False}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch in the V4A diff format."}
TOOLS = [SHELL, PATCH]
CALL_OUTPUT = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
BRIDGE = "context,notes,history"
TURN_RE = re.compile(r"turn (\d+): continue")
BETA = {"OpenAI-Beta": "responses_websockets=2026-02-06"}


def config(path: Path, window: int = WINDOW) -> Path:
    path.write_text(json.dumps({
        "model_windows": {MODEL: window},
        "context": {"reminder_ratio": 0.7, "hard_ratio": 0.85},
        "remote_compaction": {"enabled": True, "threshold": 0.95},
    }))
    return path


def is_checkpoint_turn(tool_choice: Any) -> bool:
    """ctproxy's checkpoint turn: the note write required (`allowed_tools`, or a forced function call)."""
    if not isinstance(tool_choice, dict):
        return False
    named = tool_choice.get("tools") if tool_choice.get("type") == "allowed_tools" else [tool_choice]
    return any(isinstance(t, dict) and t.get("name") == "notes_write_file" for t in named or [])


def _turn_of(items: Sequence[Any]) -> int | None:
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            text = content if isinstance(content, str) else " ".join(
                p.get("text", "") for p in content or [] if isinstance(p, dict))
            if m := TURN_RE.search(text):  # (the context stage may mark the message: `[id: …]`)
                return int(m.group(1))
    return None


def _answered_call(items: Sequence[Any]) -> str | None:
    """The call id of a call output after the newest turn message, if any."""
    for item in reversed(items):
        if not isinstance(item, dict):
            continue
        if item.get("type") in CALL_OUTPUT.values():
            return str(item.get("call_id"))
        if item.get("role") == "user" and _turn_of([item]) is not None:
            return None
    return None


@dataclass
class Model:
    """The emulator's responder: work by turn number; `full` turns report a window this full (the next request
    runs the hard trigger at 0.9, remote compaction at 0.99); the checkpoint turn writes a note."""

    window: int = WINDOW
    full: dict[int, float] = field(default_factory=dict)
    checkpoints: int = 0

    def __call__(self, rec: ReceivedRequest) -> Reply:
        body = rec.json if isinstance(rec.json, dict) else {}
        items = rec.input_items
        if is_checkpoint_turn(body.get("tool_choice")):
            self.checkpoints += 1
            return FunctionCall("notes_write_file", {"path": f"checkpoint-{self.checkpoints}.md",
                                                     "text": "where the numbered work is\n"},
                                call_id=f"ck_{self.checkpoints}")
        answered = _answered_call(items)
        if answered is not None:  # the turn's calls have their outputs (a reminder may follow them)
            return Text(f"done after {answered}", deltas=2)
        n = _turn_of(items) or 0
        usage = {"input_tokens": int(self.full[n] * self.window)} if n in self.full else None
        kind = n % 4
        if kind == 1:
            return Response([Reasoning(summary=f"plan {n}"), FunctionCall("shell", {"cmd": f"ls -la src/{n}"},
                                                                          call_id=f"sh_{n}")], usage=usage)
        if kind == 2:
            return Response([CustomToolCall("apply_patch", f"*** Begin Patch\n*** Update File: f{n}.py\n"
                                            f"+print({n})\n*** End Patch", call_id=f"ap_{n}")], usage=usage)
        if kind == 3:
            return Response([Reasoning(summary=f"thinking {n}"), Text(f"reasoned answer {n}")], usage=usage)
        return Text(f"answer to turn {n}: " + "details " * 20, deltas=3, usage=usage)


class AgentError(AssertionError):
    pass


@dataclass
class Session:
    """A Codex-like agent: `stateless` resends everything (store false), else it chains by previous_response_id
    (store true, new items only); over HTTP (SSE) or one WebSocket."""

    url: str  # the base URL (…/v1 added here)
    headers: dict[str, str]
    stateless: bool = True
    transport: str = "http"
    cache_key: str | None = None
    output_pad: int = 1200  # characters of each tool output
    history: list[dict[str, Any]] = field(default_factory=list)
    previous: str | None = None
    requests: int = 0
    _http: aiohttp.ClientSession | None = None
    _ws: aiohttp.ClientWebSocketResponse | None = None

    async def __aenter__(self) -> Session:
        self._http = aiohttp.ClientSession()
        if self.transport == "ws":
            self._ws = await self._http.ws_connect(self.url + "/v1/responses", headers={**self.headers, **BETA},
                                                   max_msg_size=0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()

    async def turn(self, n: int) -> None:
        new: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                      "content": [{"type": "input_text", "text": f"turn {n}: continue"}]}]
        for _ in range(4):
            output = await self.create(new)
            calls = [o for o in output if o.get("type") in CALL_OUTPUT]
            if not calls:
                return
            new = [{"type": CALL_OUTPUT[c["type"]], "call_id": c["call_id"],
                    "output": f"ran {c.get('arguments') or c.get('input')}" + "." * self.output_pad} for c in calls]
        raise AgentError(f"turn {n}: the model kept calling tools")

    def body(self, new: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": MODEL, "instructions": INSTRUCTIONS, "tools": TOOLS, "stream": True,
                                "parallel_tool_calls": True, "include": ["reasoning.encrypted_content"]}
        if self.cache_key is not None:
            body["prompt_cache_key"] = self.cache_key
        if self.stateless:
            self.history.extend(new)
            body.update(store=False, input=list(self.history))
        else:
            body.update(store=True, input=new)
            if self.previous is not None:
                body["previous_response_id"] = self.previous
        return body

    async def create(self, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
        body = self.body(new)
        final = await (self._over_ws(body) if self._ws is not None else self._over_http(body))
        self.requests += 1
        if final.get("status") != "completed":
            raise AgentError(f"the agent got {final.get('status')}: {final.get('error')}")
        output = [o for o in final.get("output") or [] if isinstance(o, dict)]
        if self.stateless:
            self.history.extend(output)  # the client's copy: the items as the answer carried them
        self.previous = final.get("id")
        return output

    async def _over_http(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self._http is not None
        async with self._http.post(self.url + "/v1/responses", data=orjson.dumps(body),
                                   headers={**self.headers, "content-type": "application/json"},
                                   timeout=aiohttp.ClientTimeout(total=180)) as r:
            if r.status != 200:
                raise AgentError(f"HTTP {r.status}: {(await r.text())[:2000]}")
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    event = orjson.loads(line[6:])
                    if event.get("type") in ("response.completed", "response.failed", "response.incomplete"):
                        return event["response"]
                    if event.get("type") == "error":
                        raise AgentError(f"error event: {event}")
        raise AgentError("the stream ended without a terminal event")

    async def _over_ws(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self._ws is not None
        await self._ws.send_str(orjson.dumps({"type": "response.create",
                                              **{k: v for k, v in body.items() if k != "stream"}}).decode())
        while True:
            msg = await self._ws.receive(timeout=180)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise AgentError(f"the socket gave {msg.type}")
            event = orjson.loads(msg.data)
            if event.get("type") in ("response.completed", "response.failed", "response.incomplete"):
                return event["response"]
            if event.get("type") == "error":
                raise AgentError(f"error event: {event}")


def new_task(state_dir: Path) -> str:
    return subprocess.run([sys.executable, "-m", "proxy.app.cli", "task", "new", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout.strip()


@dataclass
class Figures:
    way: str
    requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    prewarms: int = 0
    breaks: list[PrefixBreak] = field(default_factory=list)
    mismatches: int = 0

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def billed(self) -> float:
        return self.input_tokens - self.cached_tokens + CACHED_PRICE * self.cached_tokens


def figures(way: str, records: Sequence[ReceivedRequest]) -> Figures:
    fig = Figures(way)
    for rec in records:
        result = rec.extra.get("cache")
        if result is None:
            continue
        body = rec.json if isinstance(rec.json, dict) else {}
        fig.requests += 1
        fig.prewarms += bool((body.get("prompt_cache_options") or {}).get("prewarm"))
        fig.input_tokens += result.input_tokens
        fig.cached_tokens += result.cached_tokens
        fig.mismatches += len(result.transformations)
    fig.breaks = prefix_breaks(records)
    return fig


async def run_way(way: str, turns: int, workdir: Path, full: dict[int, float]) -> Figures:
    async with Emulator() as emu:
        emu.set_default(Model(full=full))
        if way == "direct":
            async with Session(emu.url, {"authorization": "Bearer sk-bench-cache"}) as agent:
                for n in range(1, turns + 1):
                    await agent.turn(n)
            return figures(way, emu.responses_requests)
        extra = ["--config", str(config(workdir / f"{way}.json")), "--quiet"]
        if way == "bridge":
            extra += ["--bridge", BRIDGE]
        proxy = ProxyProcess(workdir / f"state-{way}", upstream=emu.url, log_path=workdir / f"{way}.log",
                             extra_args=extra)
        await proxy.astart()
        try:
            task = new_task(proxy.state_dir)
            headers = {"authorization": "Bearer sk-bench-cache", "x-ctp-task": task, "x-ctp-agent": "/root"}
            async with Session(proxy.url, headers) as agent:
                for n in range(1, turns + 1):
                    await agent.turn(n)
        finally:
            await proxy.astop()
        return figures(way, emu.responses_requests)


def schedule(turns: int) -> dict[int, float]:
    """One hard trigger (a notes rollover) at about a third, one remote compaction at about two thirds."""
    return {max(2, 2 * turns // 5): 0.9, max(3, 3 * turns // 4): 0.99}


async def main_async(args: argparse.Namespace) -> int:
    turns = 40 if args.quick else args.turns
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        results = [await run_way(way, turns, Path(tmp), schedule(turns)) for way in ("direct", "ctproxy", "bridge")]
    direct = results[0]
    rows = [[f.way, f.requests, f.prewarms, f.input_tokens, f"{100 * f.cached_share:.1f}%", f"{f.billed:,.0f}",
             f"{f.billed / direct.billed:.3f}", len(f.breaks), f.mismatches] for f in results]
    print(f"{turns} turns, model window {WINDOW} tokens")
    print_table(["way", "requests", "prewarms", "input tokens", "cached", "billed input", "vs direct",
                 "prefix breaks", "prefix_mismatch"], rows)
    for f in results[1:]:
        for b in f.breaks:
            print(f"  {f.way}: {b}")
    write_result("bench_cache", {"turns": turns, "ways": {f.way: {
        "requests": f.requests, "prewarms": f.prewarms, "input_tokens": f.input_tokens,
        "cached_tokens": f.cached_tokens, "cached_share": f.cached_share, "billed_input": f.billed,
        "billed_vs_direct": f.billed / direct.billed, "prefix_breaks": len(f.breaks),
        "prefix_mismatch": f.mismatches} for f in results}})
    floor = all(f.cached_share >= 0.9 for f in results[1:])
    above = all(f.cached_share >= direct.cached_share for f in results[1:])
    print("through ctproxy, cached share >= 90%:", "met" if floor else "NOT met")
    print("through ctproxy, cached share >= direct's:", "met" if above else "not met (a window's prompts are "
          "shorter than direct's, so each request's new, uncached tail is a larger share of it)")
    return 0 if floor else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="40 turns")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
