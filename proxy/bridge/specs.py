"""Which bridged tools a request gets, in which form, and how they are appended (pure).

- Only the families the user bridged (`bridge.families`), only tools that can run (capability on, a
  workspace where needed); an agent's own tool of the same name always wins and the bridged one is left out.
- `apply_patch` is offered as the Lark `custom` tool to the models trained on it (GPT-5 family, what Codex
  offers them), else as a function; `bridge.apply_patch_form` overrides.
- One search path per turn: the sidecar `openai_web_search` only when `search_path` says `sidecar` (not on
  a turn that gets the hosted tool natively, nor with search off).
- Tool discovery on (`carried` given): only the names the session carries (`find_tools` and what it
  loaded; the other deferred tools are left out until a load, which shows in the next round's tools).
- Atomic groups are offered whole or not at all: `exec` with `wait`, `exec_command` with `write_stdin`
  (one answers with an ID only the other takes; an agent's own `wait` would get our `exec`'s cell IDs).
- An agent with its own `find_tools` keeps it, and ours cannot be offered: discovery then does not hold
  ctproxy's deferred tools back (nothing could load them), they are offered like the others.
- The specs go after the agent's own tools, in the registry's order, each spec's keys sorted: consecutive
  requests of a session serialize to the same bytes, so their prompt-cache prefix is shared.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.items.inputs import leading_additional_tools
from proxy.toolclient import BridgeTool

Form = Literal["function", "custom"]
CUSTOM_PATCH_MODELS = ("gpt-5*", "codex-*")
DISPLACED = "the agent has its own tool of that name"
DEFERRED = "deferred by tool discovery (find_tools loads it)"
OTHER_SEARCH = "this turn searches natively (web_search.backend), one search path per turn"
FIND_TOOLS = "find_tools"
ATOMIC_GROUPS: tuple[tuple[str, ...], ...] = (("exec", "wait"), ("exec_command", "write_stdin"))


@dataclass(frozen=True)
class Offer:
    tools: tuple[BridgeTool, ...]  # offered on this request, in order
    forms: Mapping[str, Form]  # name -> the form it was offered in
    specs: tuple[Mapping[str, Any], ...]  # the spec dicts appended
    left_out: tuple[tuple[str, str], ...]  # (name, why)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)

    def tool(self, name: str) -> BridgeTool | None:
        return next((t for t in self.tools if t.name == name), None)


def canonical(value: Any) -> Any:
    """The same JSON value with every object's keys sorted: one byte form, whatever the source's order."""
    if isinstance(value, Mapping):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def function_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The API's FunctionTool requires `strict` (the registry leaves it out when false)."""
    return {**spec, "strict": bool(spec.get("strict", False))}


def direct_only(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A bridged tool is called by the model itself, never from one of its programs (Programmatic Tool Calling:
    a program's call would wait on ctproxy's loop, which no test covers): `allowed_callers: ["direct"]`."""
    return {**spec, "allowed_callers": ["direct"]}


def agent_tool_names(tools: Any) -> set[str]:
    names: set[str] = set()
    for t in tools if isinstance(tools, list) else []:
        if not isinstance(t, Mapping):
            continue
        if isinstance(t.get("name"), str):
            names.add(t["name"])
        if t.get("type") == "apply_patch":  # the hosted apply_patch tool type
            names.add("apply_patch")
        if t.get("type") == "namespace" and isinstance(t.get("tools"), list):
            names |= agent_tool_names(t["tools"])
    return names


def patch_form(model: Any, setting: str) -> Form:
    if setting in ("function", "custom"):
        return setting  # type: ignore[return-value]
    name = model if isinstance(model, str) else ""
    return "custom" if any(fnmatch.fnmatch(name, g) for g in CUSTOM_PATCH_MODELS) else "function"


_SPECS: dict[tuple[int, str], tuple[BridgeTool, Mapping[str, Any]]] = {}


def _spec_of(tool: BridgeTool, form: Form) -> Mapping[str, Any]:
    """The canonical spec, made once per tool entry and form (the entries live as long as the process's
    copy of the registry): the same object, and so the same bytes, on every request."""
    key = (id(tool), form)
    hit = _SPECS.get(key)
    if hit is None or hit[0] is not tool:
        spec = canonical(direct_only(tool.custom if form == "custom" else function_spec(tool.function)))
        if len(_SPECS) > 4096:
            _SPECS.clear()
        _SPECS[key] = hit = (tool, spec)
    return hit[1]


def select(tools: Sequence[BridgeTool], families: Sequence[str], payload: Mapping[str, Any],
           apply_patch_form: str = "auto", ours: Sequence[Mapping[str, Any]] = (),
           carried: frozenset[str] | None = None, withheld: Mapping[str, str] | None = None) -> Offer:
    """`ours`: specs this transform already appended (idempotence: they are not the agent's tools);
    `carried`: tool discovery's names for this session (None: discovery off, no filter); `withheld`: names
    not offered on this request, with why (the sidecar search on a turn that searches natively)."""
    agent_tools = [t for t in payload.get("tools") or [] if t not in ours] \
        if isinstance(payload.get("tools"), list) else []
    # the agent's tools wherever it lists them: `tools`, or Codex's leading `additional_tools` items
    taken = agent_tool_names(agent_tools) | agent_tool_names(leading_additional_tools(payload))
    if carried is not None and FIND_TOOLS in taken:
        carried = None  # the agent's own find_tools: ours cannot load anything, so nothing is held back
    offered: list[BridgeTool] = []
    forms: dict[str, Form] = {}
    specs: list[Mapping[str, Any]] = []
    left: list[tuple[str, str]] = []
    wanted = set(families)
    for tool in tools:
        if tool.capability not in wanted and tool.family not in wanted:
            continue
        if not tool.available:
            left.append((tool.name, tool.reason or "cannot run here"))
            continue
        if tool.name in taken:
            left.append((tool.name, DISPLACED))
            continue
        if withheld and tool.name in withheld:
            left.append((tool.name, withheld[tool.name]))
            continue
        if carried is not None and tool.name not in carried:
            left.append((tool.name, DEFERRED))
            continue
        form: Form = "function"
        if tool.custom is not None and patch_form(payload.get("model"), apply_patch_form) == "custom":
            form = "custom"
        offered.append(tool)
        forms[tool.name] = form
        specs.append(_spec_of(tool, form))
    why = dict(left)
    for group in ATOMIC_GROUPS:
        present = [n for n in group if n in forms]
        if present and len(present) < len(group):
            missing = next(n for n in group if n not in forms)
            reason = f"offered only together with {missing}, which is not offered ({why.get(missing, 'not bridged')})"
            for name in present:
                index = next(i for i, t in enumerate(offered) if t.name == name)
                del offered[index], specs[index]
                del forms[name]
                left.append((name, reason))
    return Offer(tuple(offered), forms, tuple(specs), tuple(left))


def append_specs(payload: dict[str, Any], offer: Offer) -> dict[str, Any]:
    """The payload with the offer's specs after the agent's own tools; the same object when there is
    nothing to add or they are already there."""
    if not offer.specs:
        return payload
    tools = payload.get("tools")
    own = list(tools) if isinstance(tools, list) else []
    if own[len(own) - len(offer.specs):] == list(offer.specs):
        return payload
    return {**payload, "tools": [*own, *offer.specs]}


def replace_specs(payload: dict[str, Any], old: Offer, new: Offer) -> dict[str, Any]:
    """The payload with `old`'s appended specs swapped for `new`'s (a later round of a turn whose offer
    changed: a `find_tools` load); the same object when the specs are the same."""
    if old.specs == new.specs:
        return payload
    tools = payload.get("tools")
    own = [t for t in tools if not any(t is s or t == s for s in old.specs)] if isinstance(tools, list) else []
    return {**payload, "tools": [*own, *new.specs]}
