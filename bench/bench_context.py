"""Context windows over a long run, and what the projection and the checkpoint turn cost (issue 13).

    .venv/bin/python bench/bench_context.py [--quick] [--only long,projection,checkpoint] [--turns N]
        [--baseline-tree PATH [--pairs N]]   (before = PATH's checkout, after = this one, alternated in one run)

**long**: a scripted agent (the openai SDK, stateless like Codex: it resends its whole history, streams,
declares its own function and custom tools) talks to a real `ctproxy up --bridge context,notes,history`
in front of the validating emulator (in this process: `validate_requests=True`, so every `POST
/v1/responses` is checked against the official OpenAPI description and the real API's input rules before
it is answered). The scripted model forces, on a fixed schedule, every way a window changes: `new_context`
through the bridge (alone, and in a batch with the agent's own call), the hard trigger's checkpoint turn
(a clean write, a failed write corrected once, a turn with no write → the readable fallback), a manual
checkpoint, remote compaction v2 before forwarding, its failure (→ the readable fallback), and an upstream
`context_length_exceeded` (→ compaction and one retry). Checked at the end: every request validated,
every function/custom/mcp call of the agent's history has its output, no `context_length_exceeded` (no
error at all) reached the agent, and the journal holds every item the agent sent and received, in order.
Printed: turns, requests, rollovers and compactions by kind, items journaled/expected, wall time, and the
proxy's overhead per request (the agent's latency minus the emulator's own time for the upstream requests
made during it; client and emulator share one event loop but never work at the same time).

**projection**: a 1.5 MB session in a notes window (the agent resends ≈1.5 MB; ctproxy forwards the
bootstrap and the items after the boundary) against the same request with `--disable context`, two
`ctproxy up` processes round-robin; the latency, the proxy's overhead (minus the emulator's time) and the
proxy's CPU per request. Then the same two bodies through `addons.chain()` in process (as
`bench_proxy.py`'s scenario h): the context stage's own time per request.

**checkpoint**: the request that runs the checkpoint turn against a plain request of the same session size:
the agent's latency minus the two upstream round trips (the turn's and the forwarded request's, as the
emulator measured them), next to the plain request's overhead.

`tests/proxy/windows/test_context_long_run.py` runs a short `long` with the same assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: `tests.*` and `bench.*` from the repository root
    sys.path.insert(0, str(REPO))

from bench.common import print_table, ratio, summarize, write_result  # noqa: E402
from proxy.windows.notes.checkpoint_turn import CHOICE as CHECKPOINT_CHOICE  # noqa: E402
from tests.emulator import (  # noqa: E402
    CustomToolCall,
    Emulator,
    FunctionCall,
    Reasoning,
    ReceivedRequest,
    Reply,
    Response,
    Text,
    context_length_exceeded_400,
    server_error_500,
)
from tests.support.proxyproc import ProxyProcess  # noqa: E402

MODEL = "gpt-4.1"
WINDOW = 40_000  # tokens (config `model_windows`): the scripted usage decides when a window is full
HARD_RATIO, REMINDER_RATIO, COMPACTION_THRESHOLD = 0.85, 0.7, 0.95  # compaction above the hard trigger
SHELL = {"type": "function", "name": "shell", "description": "Run a shell command in the workspace.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
                        "additionalProperties": False}, "strict": True}
SCRIPT = {"type": "custom", "name": "run_script", "description": "Run a Python snippet; the input is the code."}
AGENT_TOOLS = [SHELL, SCRIPT]
BRIDGE = "context,notes,history"
OVERFLOW_OUTPUT = 24_000  # characters of a tool output in the turns before an overflow turn
HARD_OUTPUT = 16_000  # … before a hard trigger: ≈4 of them weigh more than a quarter of WINDOW
TURN_RE = re.compile(r"turn (\d+):")
CALL_OUTPUT = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}


# ---- the schedule: what the scripted model does at turn N ---------------------------------------------

# Every 100 turns, in this order of turn numbers (mod 100); every other turn is ordinary work.
SPECIAL = {10: "new_context", 20: "hard", 30: "remote", 40: "mixed", 45: "fallback", 60: "hard_fix",
           70: "overflow", 85: "manual", 95: "hard_fail"}
# What each special turn is expected to open in the journal (strategy of the new window).
OPENS = {"new_context": "notes", "hard": "notes", "remote": "remote", "mixed": "notes", "fallback": "fallback",
         "hard_fix": "notes", "overflow": "remote", "manual": "notes", "hard_fail": "remote"}


# An upstream `context_length_exceeded` teaches compaction a window smaller than the model table's (the
# smallest failed size, kept): from then on compaction's threshold on that window comes before the context
# stage's hard trigger (which reads the table), so no checkpoint turn could run at the trigger again. The
# overflow is therefore forced once, in the last cycle, with the hard triggers before it.
LAST_CYCLE_ONLY = {"overflow"}
AFTER_OVERFLOW = {"hard", "hard_fix", "hard_fail"}


def kind_of(turn: int, turns: int) -> str:
    last_cycle = turn > (turns - 1) // 100 * 100
    special = SPECIAL.get(turn % 100)
    if special in LAST_CYCLE_ONLY and not last_cycle:
        special = None
    if special in AFTER_OVERFLOW and last_cycle and turn % 100 > 70:
        special = None
    if special is not None:
        return special
    return ("text", "shell", "custom", "reasoned")[turn % 4]


def big_output(turn: int, turns: int) -> int:
    """Padding for the tool outputs of `turn`: the eight turns before a hard trigger or the overflow fill the
    window for real, as they come. The hard trigger only runs once the agent's items since the window's
    boundary weigh a quarter of the window (a fresh bootstrap above the trigger never loops)."""
    nxt = next((t for t in range(turn + 1, turn + 9) if kind_of(t, turns) in (*AFTER_OVERFLOW, "overflow")), None)
    if nxt is None:
        return 0
    return OVERFLOW_OUTPUT if kind_of(nxt, turns) == "overflow" else HARD_OUTPUT


@dataclass
class Counts:
    """What the scripted model and the driver did, for the report and the checks."""

    kinds: Counter[str] = field(default_factory=Counter)
    checkpoint_turns: int = 0
    scripted_errors: int = 0  # context_length_exceeded and compact 500s the script sent on purpose
    compact_requests: int = 0


class ScriptedModel:
    """The emulator's default responder: decides from the forwarded request itself (the turn number in the
    newest user message, a trailing tool output, the checkpoint turn's `tool_choice`)."""

    def __init__(self, emu: Emulator, counts: Counts, turns: int):
        self.emu, self.counts, self.turns = emu, counts, turns
        self.checkpoint_mode = "ok"  # what the next checkpoint turn does: ok | fix | fail
        self.overflowed: set[int] = set()
        self.written = 0

    def __call__(self, rec: ReceivedRequest) -> Reply:
        body = rec.json if isinstance(rec.json, dict) else {}
        items = rec.input_items
        if body.get("tool_choice") == CHECKPOINT_CHOICE:
            return self._checkpoint(items)
        last = items[-1] if items else {}
        if last.get("type") in ("function_call_output", "custom_tool_call_output"):
            return Text(f"done after {last.get('call_id')}", deltas=2)
        turn = _turn_of(items)
        if turn is None:
            return Text("no turn found", deltas=2)
        return self._turn(turn)

    def _checkpoint(self, items: list[Any]) -> Reply:
        self.counts.checkpoint_turns += 1
        mode, self.written = self.checkpoint_mode, self.written + 1
        self.checkpoint_mode = "ok"
        corrected = any(i.get("type") == "function_call_output" and str(i.get("call_id", "")).startswith("ckbad")
                        for i in items[-3:])
        if mode == "fail":
            return Text("I will not write a note now.", deltas=2)
        if mode == "fix" and not corrected:
            self.checkpoint_mode = "fix"  # the correction round is the same turn
            return FunctionCall("notes_write_file", {"path": "../../escape.md", "text": "x"},
                                call_id=f"ckbad_{self.written}")
        return FunctionCall("notes_write_file", {"path": f"checkpoints/ck-{self.written:05d}.md",
                                                 "text": f"checkpoint {self.written}: resume the numbered turns\n"},
                            call_id=f"ck_{self.written}")

    def _turn(self, n: int) -> Reply:
        kind = kind_of(n, self.turns)
        usage_full = {"input_tokens": int(0.99 * WINDOW)}
        if kind == "text":
            return Text(f"answer to turn {n}", deltas=3)
        if kind == "reasoned":
            return Response([Reasoning(summary=f"thinking about {n}"), Text(f"reasoned answer {n}")])
        if kind == "shell":
            return FunctionCall("shell", {"cmd": f"echo {n}"}, call_id=f"sh_{n}")
        if kind == "custom":
            return CustomToolCall("run_script", f"print({n} * 2)", call_id=f"py_{n}")
        if kind == "new_context":
            return FunctionCall("new_context", {}, call_id=f"nc_{n}")
        if kind == "mixed":  # a batch: the agent's own call and the bridged new_context
            return Response([FunctionCall("shell", {"cmd": f"ls {n}"}, call_id=f"shm_{n}"),
                             FunctionCall("new_context", {}, call_id=f"ncm_{n}")])
        if kind in ("hard", "hard_fix", "hard_fail"):
            self.checkpoint_mode = {"hard": "ok", "hard_fix": "fix", "hard_fail": "fail"}[kind]
            return Text(f"window nearly full at {n}", usage={"input_tokens": int(0.9 * WINDOW)})
        if kind == "remote":
            return Text(f"window full at {n}", usage=usage_full)
        if kind == "fallback":
            self.emu.script_compact(server_error_500())
            self.counts.scripted_errors += 1
            return Text(f"window full at {n}, compaction will fail", usage=usage_full)
        if kind == "overflow" and n not in self.overflowed:
            self.overflowed.add(n)
            self.counts.scripted_errors += 1
            return context_length_exceeded_400()
        return Text(f"answer to turn {n} after the retry", deltas=2)  # manual, overflow's retry


def _turn_of(items: list[Any]) -> int | None:
    for item in reversed(items):
        if item.get("role") == "user":
            content = item.get("content")
            texts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or []]
            for text in texts:
                if m := TURN_RE.search(text):
                    return int(m.group(1))
    return None


# ---- the agent ---------------------------------------------------------------------------------------


def plain(item: Any) -> dict[str, Any]:
    """An output item as a stateless agent resends it (the SDK's model, as JSON)."""
    return item.model_dump(mode="json", exclude_none=True)


@dataclass
class Sample:
    """One agent request: its latency, and the emulator's own time for the upstream requests it caused."""

    kind: str
    latency: float
    upstream: float
    upstream_requests: int

    @property
    def overhead(self) -> float:
        return self.latency - self.upstream


class AgentError(AssertionError):
    """Something reached the agent that must not (an HTTP error, an error event, a failed response)."""


class StatelessAgent:
    """Resends its whole history every request (as Codex does), streams, and runs its own tools.

    The history goes in `extra_body`: the SDK's parameter transform walks every item (≈8 s for 8,000
    items), which would measure the SDK, not the proxy; the request is the same JSON."""

    def __init__(self, client: openai.AsyncOpenAI, emu: Emulator, turns: int,
                 direct: tuple[openai.AsyncOpenAI, Emulator] | None = None):
        self.client, self.emu, self.turns, self.direct = client, emu, turns, direct
        self.history: list[dict[str, Any]] = []
        # (bytes of the agent's request, overhead through ctproxy − overhead of the same request sent directly)
        self.paired: list[tuple[int, float]] = []
        self.samples: list[Sample] = []
        self.upstream_statuses: Counter[int] = Counter()
        self.requests_validated = 0
        self.compact_bodies: list[dict[str, Any]] = []
        self.compactions_at: list[str] = []
        self.refusals: list[str] = []  # what the emulator answered with an error, and why (for the report)
        self._last_output: list[Any] = []

    async def request(self, kind: str) -> Any:
        latency, final = await self._create(self.client, kind)
        self.samples.append(self._sample(kind, latency))
        self.history.extend(plain(o) for o in final.output)
        return final

    async def probe(self) -> None:
        """The baseline measured in the same run: the agent's last request (the same client, the same SDK work,
        the same bytes) sent straight to a second emulator; paired with what it cost through ctproxy."""
        last = self.samples[-1]
        if self.direct is None or last.upstream_requests != 1:
            return
        client, emu = self.direct
        emu.requests.clear()
        history, self.history = self.history, self.history[:-len(self._last_output)] if self._last_output else []
        try:
            latency, _ = await self._create(client, "probe")
        finally:
            self.history = history
        upstream = sum(r.answered_at - r.received_at for r in emu.requests if r.answered_at is not None)
        size = len(emu.requests[0].body) if emu.requests else 0
        emu.requests.clear()
        self.paired.append((size, last.overhead - (latency - upstream)))

    async def _create(self, client: openai.AsyncOpenAI, kind: str) -> tuple[float, Any]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        final = None
        try:
            stream = await client.responses.create(
                model=MODEL, stream=True, store=False, tools=AGENT_TOOLS, parallel_tool_calls=True,
                include=["reasoning.encrypted_content"], extra_body={"input": self.history})
            async for event in stream:
                if event.type in ("error", "response.failed", "response.incomplete"):
                    raise AgentError(f"{kind}: the agent got {event.type}: {event}")
                if event.type == "response.completed":
                    final = event.response
        except openai.APIStatusError as exc:
            raise AgentError(f"{kind}: the agent got HTTP {exc.status_code}: {exc.body}") from None
        latency = loop.time() - start
        if final is None:
            raise AgentError(f"{kind}: the stream ended without response.completed")
        self._last_output = final.output
        return latency, final

    def _sample(self, kind: str, latency: float) -> Sample:
        upstream, count = 0.0, 0
        for rec in self.emu.requests:
            self.upstream_statuses[rec.status or 0] += 1
            if rec.route == "compact":
                self.compact_bodies.append(rec.json)
                self.compactions_at.append(f"{len(self.history)}:{kind}")
            elif rec.route in ("responses", "compaction") and rec.status is not None and self.emu.validate_requests:
                self.requests_validated += 1  # validate_requests: a body violating CreateResponse got a 400
            if rec.status not in (None, 200):
                self.refusals.append(f"{kind}: {rec.route} {rec.status} {rec.extra.get('error_body', b'')[:3000]!r}")
            if rec.answered_at is not None:
                upstream += rec.answered_at - rec.received_at
            count += 1
        self.emu.requests.clear()  # bounded memory over thousands of requests
        return Sample(kind, latency, upstream, count)

    async def turn(self, n: int) -> None:
        kind = kind_of(n, self.turns)
        self.history.append({"role": "user", "content": f"turn {n}: continue the numbered work ({kind})"})
        resp = await self.request(kind)
        for _ in range(4):  # the agent's own calls, then the model's answer
            outs = [self._run(o, n) for o in resp.output if o.type in CALL_OUTPUT]
            if not outs:
                return
            self.history.extend(outs)
            resp = await self.request(kind + "+outputs")
        raise AgentError(f"turn {n}: the model kept calling the agent's tools")

    def _run(self, call: Any, n: int) -> dict[str, Any]:
        pad = "." * big_output(n, self.turns)
        if call.type == "function_call":
            return {"type": "function_call_output", "call_id": call.call_id, "output": f"ran {call.arguments}{pad}"}
        return {"type": "custom_tool_call_output", "call_id": call.call_id, "output": f"printed {call.input}{pad}"}


# ---- checks ------------------------------------------------------------------------------------------


def unanswered_calls(history: Sequence[dict[str, Any]]) -> list[str]:
    """Calls of the agent's history without their output (function/custom), or mcp_calls without a result."""
    outputs = {(i.get("type"), i.get("call_id")) for i in history}
    missing = []
    for item in history:
        kind = item.get("type")
        if kind in CALL_OUTPUT and (CALL_OUTPUT[kind], item.get("call_id")) not in outputs:
            missing.append(f"{kind} {item.get('call_id')}")
        elif kind == "mcp_call" and item.get("output") is None and item.get("error") is None:
            missing.append(f"mcp_call {item.get('id')}")
    return missing


def call_counts(history: Sequence[dict[str, Any]]) -> Counter[str]:
    return Counter(i["type"] for i in history if i.get("type") in ("function_call", "custom_tool_call", "mcp_call"))


def journal_items(db_path: Path, task: str) -> list[dict[str, Any]]:
    """The items of the task's /root sessions on their current branch, in branch order (raw JSON)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT r.raw FROM journal_sessions s JOIN journal_branch b ON b.session_key = s.session_key "
            "JOIN journal_items i ON i.item_id = b.item_id JOIN journal_raw r ON r.seq = i.seq "
            "WHERE s.task_id = ? AND s.address = '/root' ORDER BY s.created_at, b.pos", (task,)).fetchall()
    return [orjson.loads(raw) for (raw,) in rows]


def window_strategies(db_path: Path, task: str) -> Counter[str]:
    return Counter(s for s, _ in window_reasons(db_path, task).elements())


def window_reasons(db_path: Path, task: str) -> Counter[tuple[str, str]]:
    """(strategy, why) of every window the task's /root opened: why = the reason's category (threshold,
    overflow, new_context, checkpoint, …)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT strategy, coalesce(reason, '') FROM journal_windows "
                          "WHERE task_id = ? AND address = '/root'", (task,)).fetchall()
    return Counter((s, r.split(":")[0]) for s, r in rows)


def same_item(journaled: dict[str, Any], sent: dict[str, Any]) -> bool:
    """The journal keeps the item as first seen; compare what identifies it (ids, call ids, text)."""
    for key in ("type", "role", "call_id", "id", "output", "arguments", "input"):
        if key in sent and journaled.get(key) != sent[key]:
            return False
    if "content" in sent:
        return orjson.dumps(journaled.get("content"), option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            sent["content"], option=orjson.OPT_SORT_KEYS)
    return True


async def wait_for_journal(db_path: Path, task: str, history: Sequence[dict[str, Any]],
                           timeout: float = 60.0) -> list[dict[str, Any]]:
    """The journal writes on its own thread a moment after each exchange: wait until it holds the agent's last
    item (the journal also holds ctproxy's own checkpoint writes, so a count does not say it caught up)."""
    deadline = time.monotonic() + timeout
    items: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        items = journal_items(db_path, task) if db_path.exists() else []
        if len(items) >= len(history) and any(same_item(i, history[-1]) for i in items[-8:]):
            return items
        await asyncio.sleep(0.2)
    return items


async def wait_for_windows(db_path: Path, task: str, forced: int, timeout: float = 60.0) -> Counter[tuple[str, str]]:
    """Windows commit with the journal writer's next batch: wait until the forced ones are all there."""
    deadline = time.monotonic() + timeout
    reasons: Counter[tuple[str, str]] = Counter()
    while time.monotonic() < deadline:
        reasons = window_reasons(db_path, task)
        if sum(n for (s, _), n in reasons.items() if s != "start") >= forced:
            break
        await asyncio.sleep(0.2)
    return reasons


# ---- the long run ------------------------------------------------------------------------------------


@dataclass
class LongRunResult:
    turns: int
    wall_s: float
    samples: list[Sample]
    counts: Counts
    reasons: Counter[tuple[str, str]]
    journaled: list[dict[str, Any]]
    history: list[dict[str, Any]]
    requests_validated: int
    upstream_statuses: Counter[int]
    compact_bodies: list[dict[str, Any]]
    rollovers_metric: float | None
    proxy_log: str
    refusals: list[str]
    compactions_at: list[str]
    paired: list[tuple[int, float]]

    @property
    def strategies(self) -> Counter[str]:
        return Counter(s for s, _ in self.reasons.elements())

    @property
    def expected_windows(self) -> Counter[str]:
        return Counter(OPENS[k] for k, n in self.counts.kinds.items() if k in OPENS for _ in range(n))

    def figures(self) -> dict[str, Any]:
        plain_turns = [s.overhead for s in self.samples if s.upstream_requests == 1]
        every = [s.overhead for s in self.samples]
        return {
            "turns": self.turns, "agent_requests": len(self.samples),
            "upstream_requests": sum(s.upstream_requests for s in self.samples),
            "requests_validated": self.requests_validated,
            "checkpoint_turns": self.counts.checkpoint_turns,
            "windows_opened": dict(self.strategies - Counter({"start": 10**9})),
            "windows_by_reason": {f"{s}/{r}": n for (s, r), n in sorted(self.reasons.items()) if s != "start"},
            "windows_expected": dict(self.expected_windows),
            "overflow_compactions": dict(self.overflow_strategies),
            "unforced_compactions": self.unforced_compactions,
            "compact_requests": len(self.compact_bodies),
            "calls": dict(call_counts(self.history)),
            "items_journaled": self.journal_match()[0], "items_expected": len(self.history),
            "checkpoint_writes_journaled": self.journal_match()[1],
            "other_items_journaled": len(self.journal_match()[2]),
            "wall_s": round(self.wall_s, 2),
            "overhead_ms_one_upstream_request": summarize(plain_turns).ms() if plain_turns else None,
            "overhead_ms_all": summarize(every).ms() if every else None,
            "proxy_added_ms_vs_direct": summarize([d for _, d in self.paired]).ms() if self.paired else None,
            "proxy_added_ms_vs_direct_by_size": {
                label: summarize(v).ms() for label, v in _by_size(self.paired).items() if v},
            "agent_bytes_last": len(orjson.dumps(self.history)),
            "rollovers_metric": self.rollovers_metric,
        }

    def problems(self) -> list[str]:
        """Every acceptance point of the run that does not hold (empty: all hold)."""
        out = []
        wanted = {200: sum(self.upstream_statuses.values()) - self.counts.scripted_errors}
        bad = {k: v for k, v in self.upstream_statuses.items() if k not in (200, 400, 500)}
        if self.upstream_statuses[200] != wanted[200] or bad:
            out.append(f"upstream answers other than the script's: {dict(self.upstream_statuses)} "
                       f"({self.counts.scripted_errors} scripted errors)")
        from tests.openapi_schema import is_valid, schema_errors, spec_available

        for i, body in enumerate(self.compact_bodies if spec_available() else ()):
            if not is_valid("CompactResponseMethodPublicBody", body):
                small = {**body, "input": body.get("input", [])[:3]} if isinstance(body, dict) else body
                errs = schema_errors("CompactResponseMethodPublicBody", small) or ["(in a later item)"]
                out.append(f"/responses/compact body {i} of {len(self.compact_bodies)} is invalid: {errs[0]}")
                break
        if missing := unanswered_calls(self.history):
            out.append(f"{len(missing)} call(s) without their output: {missing[:5]}")
        matched, _own, other = self.journal_match()
        if matched != len(self.history):
            out.append(f"the journal holds {matched} of the agent's {len(self.history)} items (in order)")
        if other:
            out.append(f"{len(other)} journaled item(s) the agent never sent or received, e.g. {other[0]}")
        opened, expected = self.opened_by_cause, self.expected_by_cause
        # remote compactions the script did not force may come on top (`unforced_compactions`): compaction
        # estimates the agent's request as sent, before a notes window is applied (ADR 0006), and after the
        # overflow its threshold applies to the smaller window the upstream taught
        if opened - Counter(remote=opened["remote"]) != expected - Counter(remote=expected["remote"]) or \
                opened["remote"] < expected["remote"]:
            out.append(f"windows opened {dict(opened)}, expected {dict(expected)}")
        return out

    @property
    def unforced_compactions(self) -> int:
        return max(0, self.opened_by_cause["remote"] - self.expected_by_cause["remote"])

    def journal_match(self) -> tuple[int, int, list[dict[str, Any]]]:
        """(agent items found in the journal, in order; ctproxy's own checkpoint writes, journaled as mcp_call
        items; any other journaled item, which the journal should not hold)."""
        k, own, other = 0, 0, []
        for item in self.journaled:
            if k < len(self.history) and same_item(item, self.history[k]):
                k += 1
            elif item.get("type") == "mcp_call" and str(item.get("id", "")).startswith("mcp_ctpf_ck"):
                own += 1
            else:
                other.append({x: item.get(x) for x in ("type", "role", "name", "id", "call_id") if x in item})
        return k, own, other

    @property
    def opened_by_cause(self) -> Counter[str]:
        """Windows opened, by strategy; an overflow's by its cause, whatever the strategy (`overflow_strategies`
        says which)."""
        return Counter("overflow" if why == "overflow" else s for s, why in self.reasons.elements() if s != "start")

    @property
    def expected_by_cause(self) -> Counter[str]:
        return Counter("overflow" if k == "overflow" else OPENS[k]
                       for k, n in self.counts.kinds.items() if k in OPENS for _ in range(n))

    @property
    def overflow_strategies(self) -> Counter[str]:
        return Counter(s for s, why in self.reasons.elements() if why == "overflow")


SIZE_BUCKETS = ((100_000, "< 100 KB"), (500_000, "100–500 KB"), (1_000_000, "0.5–1 MB"), (10**12, "≥ 1 MB"))


def _by_size(paired: Sequence[tuple[int, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {label: [] for _, label in SIZE_BUCKETS}
    for size, added in paired:
        out[next(label for bound, label in SIZE_BUCKETS if size < bound)].append(added)
    return out


def write_config(path: Path) -> Path:
    path.write_text(json.dumps({
        "model_windows": {MODEL: WINDOW},
        "context": {"reminder_ratio": REMINDER_RATIO, "hard_ratio": HARD_RATIO},
        "remote_compaction": {"enabled": True, "threshold": COMPACTION_THRESHOLD},
    }))
    return path


def new_task(state_dir: Path) -> str:
    return subprocess.run([sys.executable, "-m", "proxy.app.cli", "task", "new", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout.strip()


async def manual_checkpoint(proxy: ProxyProcess, task: str) -> None:
    token = (proxy.state_dir / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": "/root"}
    async with aiohttp.ClientSession() as http:
        for _ in range(200):  # the journal commits the session in the background
            async with http.post(f"{proxy.tools_url}/v1/context/checkpoint", headers=headers,
                                 json={"task": task, "agent": "/root"}) as r:
                if r.status == 200:
                    return
            await asyncio.sleep(0.05)
    raise AgentError("POST /v1/context/checkpoint never accepted the session")


async def rollovers_metric(proxy: ProxyProcess) -> float | None:
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http, http.get(
            f"{proxy.tools_url}/metrics", headers={"Authorization": f"Bearer {token}"}) as r:
        text = await r.text()
    values = [float(m.group(1)) for m in re.finditer(r'^ctproxy_rollovers_total\{[^}]*\} (\S+)$', text, re.M)]
    return sum(values) if values else None


async def long_run(turns: int, workdir: Path, progress: bool = False, probe_every: int = 5) -> LongRunResult:
    """`turns` scripted turns through a real `ctproxy up`; see the module docstring."""
    counts = Counts()
    workdir.mkdir(parents=True, exist_ok=True)
    from tests.openapi_schema import spec_available

    # The official OpenAPI description lives in ../shared (a user's clone has none): without it the run
    # checks everything else, and says that it validated nothing.
    async with Emulator(validate_requests=spec_available()) as emu:
        emu.set_default(ScriptedModel(emu, counts, turns))
        proxy = ProxyProcess(workdir / "state", upstream=emu.url, log_path=workdir / "ctproxy.log",
                             extra_args=["--config", str(write_config(workdir / "ctx.json")), "--bridge", BRIDGE,
                                         "--quiet"])
        await proxy.astart()
        try:
            task = new_task(proxy.state_dir)
            headers = {"x-ctp-task": task, "x-ctp-agent": "/root"}
            async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-long-run-not-real",
                                          max_retries=0, timeout=120, default_headers=headers) as client, \
                    Emulator() as direct, openai.AsyncOpenAI(base_url=direct.url + "/v1", api_key="sk-direct",
                                                             max_retries=0, timeout=120) as direct_client:
                agent = StatelessAgent(client, emu, turns, (direct_client, direct))
                start = time.monotonic()
                for n in range(1, turns + 1):
                    kind = kind_of(n, turns)
                    counts.kinds[kind] += 1
                    await agent.turn(n)
                    if n % probe_every == 0:
                        await agent.probe()
                    if kind == "manual":
                        await manual_checkpoint(proxy, task)
                    if progress and n % 100 == 0:
                        print(f"   … turn {n}: {len(agent.history)} items, "
                              f"{time.monotonic() - start:.0f} s", flush=True)
                wall = time.monotonic() - start
            # the manual mark of a last turn would apply to a next request that never comes
            if kind_of(turns, turns) == "manual":
                counts.kinds["manual"] -= 1
            db = proxy.state_dir / "ctproxy.db"
            journaled = await wait_for_journal(db, task, agent.history)
            forced = sum(n for k, n in counts.kinds.items() if k in OPENS)
            reasons = await wait_for_windows(db, task, forced)
            metric = await rollovers_metric(proxy)
            return LongRunResult(turns, wall, agent.samples, counts, reasons, journaled,
                                 agent.history, agent.requests_validated, agent.upstream_statuses,
                                 agent.compact_bodies, metric, proxy.log(), agent.refusals, agent.compactions_at,
                                 agent.paired)
        finally:
            await proxy.astop()


def print_long(result: LongRunResult) -> dict[str, Any]:
    fig = result.figures()
    print(f"long  {fig['turns']} turns, {fig['agent_requests']} agent requests, {fig['upstream_requests']} upstream "
          f"requests ({fig['requests_validated']} create requests validated against the OpenAPI description, "
          f"{fig['compact_requests']} /responses/compact), {fig['checkpoint_turns']} checkpoint-turn requests")
    print(f"      windows by reason {fig['windows_by_reason']}")
    print(f"      windows opened {fig['windows_opened']} (the script's {fig['windows_expected']}); overflow "
          f"recoveries compacted as {fig['overflow_compactions']}; {fig['unforced_compactions']} "
          f"remote compaction(s) the script did not force; "
          f"rollovers metric {fig['rollovers_metric']}")
    print(f"      calls {fig['calls']}; items journaled/expected {fig['items_journaled']}/{fig['items_expected']} "
          f"(+{fig['checkpoint_writes_journaled']} checkpoint writes, +{fig['other_items_journaled']} others); "
          f"the agent's last request {fig['agent_bytes_last'] / 1e6:.2f} MB")
    one, every = fig["overhead_ms_one_upstream_request"], fig["overhead_ms_all"]
    print(f"      wall {fig['wall_s']} s; the agent's latency minus the emulator's time (client and SDK included): "
          f"requests with one upstream request median {one['median']:.2f} ms p99 {one['p99']:.2f} ms; all "
          f"requests median {every['median']:.2f} ms p99 {every['p99']:.2f} ms")
    if (added := fig["proxy_added_ms_vs_direct"]) is not None:
        sizes = ", ".join(f"{k}: {v['median']:.2f} ms (n={v['n']})"
                          for k, v in fig["proxy_added_ms_vs_direct_by_size"].items())
        print(f"      ctproxy's own overhead (the same request sent directly, paired; n={added['n']}): median "
              f"{added['median']:.2f} ms, p99 {added['p99']:.2f} ms; by the agent's request size: {sizes}")
    problems = result.problems()
    for p in problems:
        print(f"      NOT MET: {p}")
    for r, n in Counter(result.refusals).most_common(5):  # the script's own errors, and any other
        print(f"      upstream error ×{n}: {r[:200]}")
    if not problems:
        print("      all checks hold: every request valid, every call answered, no error reached the agent, "
              "the journal holds every item")
    fig["problems"] = problems
    return fig


# ---- projection: a 1.5 MB session in a notes window, context on against off ----------------------------


BENCH_KEY = "Bearer sk-bench-context-not-real"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Timed:
    latency: float
    upstream: float  # the emulator's own time for the upstream requests made during this one
    upstream_requests: int
    forwarded_bytes: list[int]
    answer: dict[str, Any]

    @property
    def overhead(self) -> float:
        return self.latency - self.upstream


async def timed_post(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
                     emu: Emulator) -> Timed:
    emu.requests.clear()
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with http.post(url, data=body, headers=headers) as resp:
        data = await resp.read()
    latency = loop.time() - start
    if resp.status != 200:
        raise AgentError(f"HTTP {resp.status}: {data[:300]!r}")
    recs = list(emu.requests)
    emu.requests.clear()
    upstream = sum(r.answered_at - r.received_at for r in recs if r.answered_at is not None)
    return Timed(latency, upstream, len(recs), [len(r.body) for r in recs], orjson.loads(data))


async def rest_tool(proxy: ProxyProcess, name: str, task: str, args: dict[str, Any]) -> None:
    token = (proxy.state_dir / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": "/root"}
    async with aiohttp.ClientSession() as http:
        for _ in range(200):  # the journal commits the session in the background
            async with http.post(f"{proxy.tools_url}/v1/tools/{name}", json=args, headers=headers) as r:
                if r.status == 200:
                    return
            await asyncio.sleep(0.05)
    raise AgentError(f"{name} was never accepted")


def agent_headers(task: str) -> dict[str, str]:
    return {"content-type": "application/json", "authorization": BENCH_KEY, "x-ctp-task": task,
            "x-ctp-agent": "/root"}


NOTES_TOOLS = [  # declared by the agent (no bridge hop in the figures): the context tools reachable
    {"type": "function", "name": "new_context", "description": "Start a new context window.", "strict": False,
     "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
    {"type": "function", "name": "notes_write_file", "description": "Write a note.", "strict": False,
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}}},
]


async def projection(rounds: int, warmup: int, workdir: Path) -> dict[str, Any]:
    """The same 1.5 MB request to two `ctproxy up`: context on (the session in a notes window: ctproxy forwards
    the bootstrap and what follows the boundary) and `--disable context` (forwarded whole), round-robin."""
    from bench.bench_proxy import make_payload
    from bench.common import round_robin

    payload = make_payload(1_500_000, stream=False, item_bytes=1000)
    payload["tools"] = [*payload["tools"], *NOTES_TOOLS]
    body = orjson.dumps(payload)
    async with Emulator() as emu:
        procs = {"context on": ProxyProcess(workdir / "on", upstream=emu.url, log_path=workdir / "on.log",
                                            extra_args=["--quiet"]),
                 "context off": ProxyProcess(workdir / "off", upstream=emu.url, log_path=workdir / "off.log",
                                             extra_args=["--quiet", "--disable", "context"])}
        for p in procs.values():
            await p.astart()
        try:
            tasks = {k: new_task(p.state_dir) for k, p in procs.items()}
            urls = {k: f"{p.url}/v1/responses" for k, p in procs.items()}
            timeout = aiohttp.ClientTimeout(total=120)
            async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as http:
                for k in procs:
                    await timed_post(http, urls[k], body, agent_headers(tasks[k]), emu)
                await rest_tool(procs["context on"], "new_context", tasks["context on"], {})
                first = await timed_post(http, urls["context on"], body, agent_headers(tasks["context on"]), emu)
                if first.forwarded_bytes[0] > len(body) // 10:
                    raise AgentError(f"the rollover did not apply: {first.forwarded_bytes} bytes forwarded")
                samples: dict[str, list[Timed]] = {k: [] for k in procs}

                async def one(name: str, url: str) -> Timed:
                    return await timed_post(http, url, body, agent_headers(tasks[name]), emu)

                for _ in range(warmup):
                    for k in procs:
                        await one(k, urls[k])
                cpu0 = {k: cpu_seconds(p.proc.pid) for k, p in procs.items() if p.proc}
                got = await round_robin(urls, rounds, one)
                cpu1 = {k: cpu_seconds(p.proc.pid) for k, p in procs.items() if p.proc}
                for k, v in got.items():
                    samples[k] = list(v)
        finally:
            for p in procs.values():
                await p.astop()
    out: dict[str, Any] = {"body_bytes": len(body), "items": len(payload["input"]), "rounds": rounds}
    for k, v in samples.items():
        out[k] = {"latency": summarize([t.latency for t in v]).ms(),
                  "overhead": summarize([t.overhead for t in v]).ms(),
                  "upstream": summarize([t.upstream for t in v]).ms(),
                  "forwarded_bytes": v[-1].forwarded_bytes[0],
                  "cpu_ms_per_request": round((cpu1[k] - cpu0[k]) / len(v) * 1000, 3)}
    on, off = out["context on"], out["context off"]
    out["ratio_latency"] = round(ratio(on["latency"]["median"], off["latency"]["median"]), 4)
    out["ratio_overhead"] = round(ratio(on["overhead"]["median"], off["overhead"]["median"]), 4)
    out["ratio_cpu"] = round(ratio(on["cpu_ms_per_request"], off["cpu_ms_per_request"]), 4)
    out["in_process"] = await projection_in_process(body, procs, tasks, max(10, rounds // 2))
    return out


async def projection_in_process(body: bytes, procs: dict[str, ProxyProcess], tasks: dict[str, str],
                                rounds: int) -> dict[str, Any]:
    """The same body through every hook of `addons.chain()` in this process, on a copy of each proxy's state
    directory (so the on-session is in its notes window): the context stage's own time, and all hooks."""
    import shutil

    from mitmproxy.test import taddons

    import addons
    from bench.bench_proxy import time_hooks

    out: dict[str, Any] = {}
    for name, proc in procs.items():
        with tempfile.TemporaryDirectory(prefix="ctproxy-bench-ctx-hooks-") as tmp:
            state = Path(tmp) / "state"
            shutil.copytree(proc.state_dir, state, ignore=shutil.ignore_patterns("*.lock", "*.sock"))
            if name == "context off":
                (state / "config.json").write_text(json.dumps({"context": {"enabled": False}}))
            chain = addons.chain()
            samples: dict[str, list[float]] = {}
            forwarded = 0
            with taddons.context(*chain, loadcore=False) as tctx:
                tctx.options.update(ctp_state_dir=str(state), ctp_upstream="http://127.0.0.1:9",
                                    ctp_trust_upstream=True)
                sizes: list[int] = []
                record_size = sizes.append
                for _ in range(rounds):
                    await time_hooks(chain, _flow(body, tasks[name]), samples,
                                     lambda f, add=record_size: add(len(f.request.raw_content or b"")))
                forwarded = sizes[-1] if sizes else 0
                for addon in chain:
                    if (done := getattr(addon, "done", None)) is not None:
                        result = done()
                        if asyncio.iscoroutine(result):
                            await result
            medians = {k: round(summarize(v).median * 1000, 4) for k, v in samples.items()}
            out[name] = {"context_ms": medians.get("Context.request", 0.0),
                         "all_hooks_ms": round(sum(medians.values()), 4),
                         "forwarded_bytes": forwarded, "top": dict(sorted(medians.items(), key=lambda kv: -kv[1])[:5])}
    return out


def _flow(body: bytes, task: str) -> Any:
    from mitmproxy import http
    from mitmproxy.proxy.mode_specs import ProxyMode
    from mitmproxy.test import tflow

    flow = tflow.tflow()
    flow.client_conn.proxy_mode = ProxyMode.parse("reverse:http://127.0.0.1:9")
    flow.request = http.Request.make("POST", "http://127.0.0.1:9/v1/responses", body, agent_headers(task))
    return flow


# ---- checkpoint: the checkpoint turn's added latency -------------------------------------------------


class CheckpointModel:
    """Answers `fill …` with 90% of the window used, the checkpoint turn with one own-notes write, else text."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, rec: ReceivedRequest) -> Reply:
        body = rec.json if isinstance(rec.json, dict) else {}
        if body.get("tool_choice") == CHECKPOINT_CHOICE:
            self.n += 1
            return FunctionCall("notes_write_file", {"path": f"ck-{self.n}.md", "text": f"checkpoint {self.n}\n"},
                                call_id=f"ck_{self.n}")
        user = [i for i in rec.input_items if i.get("role") == "user"]
        text = json.dumps(user[-1]) if user else ""
        if "fill" in text:
            return Text("filled", deltas=2, usage={"input_tokens": int(0.9 * CK_WINDOW)})
        return Text("answered", deltas=2)


CK_WINDOW = 20_000
CK_FILL = 24_000  # bytes of tool output per round: > a quarter of CK_WINDOW in tokens (bytes / 4)


async def checkpoint(rounds: int, warmup: int, workdir: Path) -> dict[str, Any]:
    """Per round: a plain request whose answer fills 90% of the window (one upstream round trip), then the
    next request, which runs the checkpoint turn before it is forwarded (two). The checkpoint's added latency
    = its overhead (latency minus both upstream times) minus the plain request's overhead."""
    from bench.bench_proxy import make_payload

    cfg = workdir / "ck.json"
    workdir.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps({"model_windows": {"gpt-5": CK_WINDOW}, "context": {"hard_ratio": HARD_RATIO}}))
    base = make_payload(30_000, stream=False, item_bytes=1000)
    base["tools"] = [*base["tools"], *NOTES_TOOLS]
    history: list[dict[str, Any]] = base["input"][:-1]
    plain_s: list[Timed] = []
    ck_s: list[Timed] = []
    async with Emulator() as emu:
        emu.set_default(CheckpointModel())
        proxy = ProxyProcess(workdir / "state", upstream=emu.url, log_path=workdir / "ck.log",
                             extra_args=["--quiet", "--config", str(cfg)])
        await proxy.astart()
        try:
            task = new_task(proxy.state_dir)
            url = f"{proxy.url}/v1/responses"
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
                for i in range(warmup + rounds):
                    pair = []
                    # the hard trigger needs the items since the boundary to weigh a quarter of the window
                    history.append({"type": "function_call", "name": "exec_command", "call_id": f"c_{i}",
                                    "arguments": '{"cmd":"cat log"}'})
                    history.append({"type": "function_call_output", "call_id": f"c_{i}", "output": "." * CK_FILL})
                    for text in (f"fill the window, round {i}", f"go on, round {i}"):
                        history.append({"type": "message", "role": "user", "content": text})
                        req = orjson.dumps({**base, "input": history})
                        t = await timed_post(http, url, req, agent_headers(task), emu)
                        history.extend(t.answer["output"])
                        pair.append(t)
                    if pair[1].upstream_requests != 2:
                        raise AgentError(f"round {i}: no checkpoint turn ({pair[1].upstream_requests} upstream "
                                         "requests)")
                    if i >= warmup:
                        plain_s.append(pair[0])
                        ck_s.append(pair[1])
        finally:
            await proxy.astop()
    plain_o = summarize([t.overhead for t in plain_s])
    ck_o = summarize([t.overhead for t in ck_s])
    return {"rounds": rounds, "agent_bytes_last": len(orjson.dumps(history)),
            "plain": {"latency": summarize([t.latency for t in plain_s]).ms(), "overhead": plain_o.ms()},
            "checkpoint": {"latency": summarize([t.latency for t in ck_s]).ms(), "overhead": ck_o.ms(),
                           "upstream_turn": summarize([t.upstream for t in ck_s]).ms()},
            "added_beyond_upstream_ms": round((ck_o.median - plain_o.median) * 1000, 3),
            "added_beyond_upstream_p99_ms": round((ck_o.p99 - plain_o.p99) * 1000, 3)}


def print_projection(fig: dict[str, Any]) -> None:
    on, off = fig["context on"], fig["context off"]
    print(f"projection  {fig['body_bytes'] / 1e6:.2f} MB, {fig['items']} items, {fig['rounds']} rounds round-robin "
          f"(medians, ms; forwarded: on {on['forwarded_bytes']:,} B, off {off['forwarded_bytes']:,} B)")
    print_table(["", "latency", "p99", "overhead (− upstream)", "p99", "proxy CPU/request"],
                [[k, f"{v['latency']['median']:.2f}", f"{v['latency']['p99']:.2f}", f"{v['overhead']['median']:.2f}",
                  f"{v['overhead']['p99']:.2f}", f"{v['cpu_ms_per_request']:.2f}"] for k, v in
                 (("context on", on), ("context off", off))])
    print(f"   on/off: latency ×{fig['ratio_latency']:.3f}, overhead ×{fig['ratio_overhead']:.3f}, "
          f"CPU ×{fig['ratio_cpu']:.3f}")
    for k, v in fig["in_process"].items():
        print(f"   in process, {k}: Context.request {v['context_ms']:.3f} ms, all hooks {v['all_hooks_ms']:.3f} ms "
              f"(forwarded {v['forwarded_bytes']:,} B); top {v['top']}")


def print_checkpoint(ck: dict[str, Any]) -> None:
    p, c = ck["plain"], ck["checkpoint"]
    print(f"checkpoint  {ck['rounds']} rounds (the agent's request grows to {ck['agent_bytes_last'] / 1e3:.0f} KB); "
          f"medians ms")
    print(f"   plain request: latency {p['latency']['median']:.2f}, overhead {p['overhead']['median']:.2f}")
    print(f"   with the checkpoint turn: latency {c['latency']['median']:.2f} (two upstream round trips "
          f"{c['upstream_turn']['median']:.2f}), overhead {c['overhead']['median']:.2f}")
    print(f"   added beyond its upstream round trip: {ck['added_beyond_upstream_ms']:+.2f} ms median "
          f"({ck['added_beyond_upstream_p99_ms']:+.2f} ms at p99)")


# ---- before and after in one run (--baseline-tree) ---------------------------------------------------

FIGURES = (  # (label, path in the results) of the projection and checkpoint-turn figures compared
    ("projection, context on: latency", ("projection", "context on", "latency", "median")),
    ("projection, context on: overhead", ("projection", "context on", "overhead", "median")),
    ("projection, in process: Context.request", ("projection", "in_process", "context on", "context_ms")),
    ("checkpoint turn: added beyond its round trip", ("checkpoint", "added_beyond_upstream_ms",)),
    ("plain request of that session: latency", ("checkpoint", "plain", "latency", "median")),
)


def _figure(results: dict[str, Any], path: Sequence[str]) -> float | None:
    v: Any = results
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) else None


def _run_tree(tree: Path, argv: list[str]) -> dict[str, Any]:
    """This benchmark as the checkout `tree` has it, in a child process of its own (its `proxy`, `addons` and
    `tests` first on the path): the figures it wrote to its bench/results/context.json."""
    out = tree / "bench" / "results" / "context.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, str(tree / "bench" / "bench_context.py"), *argv], cwd=tree, env=env, check=True)
    return json.loads(out.read_text())


def compare(baseline: Path, pairs: int, argv: list[str]) -> int:
    """Before (`baseline`, another checkout) and after (this tree) in one run, alternated: before, after, before,
    after… The same measurements, so the figures of a shared machine's noise are taken side by side."""
    runs: list[tuple[str, dict[str, Any]]] = []
    for i in range(pairs):
        for name, tree in (("before", baseline.resolve()), ("after", REPO)):
            print(f"== {name} r{i + 1}: {tree}", flush=True)
            runs.append((f"{name} r{i + 1}", _run_tree(tree, argv)))
    print(f"\nbefore: {baseline.resolve()}  after: {REPO}  (medians, ms; ratio = median of afters / median of befores)")
    rows = []
    for label, path in FIGURES:
        vals = [_figure(res, path) for _, res in runs]
        before = [v for (n, _), v in zip(runs, vals, strict=True) if n.startswith("before") and v is not None]
        after = [v for (n, _), v in zip(runs, vals, strict=True) if n.startswith("after") and v is not None]
        r = ratio(summarize(after).median, summarize(before).median) if before and after else None
        rows.append([label, *("" if v is None else f"{v:.2f}" for v in vals), "" if r is None else f"×{r:.3f}"])
    print_table(["figure", *(n for n, _ in runs), "after/before"], rows)
    write_result("context_vs_baseline", {"baseline": str(baseline.resolve()), "runs": runs})
    return 0


async def main_async(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    failed = False
    only = set(args.only.split(",")) if args.only else {"long", "projection", "checkpoint"}
    with tempfile.TemporaryDirectory(prefix="ctproxy-bench-context-") as tmp:
        if "long" in only:
            turns = args.turns or (200 if args.quick else 2000)
            result = await long_run(turns, Path(tmp) / "long", progress=True)
            results["long"] = print_long(result)
            failed |= bool(results["long"]["problems"])
        if "projection" in only:
            rounds = 10 if args.quick else 60
            results["projection"] = fig = await projection(rounds, 2 if args.quick else 5, Path(tmp) / "projection")
            print_projection(fig)
        if "checkpoint" in only:
            rounds = 8 if args.quick else 40
            results["checkpoint"] = ck = await checkpoint(rounds, 2 if args.quick else 4, Path(tmp) / "checkpoint")
            print_checkpoint(ck)
    results["load_after"] = os.getloadavg()
    write_result("context", results)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 turns and fewer rounds")
    parser.add_argument("--only", default="", help="comma-separated: long, projection, checkpoint")
    parser.add_argument("--turns", type=int, default=0, help="turns of the long run (default 2000; --quick 200)")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="another checkout (e.g. `git worktree add /tmp/bench-base <commit>`): run the same "
                             "measurements there and here, alternated, in this one invocation, and print the ratios")
    parser.add_argument("--pairs", type=int, default=2, help="before/after pairs with --baseline-tree (default 2)")
    args = parser.parse_args()
    if args.baseline_tree is not None:
        argv = [*(["--quick"] if args.quick else []), *(["--only", args.only] if args.only else []),
                *(["--turns", str(args.turns)] if args.turns else [])]
        return compare(args.baseline_tree, args.pairs, argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
