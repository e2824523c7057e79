"""Native web search (seed 004 §5.1): add the hosted `web_search` tool and ask for its sources.

`decide_native` says whether a request may get the tool (structural conditions only, no model
allowlist); `inject_web_search` is the pure payload transform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from proxy.config import WebSearchConfig

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


@dataclass(frozen=True)
class Decision:
    apply: bool
    reason: str  # a category: native | off | sidecar | route | input_tokens | not_responses


def is_web_search_tool(tool: Any) -> bool:
    return isinstance(tool, dict) and isinstance(tool.get("type"), str) and bool(
        _WEB_SEARCH_TYPE.match(tool["type"])
    )


def decide_native(cfg: WebSearchConfig, route_eligible: bool, last_input_tokens: int | None) -> Decision:
    """Whether this request gets native search. `auto` means native on an official route only."""
    if not cfg.enabled or cfg.backend == "off":
        return Decision(False, "off")
    if cfg.backend == "sidecar":
        return Decision(False, "sidecar")
    if not route_eligible:
        return Decision(False, "route")
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
    need_tool = not any(is_web_search_tool(t) for t in tools or [])
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
    """(`active`|`deferred`|`unavailable`|`off`, reason) for `ctproxy status`."""
    if not cfg.enabled or cfg.backend == "off":
        return "off", "web_search.backend is off"
    if cfg.backend == "sidecar":
        return "deferred", "backend 'sidecar': the sidecar tool is not available in this version"
    if upstream_official or upstream_trusted:
        return "active", f"native search on official routes (mode {cfg.mode})"
    if cfg.backend == "native":
        return "unavailable", "backend 'native' needs an official (or --trust-upstream) route"
    return "deferred", "auto: this upstream is not official; search there is the sidecar's job (not yet available)"
