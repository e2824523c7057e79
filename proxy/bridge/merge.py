"""One response lifecycle out of several upstream rounds (pure; the floor is LiteLLM's fix for the same
problem, BerriAI/litellm#40118 / PR #40121).

Streaming (`MergedStream`, fed the upstream's events round by round):
- one `response.created` / `in_progress` (the first round's); later rounds' are dropped, and every
  round's terminal event is held back until the turn is over;
- `output_index` shifted so it keeps counting across rounds; `sequence_number` renumbered strictly
  increasing; the response id stays the first round's (the `openai` SDK refuses a lifecycle whose id
  changes: the agent's id is mapped to the upstream's last one in `items.BridgeMemory.aliases`);
- a bridged call is shown as an `mcp_call` item (added → arguments → in_progress → completed/failed →
  done), never as a call the agent should run;
- one final terminal event whose `output` lists every round's items and whose `usage` is the LAST round's:
  what the context window now holds (its input covers every earlier round's items), the number agents
  such as Pi and Codex read as their context size. What the turn cost (every round summed, `sum_usage`) is
  kept apart by the turn (`proxy.bridge.turn.TurnStats.usage`) for the journal, `/metrics`, the dashboard
  and the `x-ctp-turn-usage` header (`usage_header`; docs/bridge.md "Usage").
An event the merger would send on unchanged is not decoded at all (`MergedStream.block`): its bytes as
they came (`proxy.bridge.rawsse`) when it is plainly framed, its `type` is the event's name, and its
`sequence_number` is the next one. In the first round that is every event but the few the merger reads
(created / in_progress for the response id, each output item's added/done, the terminal event) and those of
a bridged call, so a round without a bridged call costs a byte scan per event; from the second round on,
`output_index` shifts and every event is decoded.

Not streaming: `merge_responses` builds the same merged `Response` object.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.bridge.rawsse import decode_block
from proxy.items.bridged import CALL_TYPES, mcp_arguments, mcp_id, mcp_item
from proxy.items.sse import SSEEvent

START_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued"})
HELD_TERMINALS = frozenset({"response.completed", "response.incomplete"})
FAIL_TERMINALS = frozenset({"response.failed", "error"})
# Output items an agent acts on: a round with one of these ends the turn (a mixed round).
AGENT_ACTION_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call", "shell_call", "computer_call",
                                "apply_patch_call", "mcp_approval_request"})
# Events the merger always decodes (their content decides something); the rest may pass as bytes.
_READ = frozenset(t.encode() for t in (*HELD_TERMINALS, *FAIL_TERMINALS, "response.output_item.added",
                                       "response.output_item.done"))
_START = frozenset(t.encode() for t in START_EVENTS)
# A bridged call's own events, rewritten into the mcp_call's while one is open in the round.
_CALL_EVENTS = frozenset({b"response.function_call_arguments.delta", b"response.function_call_arguments.done",
                          b"response.custom_tool_call_input.delta", b"response.custom_tool_call_input.done"})
_SEQ = re.compile(rb'"sequence_number":(\d+)[,}]')


def frame(typ: str, data: str | bytes) -> bytes:
    body = data.encode() if isinstance(data, str) else data
    return b"event: " + typ.encode() + b"\ndata: " + body + b"\n\n"


def sum_usage(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Every number added, nested details too; whatever only one side has is kept."""
    if not a:
        return dict(b) if b else None
    if not b:
        return dict(a)
    out: dict[str, Any] = dict(a)
    for k, v in b.items():
        mine = out.get(k)
        if isinstance(v, bool) or isinstance(mine, bool):
            out[k] = v
        elif isinstance(v, int | float) and isinstance(mine, int | float):
            out[k] = mine + v
        elif isinstance(v, Mapping) and isinstance(mine, Mapping):
            out[k] = sum_usage(mine, v)
        elif mine is None:
            out[k] = v
    return out


def is_bridged(item: Mapping[str, Any], names: frozenset[str]) -> bool:
    return item.get("type") in CALL_TYPES and item.get("name") in names and not item.get("namespace")


@dataclass
class PendingCall:
    """A bridged call of the current round."""

    shown_index: int
    item: dict[str, Any]  # the model's item (complete once `done`)
    done: bool = False

    @property
    def kind(self) -> str:
        return CALL_TYPES[str(self.item["type"])]

    @property
    def key(self) -> str:
        return mcp_id(self.kind, str(self.item.get("call_id", "")))


@dataclass
class RoundEnd:
    terminal: str  # response.completed | response.incomplete | response.failed | error | eof
    response: dict[str, Any] | None
    calls: list[PendingCall]
    agent_action: bool  # the round also has items the agent must act on
    data: str = ""  # the terminal event's data as received
    event: dict[str, Any] | None = None  # ... and decoded


@dataclass
class MergedStream:
    bridged: frozenset[str]
    on_call_ready: Callable[[PendingCall], None] = lambda _c: None
    seq: int = 0  # the next sequence_number
    round: int = 0
    offset: int = 0  # output_index shift of the current round
    _response_id: str | None = None  # the first round's: the one the agent sees throughout (`response_id`)
    _start_data: bytes | str | None = None  # the first start event's data, read for the id when it is needed
    shown: dict[int, dict[str, Any]] = field(default_factory=dict)  # output_index -> finished item (agent view)
    usage: dict[str, Any] | None = None  # the last round's (what the window holds; what the agent is shown)
    end: RoundEnd | None = None  # set when the current round's terminal event arrived
    _calls: dict[int, PendingCall] = field(default_factory=dict)  # the round's upstream output_index -> call
    _action: bool = False
    _max_index: int = -1

    @property
    def response_id(self) -> str | None:
        if self._response_id is None and self._start_data is not None:
            data, self._start_data = self._start_data, None
            try:
                resp = orjson.loads(data).get("response")
            except (orjson.JSONDecodeError, AttributeError):
                resp = None
            if isinstance(resp, dict) and isinstance(resp.get("id"), str):
                self._response_id = resp["id"]
        return self._response_id

    # ---- one upstream event -----------------------------------------------------------------------

    def block(self, raw: bytes | SSEEvent) -> list[bytes]:
        """One upstream event as its block of bytes (or decoded, see `rawsse`): the block itself when the
        merger would send it on unchanged, else what `event` makes of it."""
        if isinstance(raw, SSEEvent):
            return self.event(raw)
        if self._passes(raw):
            return [raw]
        return [out for ev in decode_block(raw) for out in self.event(ev)]

    def _passes(self, raw: bytes) -> bool:
        """`event: T` / `data: {"type":"T",…,"sequence_number":N}` / blank line, N the next number, nothing
        of T the merger must read or rewrite; counts it. Exactly what `event` would send, without decoding."""
        if self.offset or not raw.startswith(b"event: "):
            return False
        nl = raw.find(b"\n", 7)
        typ = raw[7:nl]
        if typ in _READ or (self._calls and typ in _CALL_EVENTS):
            return False
        start = typ in _START
        if start and self.round > 0:
            return False  # dropped: `event` does that
        data = nl + 7
        if raw[nl + 1:data] != b"data: " or raw.find(b"\n", data) != len(raw) - 2 \
                or not raw.startswith(b'{"type":"' + typ + b'"', data):
            return False
        m = _SEQ.search(raw, data)
        if m is None or int(m[1]) != self.seq or raw.find(b'"sequence_number":', m.end()) >= 0:
            return False
        if start and self._response_id is None and self._start_data is None:
            self._start_data = raw[data:-2]
        self.seq += 1
        return True

    def event(self, ev: SSEEvent) -> list[bytes]:
        try:
            data = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            return [] if ev.data.strip() == "[DONE]" else [frame(ev.event or "message", ev.data)]
        if not isinstance(data, dict):
            return []
        typ = str(data.get("type") or ev.event or "")
        if typ in START_EVENTS:
            if self.round > 0:
                return []
            resp = data.get("response")
            if isinstance(resp, dict) and self.response_id is None:
                self._response_id = resp.get("id")
            return [self._emit(typ, data, ev.data)]
        if typ in HELD_TERMINALS or typ in FAIL_TERMINALS:
            resp = data.get("response") if isinstance(data.get("response"), dict) else None
            if resp is not None and isinstance(resp.get("usage"), Mapping):
                self.usage = dict(resp["usage"])
            self.end = RoundEnd(typ, resp, list(self._calls.values()), self._action, ev.data, data)
            return []
        idx = data.get("output_index")
        call = self._calls.get(idx) if isinstance(idx, int) else None
        if typ == "response.output_item.added" and isinstance(data.get("item"), dict) and isinstance(idx, int):
            item = data["item"]
            shown = idx + self.offset
            self._max_index = max(self._max_index, shown)
            if is_bridged(item, self.bridged):
                call = self._calls[idx] = PendingCall(shown, dict(item))
                return [self._emit(typ, {**data, "output_index": shown, "item": mcp_item(item, "in_progress")})]
            if item.get("type") in AGENT_ACTION_TYPES:
                self._action = True
            return [self._emit(typ, self._shift(data), ev.data)]
        if call is not None:
            return self._call_event(typ, data, call)
        if typ == "response.output_item.done" and isinstance(data.get("item"), dict) and isinstance(idx, int):
            self.shown[idx + self.offset] = data["item"]
        return [self._emit(typ, self._shift(data), ev.data)]

    def _call_event(self, typ: str, data: dict[str, Any], call: PendingCall) -> list[bytes]:
        base = {"item_id": call.key, "output_index": call.shown_index}
        if typ == "response.function_call_arguments.delta":
            return [self._emit("response.mcp_call_arguments.delta", {**base, "delta": data.get("delta", "")})]
        if typ == "response.function_call_arguments.done":
            return [self._emit("response.mcp_call_arguments.done", {**base, "arguments": data.get("arguments", "")})]
        if typ == "response.custom_tool_call_input.done":
            args = mcp_arguments("custom", str(data.get("input", "")))
            return [self._emit("response.mcp_call_arguments.done", {**base, "arguments": args})]
        if typ == "response.output_item.done" and isinstance(data.get("item"), dict):
            call.item, call.done = dict(data["item"]), True
            self.on_call_ready(call)
            return [self._emit("response.mcp_call.in_progress", base)]
        return []  # custom input deltas and anything else of the call: the mcp_call has no such events

    # ---- the driver's steps -----------------------------------------------------------------------

    def call_finished(self, call: PendingCall, output: str | None, error: str | None) -> list[bytes]:
        item = mcp_item(call.item, "failed" if error is not None else "completed", output, error)
        self.shown[call.shown_index] = item
        base = {"item_id": call.key, "output_index": call.shown_index}
        done = "response.mcp_call.failed" if error is not None else "response.mcp_call.completed"
        return [self._emit(done, base),
                self._emit("response.output_item.done", {"output_index": call.shown_index, "item": item})]

    def next_round(self) -> None:
        self.round += 1
        self.offset = self._max_index + 1
        self.end = None
        self._calls, self._action = {}, False

    def output(self) -> list[dict[str, Any]]:
        return [self.shown[i] for i in sorted(self.shown)]

    def final(self, end: RoundEnd) -> bytes:
        """The one terminal event of the agent's response: every round's items, the last round's usage."""
        resp = dict(end.response or {})
        resp["id"] = self.response_id or resp.get("id")
        resp["output"] = self.output()
        if self.usage is not None:
            resp["usage"] = self.usage
        return self._emit(end.terminal if end.terminal != "eof" else "response.completed",
                          {"type": end.terminal, "response": resp})

    def passthrough_final(self, end: RoundEnd) -> bytes:
        """The first round had no bridged call: its terminal event as it came (renumbered if needed)."""
        return self._emit(end.terminal, end.event if end.event is not None else orjson.loads(end.data), end.data)

    def failure(self, end: RoundEnd) -> bytes:
        if end.terminal == "error" or end.response is None:
            return self._emit(end.terminal, end.event if end.event is not None else orjson.loads(end.data), end.data)
        resp = {**end.response, "id": self.response_id or end.response.get("id"), "output": self.output()}
        if self.usage is not None:
            resp["usage"] = self.usage
        return self._emit(end.terminal, {"type": end.terminal, "response": resp})

    def error_event(self, code: str, message: str, param: str | None = None) -> bytes:
        return self._emit("error", {"type": "error", "code": code, "message": message, "param": param})

    # ---- framing ----------------------------------------------------------------------------------

    def _shift(self, data: dict[str, Any]) -> dict[str, Any]:
        idx = data.get("output_index")
        return data if not self.offset or not isinstance(idx, int) else {**data, "output_index": idx + self.offset}

    def _emit(self, typ: str, data: dict[str, Any], raw: str | None = None) -> bytes:
        seq = self.seq
        self.seq += 1
        if raw is not None and data.get("sequence_number") == seq and data.get("type") == typ \
                and (not self.offset or "output_index" not in data):
            return frame(typ, raw)  # unchanged: the upstream's own bytes
        data = {**data, "type": typ, "sequence_number": seq}
        return frame(typ, orjson.dumps(data))


def merge_responses(first_id: str | None, rounds: Sequence[Mapping[str, Any]],
                    output: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The non-streaming merged Response: the last round's object (its usage: what the window holds) with the
    first id and all items."""
    last = dict(rounds[-1])
    last["id"] = first_id or last.get("id")
    last["output"] = list(output)
    return last


TURN_USAGE_HEADER = "x-ctp-turn-usage"


def usage_header(turn: Mapping[str, Any] | None, rounds: int) -> str | None:
    """The `x-ctp-turn-usage` header value: the turn's summed tokens and its rounds (no prompt, no id)."""
    if not turn:
        return None
    details = turn.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    parts = [f"{k}={int(turn[k])}" for k in ("input_tokens", "output_tokens", "total_tokens")
             if isinstance(turn.get(k), int | float) and not isinstance(turn.get(k), bool)]
    if isinstance(cached, int | float) and not isinstance(cached, bool):
        parts.append(f"cached_tokens={int(cached)}")
    parts.append(f"rounds={rounds}")
    return ", ".join(parts)
