"""The checkpoint turn (seed 000 "checkpoint fence 与换窗"), its pure parts: the request ctproxy sends
upstream before rolling a session over at the hard trigger or for a manual checkpoint, and what it
accepts from the answer.

The turn is the current window as it would be forwarded, plus the checkpoint instruction, with the write
tool for the agent's *own* notes required (`tool_choice: allowed_tools`, the tools left as they are), one call,
no stream.
The answer is accepted only when it holds exactly one call of that tool whose path is the agent's own
(a relative path, or an absolute one under `<agent>/notes/`): another agent's notes never lift the fence.

The write the proxy executed is journaled the way the bridge journals the calls it runs: one `mcp_call`
item (`server_label: "ctproxy"`, the tool's name, arguments, output or error), so the history tools find
the checkpoint note's write in the window it closed (`journal_record`). The agent never sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.items.bridged import mcp_item
from proxy.notes import paths as note_paths
from proxy.windows.notes.bootstrap import developer_message

WRITE_TOOL = "notes_write_file"
DEFAULT_INSTRUCTION = (
    "Context checkpoint: this context window is nearly full and a new one starts right after this. Call "
    f"{WRITE_TOOL} exactly once now to save a checkpoint note in your own notes (for example path "
    "checkpoint.md): what the task is, what is done, what remains, the decisions made, and the window and item "
    "ids worth re-reading. Do nothing else.")


# The turn narrows the choice to the write tool without touching `tools`: the tools are the head of the prompt
# the upstream caches, so replacing them would make the turn (and the window's cache) a miss (issue 47).
CHOICE = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": WRITE_TOOL}]}


def is_turn_choice(tool_choice: Any) -> bool:
    """The checkpoint turn's `tool_choice` (what a scripted upstream answers with the write)."""
    return tool_choice == CHOICE


def turn_body(forwarded: Mapping[str, Any], write_spec: Mapping[str, Any], instruction: str | None,
              extra: Sequence[Any] = ()) -> dict[str, Any]:
    """The checkpoint turn's request: `forwarded` (the window as the agent's request would go up), the
    instruction last, the own-notes write required by `allowed_tools`. `tools` and `instructions` stay as
    forwarded (the write tool appended only when they lack it) and the input only grows, so the turn extends
    the window's cached prefix. `extra`: a failed call and its output, for the one correction. A
    `previous_response_id` stays: the window of a client chaining by it is the upstream's chain (issue 29 (2));
    a stateless request has none."""
    inp = forwarded.get("input")
    items = list(inp) if isinstance(inp, list) else [{"role": "user", "content": inp}] if isinstance(inp, str) else []
    body = {k: v for k, v in forwarded.items() if k not in ("stream", "stream_options", "tool_choice",
                                                          "parallel_tool_calls")}
    body["input"] = [*items, developer_message(instruction or DEFAULT_INSTRUCTION), *extra]
    tools = forwarded.get("tools")
    tools = list(tools) if isinstance(tools, list) else []
    if not any(isinstance(t, Mapping) and t.get("type") == "function" and t.get("name") == WRITE_TOOL
               for t in tools):
        # the API's FunctionTool requires `strict` (the registry leaves it out when false)
        tools.append({**write_spec, "type": "function", "strict": bool(write_spec.get("strict", False))})
    body["tools"] = tools
    body["tool_choice"] = CHOICE
    body["parallel_tool_calls"] = False
    body["stream"] = False
    return body


@dataclass(frozen=True)
class WriteCall:
    call_id: str
    arguments: str
    item: dict[str, Any]  # the function_call item as answered (for the correction round)


def own_path(arguments: str, address: str) -> bool:
    try:
        args = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return False
    path = args.get("path") if isinstance(args, dict) else None
    if not isinstance(path, str) or not path:
        return False
    if not path.startswith("/"):
        return True  # relative: always the agent's own (the tool itself refuses a bad one, and is corrected)
    # The note path rules themselves (proxy/notes/paths.py), every valid address taken for an agent: a path that
    # could be another agent's (`/root/notes/notes/ck.md` is /root's for an agent named `notes`) is not own.
    try:
        ref = note_paths.parse(path, address, lambda _address: True)
    except note_paths.NotePathError:
        return False
    return ref.address == address


def write_call(answer: Mapping[str, Any]) -> tuple[WriteCall | None, str]:
    """The one own-notes write call of a held Responses answer, or None and why (a category)."""
    if answer.get("status") not in (None, "completed"):
        return None, "incomplete"
    calls = [o for o in answer.get("output") or [] if isinstance(o, dict) and o.get("type") == "function_call"]
    writes = [c for c in calls if c.get("name") == WRITE_TOOL]
    if len(writes) != 1 or len(calls) != 1:
        return None, "no_write" if not writes else "several_calls"
    c = writes[0]
    if not isinstance(c.get("call_id"), str) or not isinstance(c.get("arguments"), str):
        return None, "malformed"
    return WriteCall(c["call_id"], c["arguments"], c), "ok"


def not_own_text(address: str) -> str:
    """The refusal of a write outside the agent's own notes (not executed), for the one correction."""
    return (f"Refused: not executed. A checkpoint is accepted only in your own notes ({address.rstrip('/')}/notes/). "
            f"Call {WRITE_TOOL} again with a relative path such as checkpoint.md.")


def correction(call: WriteCall, error_text: str) -> list[dict[str, Any]]:
    """The failed call and its error, for the model's one chance to correct it."""
    item = {k: v for k, v in call.item.items() if k not in ("id", "status")}
    return [item, {"type": "function_call_output", "call_id": call.call_id, "output": error_text}]


def journal_record(call: WriteCall, output: str, is_error: bool) -> dict[str, Any]:
    """The executed write as the journal keeps it (the bridge's `mcp_call` form)."""
    return mcp_item(call.item, "failed" if is_error else "completed", None if is_error else output,
                    output if is_error else None)
