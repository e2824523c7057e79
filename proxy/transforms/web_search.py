"""Native web search (seed 004 §5.1): add the hosted `web_search` tool and ask for its sources.

`decide_native` says whether a request may get the tool (structural conditions only, no model
allowlist); `inject_web_search` is the pure payload transform. `web_search.backend` picks the path before
the request (`search_path`): `auto` is native on an eligible route, else the sidecar `openai_web_search`
tool when an executor is configured; at most one path per turn, never a fallback after an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from proxy.config import WebSearchConfig
from proxy.items.inputs import leading_additional_tools
from proxy.routes import GATEWAY_KEY_ENV

SOURCES_INCLUDE = "web_search_call.action.sources"
# web_search, web_search_preview and their dated variants (web_search_2025_08_26, …).
_WEB_SEARCH_TYPE = re.compile(r"^web_search(?:_preview)?(?:_\d{4}_\d{2}_\d{2})?$")


@dataclass(frozen=True)
class WebSearchSettings:
    mode: Literal["live", "cached"] = "live"
    context_size: Literal["low", "medium", "high"] | None = None

    @classmethod
    def from_config(cls, cfg: WebSearchConfig) -> WebSearchSettings:
        return cls(cfg.mode, cfg.context_size)

    def tool_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"type": "web_search"}
        if self.mode == "cached":
            spec["external_web_access"] = False
        if self.context_size:
            spec["search_context_size"] = self.context_size
        return spec


SIDECAR_TOOL = "openai_web_search"


@dataclass(frozen=True)
class Decision:
    apply: bool
    # a category: native | off | client_off | sidecar | route | input_tokens | tool_choice_none | tool_choice |
    # name_conflict | not_responses
    reason: str


def search_path(cfg: WebSearchConfig, route_eligible: bool) -> Literal["native", "sidecar", "off"]:
    """The one search path of a turn, decided before the request (the bridge offers the sidecar tool only
    when this says `sidecar`)."""
    if not cfg.enabled or cfg.backend == "off":
        return "off"
    if cfg.backend == "native":
        return "native" if route_eligible else "off"
    if cfg.backend == "sidecar":
        return "sidecar"
    if route_eligible:
        return "native"
    return "sidecar" if cfg.sidecar_exposed(False) else "off"


SWITCH_HEADER = "x-ctp-web-search"  # per request: `off` (no injection for this request) or `on` (as configured)
SWITCH_VALUES = ("off", "on")
CONFLICT_NAME = "web_search"  # a client tool of this name beside the hosted tool: a conflict (seed 004 §5.1)


def client_tools(payload: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """Every tool the client offers, as (namespace, tool): the top-level `tools`, the members of a
    `namespace` tool (Codex puts its MCP servers' tools in `{"type": "namespace", "name": "mcp__…"}`), and
    the tools of leading `additional_tools` input items (and their namespaces)."""
    tools = payload.get("tools")
    listed = [*(tools if isinstance(tools, list) else []), *leading_additional_tools(payload)]
    out: list[tuple[str | None, dict[str, Any]]] = []
    for t in listed:
        if not isinstance(t, dict):
            continue
        if t.get("type") == "namespace" and isinstance(members := t.get("tools"), list):
            ns = t.get("name") if isinstance(t.get("name"), str) else ""
            out.extend((ns, m) for m in members if isinstance(m, dict))
        else:
            out.append((None, t))
    return out


def has_sidecar_tool(payload: dict[str, Any]) -> bool:
    """The request already offers the sidecar tool: at the top level (over MCP a name may carry a namespace
    prefix), inside a namespace tool, or in a leading `additional_tools` item."""
    for _, t in client_tools(payload):
        if t.get("type") in ("function", None) and isinstance(name := t.get("name"), str) \
                and (name == SIDECAR_TOOL or name.endswith("__" + SIDECAR_TOOL) or name.endswith("." + SIDECAR_TOOL)):
            return True
    return False


def has_name_conflict(payload: dict[str, Any]) -> bool:
    """A client tool of its own (function or custom, not in a namespace) named `web_search`: the hosted
    tool of the same name beside it would leave the model two tools by one name."""
    return any(ns is None and t.get("type") in ("function", "custom", None) and t.get("name") == CONFLICT_NAME
               for ns, t in client_tools(payload))


def tool_choice_none(payload: dict[str, Any]) -> bool:
    """`tool_choice: "none"`: the model may call no tool, so a hosted tool could only cost tokens."""
    return payload.get("tool_choice") == "none"


def tool_choice_kept_by_injection(payload: dict[str, Any]) -> bool:
    """Whether adding the hosted tool leaves the client's `tool_choice` meaning what it meant: yes for none
    given and `"auto"` (the seed's native path), and for a choice of the hosted web search itself. Not for
    `"required"` (a web search alone would meet it instead of the client's function), a named tool (the
    hosted tool could never be used), or `allowed_tools` (the hosted tool is not among them)."""
    choice = payload.get("tool_choice")
    if choice is None or choice == "auto":
        return True
    return isinstance(choice, dict) and is_web_search_tool(choice)


def is_web_search_tool(tool: Any) -> bool:
    return isinstance(tool, dict) and isinstance(tool.get("type"), str) and bool(
        _WEB_SEARCH_TYPE.match(tool["type"])
    )


def decide_native(cfg: WebSearchConfig, route_eligible: bool, last_input_tokens: int | None,
                  payload: dict[str, Any] | None = None, switch: str | None = None) -> Decision:
    """Whether this request gets native search. `auto` means native on an eligible route only, unless the
    request already offers the sidecar tool (its turn has its search path: one per turn). `switch`: the
    client's `x-ctp-web-search` (`off`: not for this request)."""
    if not cfg.enabled or cfg.backend == "off":
        return Decision(False, "off")
    if switch == "off":
        return Decision(False, "client_off")
    if cfg.backend == "sidecar":
        return Decision(False, "sidecar")
    if not route_eligible:
        return Decision(False, "route")
    if payload is not None and tool_choice_none(payload):
        return Decision(False, "tool_choice_none")
    if payload is not None and not tool_choice_kept_by_injection(payload):
        return Decision(False, "tool_choice")
    if payload is not None and not any(is_web_search_tool(t) for _, t in client_tools(payload)):
        if has_name_conflict(payload):
            return Decision(False, "name_conflict")
        # One Toolkit search path per turn. (With backend `native` the tool server offers no sidecar: a tool of
        # that name is not a Toolkit path, and the forced native path stays.)
        if cfg.backend == "auto" and has_sidecar_tool(payload):
            return Decision(False, "sidecar")
    # Hosted search accepts at most 128k input tokens; over it the request would fail upstream.
    if last_input_tokens is not None and last_input_tokens > cfg.max_input_tokens:
        return Decision(False, "input_tokens")
    return Decision(True, "native")


def inject_web_search(payload: dict[str, Any], settings: WebSearchSettings) -> dict[str, Any]:
    """Add `{type: web_search}` unless the client has a web search tool, and merge the sources include.

    The client's own tool definition is never rewritten; `tool_choice` and every other field stay
    as they are. Returns `payload` itself when nothing needs to change (also when `tools` or
    `include` have a shape this code does not understand).
    """
    tools = payload.get("tools")
    include = payload.get("include")
    if (tools is not None and not isinstance(tools, list)) or (
        include is not None and not isinstance(include, list)
    ):
        return payload
    need_tool = not any(is_web_search_tool(t) for _, t in client_tools(payload))
    need_include = SOURCES_INCLUDE not in (include or [])
    if not need_tool and not need_include:
        return payload
    new = dict(payload)
    if need_tool:
        new["tools"] = [*(tools or []), settings.tool_spec()]
    if need_include:
        new["include"] = [*(include or []), SOURCES_INCLUDE]
    return new


def native_status(cfg: WebSearchConfig, upstream_official: bool, upstream_trusted: bool) -> tuple[str, str]:
    """(`active`|`unavailable`|`off`, reason) for `ctproxy status`: what really happens on this upstream."""
    if not cfg.enabled:
        return "off", "web_search.enabled is false (ctproxy config set web_search.enabled true)"
    if cfg.backend == "off":
        return "off", "web_search.backend is off (ctproxy config set web_search.backend auto)"
    if cfg.backend == "sidecar":
        return "off", "backend 'sidecar': no native injection (see sidecar_search)"
    where = ("official routes (api.openai.com/v1, chatgpt.com/backend-api/codex)" if upstream_official else
             "the trusted non-official upstream (--trust-upstream): injected there as on an official route; it "
             "must serve hosted web_search itself")
    if upstream_official or upstream_trusted:
        return "active", (
            f"backend {cfg.backend}: native search injected on {where} (web_search.enabled is on), each search "
            f"billed as hosted web search (mode {cfg.mode}); one Toolkit search path per turn: not beside the sidecar "
            f"openai_web_search (top level, in a namespace or additional_tools); not with a tool_choice other than "
            f"auto; skipped above {cfg.max_input_tokens} input tokens; conflict warning: a client tool named "
            f"web_search is left alone and its requests get no injection; a client turns it off with "
            f"{SWITCH_HEADER}: off (ctproxy codex-config --web-search off)")
    if cfg.backend == "native":
        return "unavailable", "backend 'native' needs an official (or --trust-upstream) route"
    if cfg.sidecar_exposed(False):
        return "active", "auto: this upstream is not official, so no native injection; the sidecar tool searches"
    return "unavailable", ("auto: this upstream is not official and no sidecar executor is set "
                           "(ctproxy config set web_search.sidecar_model MODEL)")


def credentials_statement(upstream_official: bool, upstream_trusted: bool, endpoint: str) -> str:
    """Which credentials and backend a credentialed tool (image, sidecar) would use, for `ctproxy status`."""
    if upstream_official:
        return (f"credentials: the calling session's latest through ctproxy (API key → api.openai.com/v1/{endpoint}, "
                f"ChatGPT sign-in → chatgpt.com/backend-api/codex/{endpoint}), else OPENAI_API_KEY (API key)")
    if upstream_trusted:
        return (f"credentials: the calling session's latest API key through ctproxy (or {GATEWAY_KEY_ENV}), sent "
                f"to the trusted upstream's …/{endpoint}, never a ChatGPT sign-in; else OPENAI_API_KEY "
                "(api.openai.com/v1)")
    return ("credentials: OPENAI_API_KEY only (api.openai.com/v1): a session's credentials are never taken "
            "from requests to an untrusted upstream")


def sidecar_status(cfg: WebSearchConfig, upstream_official: bool, upstream_trusted: bool) -> tuple[str, str]:
    """The sidecar path's line in `ctproxy status` (its switch is web_search.backend)."""
    if not cfg.enabled:
        return "off", "web_search.enabled is false (the sidecar is web_search's other path)"
    if cfg.backend in ("off", "native"):
        return "off", f"web_search.backend is {cfg.backend}"
    eligible = upstream_official or upstream_trusted
    if cfg.sidecar_model is None:
        if cfg.backend == "sidecar":
            return "unavailable", ("backend 'sidecar' needs an executor: "
                                   "ctproxy config set web_search.sidecar_model MODEL")
        return "off", "auto without an executor (set web_search.sidecar_model to offer openai_web_search)"
    if not cfg.sidecar_exposed(eligible):
        return "off", ("auto searches natively on this upstream, so openai_web_search is not listed (one search "
                       "path per turn; ctproxy config set web_search.backend sidecar to use the sidecar instead)")
    effort = "" if cfg.sidecar_effort == "auto" else f", effort {cfg.sidecar_effort}"
    when = "" if cfg.backend == "sidecar" else " (auto: this upstream is not official; an agent that has it " \
                                               "gets no native injection)"
    return "active", (f"openai_web_search via {cfg.sidecar_model}{effort}{when}; each call is a separate billed "
                      "request with hosted search; " + credentials_statement(upstream_official, upstream_trusted,
                                                                            "responses"))
