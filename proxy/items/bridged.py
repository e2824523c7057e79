"""Executed calls as the agent sees them, and the agent's next request made valid upstream again (pure,
over a `BridgeMemory`).

The agent sees an executed call as OpenAI's hosted-MCP item, `mcp_call` with `server_label` "ctproxy",
its arguments and its output (or error): a shape agents never execute (ADR 0007). The upstream must
see the call as it was made: the original `function_call` / `custom_tool_call` and its output, with
their call id, next to the reasoning item that preceded them. `repair_request` gets there whatever the
agent did with the item:
- resent (a stateless agent): each ctproxy `mcp_call` becomes the call + its output, in its place;
- dropped (an agent that keeps only what it knows): the calls are spliced back after the item that
  preceded them (or before the one that followed), from memory;
- a `previous_response_id` agent: the id it holds (the merged response's) maps to the upstream's last
  response of the turn, and outputs the upstream still awaits (a mixed round) go first in the input.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

SERVER_LABEL = "ctproxy"
MCP_PREFIX = "mcp_ctp"
CALL_TYPES = {"function_call": "function", "custom_tool_call": "custom"}
OUTPUT_TYPES = {"function": "function_call_output", "custom": "custom_tool_call_output"}


def mcp_id(kind: str, call_id: str) -> str:
    return f"{MCP_PREFIX}{kind[0]}_{call_id}"


def parse_mcp_id(item_id: Any) -> tuple[str, str] | None:
    """(kind, call_id) of an item id this module made, else None."""
    if not isinstance(item_id, str) or not item_id.startswith(MCP_PREFIX) or len(item_id) < len(MCP_PREFIX) + 3:
        return None
    tag, sep, call_id = item_id[len(MCP_PREFIX):].partition("_")
    kind = {"f": "function", "c": "custom"}.get(tag)
    return (kind, call_id) if kind and sep and call_id else None


def call_text(item: Mapping[str, Any]) -> str:
    return str(item.get("arguments", "") if item.get("type") == "function_call" else item.get("input", ""))


def mcp_arguments(kind: str, text: str) -> str:
    return text if kind == "function" else orjson.dumps({"input": text}).decode()


def mcp_error(text: str) -> dict[str, Any]:
    """A failed call's error in the API's shape (MCPToolCallError: an object, never a bare string)."""
    return {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": text}]}


def mcp_error_text(error: Any) -> str:
    """The text of an mcp_call's error as an agent resends it (the object above; a string from older ctproxy)."""
    if isinstance(error, str):
        return error
    if isinstance(error, Mapping):
        content = error.get("content")
        if isinstance(content, list):
            return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        if isinstance(error.get("message"), str):
            return error["message"]
        if content is not None:
            return str(content)
    return ""


def mcp_item(call: Mapping[str, Any], status: str, output: str | None = None, error: str | None = None) -> dict:
    """The item the agent sees. `output` and `error` are left out when there is none (both are optional in
    the OpenAPI description): clients resend items without their nulls (the openai SDK's exclude_none), and
    the journal must find a resent item to be the one it recorded, not a second item."""
    kind = CALL_TYPES[str(call["type"])]
    item: dict[str, Any] = {"type": "mcp_call", "id": mcp_id(kind, str(call.get("call_id", ""))),
                            "server_label": SERVER_LABEL, "name": call.get("name", ""),
                            "arguments": mcp_arguments(kind, call_text(call))}
    if output is not None:
        item["output"] = output
    if error is not None:
        item["error"] = mcp_error(error)
    item["status"] = status
    return item


def upstream_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """The call as it goes back upstream: as the model made it, without its item id (the call id links
    the output; an item id is refused when the upstream did not store the response)."""
    return {k: v for k, v in call.items() if k != "id" and k != "status"}


def output_item(kind: str, call_id: str, text: str, images: Sequence[str] = (),
                caller: Any = None) -> dict[str, Any]:
    """The call's output for the upstream; with images (data URLs) an array of an `input_text` part and
    `input_image` parts (the model sees the picture; `detail` is required by the API's schema). A call that
    carried a `caller` (Programmatic Tool Calling) gets it back on its output, as the API requires."""
    out: dict[str, Any]
    if not images:
        out = {"type": OUTPUT_TYPES[kind], "call_id": call_id, "output": text}
    else:
        parts: list[dict[str, Any]] = [{"type": "input_text", "text": text}] if text else []
        parts.extend({"type": "input_image", "image_url": url, "detail": "auto"} for url in images)
        out = {"type": OUTPUT_TYPES[kind], "call_id": call_id, "output": parts}
    if caller is not None:
        out["caller"] = caller
    return out


@dataclass
class ExecutedCall:
    call: dict[str, Any]  # the model's item, as the upstream sent it
    output: dict[str, Any]  # function_call_output / custom_tool_call_output
    after_id: str | None  # the id of the item shown just before it (a reasoning item, a message), if any
    before_id: str | None = None  # the id of the item shown just after it, if any (filled in later)

    @property
    def call_id(self) -> str:
        return str(self.call.get("call_id", ""))

    def pair(self) -> list[dict[str, Any]]:
        return [upstream_call(self.call), self.output]


@dataclass
class BridgeMemory:
    """What the bridge remembers of executed calls and merged responses, bounded (oldest dropped first).
    In the proxy's memory: a restart forgets it (resent `mcp_call` items are still rebuilt from themselves)."""

    limit: int = 20_000
    calls: OrderedDict[str, ExecutedCall] = field(default_factory=OrderedDict)  # by mcp item id
    after: OrderedDict[str, list[str]] = field(default_factory=OrderedDict)  # item id -> mcp ids following it
    before: OrderedDict[str, list[str]] = field(default_factory=OrderedDict)  # item id -> mcp ids preceding it
    aliases: OrderedDict[str, str] = field(default_factory=OrderedDict)  # merged response id -> upstream's last
    pending: OrderedDict[str, list[dict[str, Any]]] = field(default_factory=OrderedDict)  # merged id -> outputs

    def _put(self, table: OrderedDict, key: str, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.limit:
            table.popitem(last=False)

    def remember_call(self, executed: ExecutedCall) -> None:
        kind = CALL_TYPES[str(executed.call["type"])]
        key = mcp_id(kind, executed.call_id)
        self._put(self.calls, key, executed)
        if executed.after_id:
            self._put(self.after, executed.after_id, [*self.after.get(executed.after_id, []), key])

    def set_before(self, key: str, before_id: str) -> None:
        """Anchor an executed call before the item shown just after its run (`anchors_of` that item). Set
        whether or not it also follows an item: an agent that drops that one (a reasoning item) keeps the
        message after the call, and the pair goes back before it."""
        executed = self.calls.get(key)
        if executed is not None and key not in self.before.get(before_id, ()):
            executed.before_id = executed.before_id or before_id
            self._put(self.before, before_id, [*self.before.get(before_id, []), key])

    def remember_turn(self, shown_id: str, last_upstream_id: str, pending: Sequence[dict[str, Any]]) -> None:
        if shown_id and last_upstream_id and shown_id != last_upstream_id:
            self._put(self.aliases, shown_id, last_upstream_id)
        if pending:
            self._put(self.pending, shown_id, list(pending))


def _rebuild(item: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A resent mcp_call the memory does not know (a restart): the call and output from its own fields."""
    parsed = parse_mcp_id(item.get("id"))
    if parsed is None:
        return None
    kind, call_id = parsed
    args = str(item.get("arguments") or "")
    if kind == "function":
        call = {"type": "function_call", "call_id": call_id, "name": item.get("name", ""), "arguments": args}
    else:
        try:
            text = str(orjson.loads(args).get("input", ""))
        except (orjson.JSONDecodeError, AttributeError):
            text = args
        call = {"type": "custom_tool_call", "call_id": call_id, "name": item.get("name", ""), "input": text}
    out = item.get("output")
    text_out = out if isinstance(out, str) else mcp_error_text(item.get("error"))
    return [call, output_item(kind, call_id, text_out)]


def anchors_of(item: Any, scope: str | None = None) -> list[str]:
    """The names an item shown to the agent is found by when it is resent: its item id; a call's call id
    (agents that resend calls without their item id); within one conversation (`scope`: its session key),
    an assistant message's text (agents that resend messages as `{"role": "assistant", "content": "…"}`,
    without id). The text is never an anchor across conversations: another one's "ok" must not get this
    one's tool result."""
    if not isinstance(item, Mapping):
        return []
    out: list[str] = []
    if isinstance(iid := item.get("id"), str) and iid:
        out.append(iid)
    if item.get("type") in CALL_TYPES and item.get("call_id"):
        out.append(f"call:{item['call_id']}")
    if item.get("type", "message") == "message" and item.get("role") == "assistant":
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        if isinstance(content, str) and content and scope:
            digest = hashlib.sha256(f"{scope}\x00{content}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
            out.append("text:" + digest)
    return out


def _is_ours(item: Any) -> bool:
    return isinstance(item, Mapping) and item.get("type") == "mcp_call" and parse_mcp_id(item.get("id")) is not None


def repair_input(items: Sequence[Any], memory: BridgeMemory, scope: str | None = None) -> list[Any] | None:
    """The input with ctproxy's mcp_call items turned back into calls + outputs and dropped executed calls
    spliced back; None when nothing needed changing."""
    changed = False
    out: list[Any] = []
    present: set[str] = {str(i.get("call_id")) for i in items
                         if isinstance(i, Mapping) and i.get("type") in CALL_TYPES and i.get("call_id")}
    for item in items:
        if _is_ours(item):
            known = memory.calls.get(item["id"])
            pair = known.pair() if known is not None else _rebuild(item)
            if pair is not None:
                out.extend(pair)
                present.add(str(pair[0].get("call_id")))
                changed = True
                continue
        out.append(item)
    if memory.after or memory.before:
        spliced: list[Any] = []
        for item in out:
            iid = item.get("id") if isinstance(item, Mapping) else None
            for anchor in anchors_of(item, scope) if memory.before else ():
                for key in memory.before.get(anchor, ()):
                    executed = memory.calls.get(key)
                    if executed is not None and executed.call_id not in present:
                        spliced.extend(executed.pair())
                        present.add(executed.call_id)
                        changed = True
            spliced.append(item)
            if isinstance(iid, str) and iid in memory.after:
                for key in memory.after[iid]:
                    executed = memory.calls.get(key)
                    if executed is not None and executed.call_id not in present:
                        spliced.extend(executed.pair())
                        present.add(executed.call_id)
                        changed = True
        out = spliced
    return out if changed else None


def repair_request(payload: dict[str, Any], memory: BridgeMemory, scope: str | None = None) -> dict[str, Any]:
    """The agent's next request, valid upstream; the same object when nothing needed changing. `scope`: the
    request's session key (messages resent without id are found by their text within it)."""
    result = payload
    prev = payload.get("previous_response_id")
    if isinstance(prev, str) and (prev in memory.aliases or prev in memory.pending):
        pending = memory.pending.get(prev, [])
        inp = payload.get("input")
        items = [{"role": "user", "content": inp}] if isinstance(inp, str) else list(inp or [])
        answered = {str(i.get("call_id")) for i in items if isinstance(i, Mapping) and i.get("type") in
                    ("function_call_output", "custom_tool_call_output")}
        extra = [p for p in pending if str(p.get("call_id")) not in answered]
        result = {**payload, "previous_response_id": memory.aliases.get(prev, prev), "input": [*extra, *items]}
    inp = result.get("input")
    if isinstance(inp, list):
        fixed = repair_input(inp, memory, scope)
        if fixed is not None:
            result = {**result, "input": fixed}
    return result
