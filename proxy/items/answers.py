"""Which item answers which call (pure): the Responses API refuses an output whose call is not before it
in the same context, so whatever moves items between contexts (a rollover that drops
`previous_response_id`) keeps each output with its call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# output type → the call type it answers
OUTPUT_CALLS: Mapping[str, str] = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
    "computer_call_output": "computer_call",
    "local_shell_call_output": "local_shell_call",
    "shell_call_output": "shell_call",
    "apply_patch_call_output": "apply_patch_call",
    "tool_search_output": "tool_search_call",
}
ANSWERED_CALL_TYPES: tuple[str, ...] = tuple(dict.fromkeys(OUTPUT_CALLS.values()))


def answered_call(item: Any) -> tuple[str, str] | None:
    """(call type, call_id) of the call an output item answers; None for anything else."""
    if not isinstance(item, Mapping):
        return None
    kind = OUTPUT_CALLS.get(item.get("type"))  # type: ignore[arg-type]
    call_id = item.get("call_id")
    return (kind, call_id) if kind is not None and isinstance(call_id, str) and call_id else None


def call_key(item: Any) -> tuple[str, str] | None:
    """(call type, call_id) of a call item; None for anything else."""
    if not isinstance(item, Mapping) or item.get("type") not in ANSWERED_CALL_TYPES:
        return None
    call_id = item.get("call_id")
    return (str(item["type"]), call_id) if isinstance(call_id, str) and call_id else None
