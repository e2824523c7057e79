"""The `[id: …]` projection (seed 000 "提示词角色与 ID 注入"; pure; forwarded copy only).

Recoverable non-assistant items — user/system/developer messages and tool outputs — get a marker
with their real journal item id (what `history_read_item` takes), so the model can re-read them after
a reset. Ids come from the journal, matched to the input by position (`item_ids[i]` is the journal id
of `items[i]`, None where it has none: bootstrap and guidance messages, items the journal did not
record): never made up. The marker is added beside the content, never into it:

- a message gets one extra `input_text` part in front, `[id: it_…]` (a string content becomes the
  equivalent one-part list first); the agent's own parts, images included, are untouched;
- a tool output string gets the line `[id: it_…]` before it; a list output gets the part in front;
  `call_id` and every other field are kept as they are.

Idempotent: an item that already carries a marker (from an earlier pass) gets it replaced by the
current id, never a second one. Unknown fields survive (the item is copied, only `content`/`output`
change). The journal never sees this copy: it records the agent's own items.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

MARKER = "[id: {}]"
_MARKER_RE = re.compile(r"\[id: [A-Za-z0-9_.:-]{1,128}\]")
_LINE_RE = re.compile(r"\[id: [A-Za-z0-9_.:-]{1,128}\]\n")
_VALID_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MESSAGE_ROLES = frozenset({"user", "system", "developer"})
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output", "computer_call_output",
                          "local_shell_call_output", "shell_call_output", "apply_patch_call_output"})


def marker(item_id: str) -> str:
    return MARKER.format(item_id)


def _marker_part(item_id: str) -> dict[str, Any]:
    return {"type": "input_text", "text": marker(item_id)}


def _is_marker_part(part: Any) -> bool:
    return (isinstance(part, dict) and part.get("type") == "input_text" and isinstance(part.get("text"), str)
            and _MARKER_RE.fullmatch(part["text"]) is not None and len(part) == 2)


def recoverable(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    typ = item.get("type", "message")
    if typ == "message":
        return item.get("role") in MESSAGE_ROLES and isinstance(item.get("content"), (str, list))
    return typ in OUTPUT_TYPES and isinstance(item.get("output"), (str, list))


def project_item(item: Any, item_id: str | None) -> Any:
    """The item with its marker, or the same object when it gets none."""
    if item_id is None or not _VALID_ID.fullmatch(item_id) or not recoverable(item):
        return item
    want = marker(item_id)
    if item.get("type", "message") == "message":
        content = item["content"]
        parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else list(content)
        if parts and _is_marker_part(parts[0]):
            if parts[0]["text"] == want:
                return item
            parts = parts[1:]
        return {**item, "content": [_marker_part(item_id), *parts]}
    output = item["output"]
    if isinstance(output, str):
        if output.startswith(want + "\n"):
            return item
        m = _LINE_RE.match(output)
        body = output[m.end():] if m else output
        return {**item, "output": f"{want}\n{body}"}
    parts = list(output)
    if parts and _is_marker_part(parts[0]):
        if parts[0]["text"] == want:
            return item
        parts = parts[1:]
    return {**item, "output": [_marker_part(item_id), *parts]}


def project_ids(items: Sequence[Any], item_ids: Sequence[str | None], enabled: bool = True) -> Sequence[Any]:
    """`items` with markers (a new list), or `items` itself when the switch is off or nothing changes.
    `item_ids` must be as long as `items`: a mismatch means the caller's mapping is wrong, and no id
    is shown rather than a wrong one."""
    if not enabled or len(item_ids) != len(items):
        return items
    out = [project_item(item, item_id) for item, item_id in zip(items, item_ids, strict=True)]
    if all(a is b for a, b in zip(out, items, strict=True)):
        return items
    return out


def project_payload(payload: dict[str, Any], item_ids: Sequence[str | None], enabled: bool = True) -> dict[str, Any]:
    """The payload transform: same object when it does not apply; else a copy with `input` projected
    (a string input is one user message the journal recorded: it is projected as that message)."""
    inp = payload.get("input")
    if not enabled or inp is None:
        return payload
    items: Sequence[Any] = [{"role": "user", "content": inp}] if isinstance(inp, str) else inp
    if not isinstance(items, list):
        return payload
    projected = project_ids(items, item_ids, enabled)
    if projected is items:
        return payload
    return {**payload, "input": projected}
