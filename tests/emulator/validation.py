"""The input rules the real Responses API enforces before it answers (pure; the app keeps the state).

Each rule answers with the exact error the API sends, `{"error": {"message", "type":
"invalid_request_error", "param", "code"}}`. The messages are quoted from real API answers reported
in public issues:

- a `function_call` with no `function_call_output` for its call id (400, param `input`, code null):
  "No tool output found for function call call_….", router-for-me/CLIProxyAPI#2368;
  the same for `custom_tool_call`: "No tool output found for custom tool call call_….",
  diegosouzapw/OmniRoute#8946;
- a `function_call_output` whose call is nowhere before it (400, param `input`, code null):
  "No tool call found for function call output with call_id call_….", continuedev/continue#10092,
  microsoft/vscode#320060; the custom-tool wording is the same sentence with "custom tool call output"
  (by analogy: no public report quotes it);
- a `reasoning` item without the item it preceded (400, param `input`, code null):
  "Item 'rs_…' of type 'reasoning' was provided without its required following item.",
  continuedev/continue#8933, #9628, openai/openai-node#1567;
- an unknown `previous_response_id` (400, param `previous_response_id`, code
  `previous_response_not_found`): "Previous response with id 'resp_…' not found.", maximhq/bifrost#2441,
  bigduu/Bamboo-agent#513 (a `store:false` response is never found: it was not persisted);
- an `item_reference` (or a reasoning item sent by id only, without `encrypted_content`) that names no
  stored item (404): "Item with id 'rs_…' not found. Items are not persisted when `store` is set to
  false. Try again with `store` set to true, or remove this item from your input.",
  can1357/oh-my-pi#41, anomalyco/opencode#7724.

Which item may follow a reasoning item: the output item the model produced right after it. The emulator
remembers that follower for every reasoning item it emitted (by id and call id); for reasoning it did not
emit (or a follower without ids) any output-kind item counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Tool calls whose output the client must send back, and the words the API uses for them.
CALL_OUTPUTS: dict[str, tuple[str, str]] = {
    "function_call": ("function_call_output", "function call"),
    "custom_tool_call": ("custom_tool_call_output", "custom tool call"),
}
OUTPUT_CALLS: dict[str, tuple[str, str]] = {out: (call, words) for call, (out, words) in CALL_OUTPUTS.items()}

# Items the model produces (what may follow a reasoning item); client-side items are messages of the
# user/system/developer and the *_output items.
_MODEL_ITEM_TYPES = frozenset({
    "function_call", "custom_tool_call", "web_search_call", "file_search_call", "computer_call",
    "code_interpreter_call", "image_generation_call", "local_shell_call", "shell_call", "apply_patch_call",
    "mcp_call", "mcp_list_tools", "mcp_approval_request", "tool_search_call", "reasoning",
})


@dataclass(frozen=True)
class InputError:
    status: int
    message: str
    param: str | None = "input"
    code: str | None = None


@dataclass(frozen=True)
class Follower:
    """The output item that came right after a reasoning item the emulator emitted."""

    item_id: str | None
    call_id: str | None


def item_type(item: Any) -> str | None:
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return kind if isinstance(kind, str) else None


def not_persisted(item_id: str, store: bool) -> InputError:
    msg = f"Item with id '{item_id}' not found."
    if not store:
        msg += (" Items are not persisted when `store` is set to false. Try again with `store` set to true, "
                "or remove this item from your input.")
    return InputError(404, msg)


def resolve_references(items: Sequence[Any], stored_items: Mapping[str, Mapping[str, Any]],
                       store: bool) -> tuple[list[Any], InputError | None]:
    """The input with `item_reference`s replaced by the stored items they name; reasoning sent by id only
    (no `encrypted_content`) must name a stored one too."""
    out: list[Any] = []
    for item in items:
        kind = item_type(item)
        if kind == "item_reference" or (isinstance(item, Mapping) and kind is None and set(item) == {"id"}):
            ref = item.get("id")
            found = stored_items.get(ref) if isinstance(ref, str) else None
            if found is None:
                return out, not_persisted(str(ref), store)
            out.append(found)
            continue
        if kind == "reasoning" and not item.get("encrypted_content"):
            rid = item.get("id")
            if isinstance(rid, str) and rid not in stored_items:
                return out, not_persisted(rid, store)
        out.append(item)
    return out, None


def _is_model_item(item: Any) -> bool:
    kind = item_type(item)
    if kind == "message":
        return item.get("role") == "assistant"
    return kind in _MODEL_ITEM_TYPES


def _follows(follower: Follower, item: Mapping[str, Any]) -> bool:
    """Whether `item` is the remembered follower (an item that carries no ids cannot be told apart)."""
    got_id, got_call = item.get("id"), item.get("call_id")
    if got_id is None and got_call is None:
        return True
    return (got_id is not None and got_id == follower.item_id) or (
        got_call is not None and got_call == follower.call_id)


def reasoning_problem(items: Sequence[Any], followers: Mapping[str, Follower]) -> InputError | None:
    """The first reasoning item of `items` not followed by its own following item."""
    for i, item in enumerate(items):
        if item_type(item) != "reasoning":
            continue
        nxt = items[i + 1] if i + 1 < len(items) else None
        ok = nxt is not None and _is_model_item(nxt)
        rid = item.get("id")
        if ok and isinstance(rid, str) and (known := followers.get(rid)) is not None:
            ok = _follows(known, nxt)  # type: ignore[arg-type]
        if not ok:
            where = f"Item '{rid}' of type" if isinstance(rid, str) else "Item of type"
            return InputError(400, f"{where} 'reasoning' was provided without its required following item.")
    return None


def tool_output_problem(chain: Sequence[Any], items: Sequence[Any], chain_known: bool) -> InputError | None:
    """A call in the chain or the input without its output, or an output whose call is nowhere before it.
    `chain_known=False` (a previous response the emulator no longer has) skips the orphan-output check."""
    pending: dict[tuple[str, str], str] = {}  # (call type, call_id) → call type, in order of appearance
    seen: set[tuple[str, str]] = set()
    for item in (*chain, *items):
        kind = item_type(item)
        if kind in CALL_OUTPUTS:
            call_id = str(item.get("call_id"))
            pending[(kind, call_id)] = kind
            seen.add((kind, call_id))
        elif kind in OUTPUT_CALLS:
            call_kind, words = OUTPUT_CALLS[kind]
            call_id = str(item.get("call_id"))
            if pending.pop((call_kind, call_id), None) is None and (call_kind, call_id) not in seen and chain_known:
                return InputError(400, f"No tool call found for {words} output with call_id {call_id}.")
    for (kind, call_id) in pending:
        return InputError(400, f"No tool output found for {CALL_OUTPUTS[kind][1]} {call_id}.")
    return None


def input_problem(chain: Sequence[Any], items: Sequence[Any], followers: Mapping[str, Follower],
                  chain_known: bool) -> InputError | None:
    """`chain`: the items of the previous responses (inputs and outputs, oldest first); `items`: this
    request's input with references resolved."""
    return reasoning_problem(items, followers) or tool_output_problem(chain, items, chain_known)


def followers_of(output: Sequence[Any]) -> dict[str, Follower]:
    """For each reasoning item of a response's output, the item right after it."""
    out: dict[str, Follower] = {}
    for i, item in enumerate(output):
        if item_type(item) != "reasoning" or not isinstance(item.get("id"), str) or i + 1 >= len(output):
            continue
        nxt = output[i + 1]
        out[item["id"]] = Follower(nxt.get("id"), nxt.get("call_id"))
    return out
