"""The one tool registry: the bridge, MCP, REST, find_tools and `ctproxy status` all read it.

A tool is a typed async executor plus its Responses-format function spec. Arguments are
validated by the tool's pydantic model (extra fields forbidden) before any effect.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from proxy.config import Config
from proxy.errors import CtproxyError
from proxy.state import StateDir
from proxy.store.embedded import EmbeddedStore
from proxy.store.interface import Store
from proxy.upstream import UpstreamTurns
from tools_server.credentials import SessionCredentials, UpstreamAccess

log = logging.getLogger("ctproxy.tools")


class ToolError(CtproxyError):
    """An error the model sees: short, says what was wrong and what to do instead."""

    def __init__(self, message: str, code: str = "invalid_arguments", details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details or {}


@dataclass
class ImageContent:
    data_base64: str
    mime_type: str


@dataclass
class ToolResult:
    text: str
    details: dict[str, Any] = field(default_factory=dict)
    is_error: bool = False
    images: list[ImageContent] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": not self.is_error, "text": self.text, "details": self.details}
        if self.images:
            out["images"] = [{"mime_type": i.mime_type, "data": i.data_base64} for i in self.images]
        return out

    def structured(self) -> dict[str, Any] | None:
        """What MCP clients get as `structuredContent`. Some (Codex CLI) hand only that to the model, so
        it carries the text the model is meant to read too: `{"ok": true, "output": <text>, ...details}`,
        or for an error `{"ok": false, "error": <code>, "message": <text>, ...}`. Without it Codex showed
        the model `history_list_items`' counts but not the items."""
        if not self.is_error:
            return {"ok": True, "output": self.text,
                    **{k: v for k, v in self.details.items() if k not in ("ok", "output")}}
        return {"ok": False, "error": self.details.get("error", "tool_failed"), "message": self.text,
                **{k: v for k, v in self.details.items() if k not in ("ok", "error", "message")}}

    @classmethod
    def from_error(cls, exc: ToolError) -> ToolResult:
        return cls(text=exc.message, details={"error": exc.code, **exc.details}, is_error=True)


@dataclass
class Services:
    """What executors may use: configuration, the state directory, the workspace root.

    `workspace` is the directory file and shell tools may change, given explicitly (`--workspace`);
    None means there is none, and those tools refuse with an error saying how to set one."""

    config: Config
    state: StateDir
    workspace: Path | None
    extras: dict[str, Any] = field(default_factory=dict)
    # Image generation and sidecar search: each session's latest credentials as the proxy handed them over
    # (memory only, tools_server/credentials.py), and the upstream-turn service they send through.
    session_credentials: SessionCredentials = field(default_factory=SessionCredentials, repr=False)
    upstream_turns: UpstreamTurns = field(default_factory=UpstreamTurns, repr=False)
    # The upstream the proxy in front sends model requests to (`ctproxy up` passes it): judges which
    # capabilities can work here (proxy.app.status), as `ctproxy status` does. Official unless told otherwise.
    upstream_official: bool = True
    upstream_trusted: bool = False
    # The state store (proxy/store/interface.py) the notes and context tools call: None means the embedded store
    # of `state` (SQLite and note files), opened on first use.
    store: Store | None = field(default=None, repr=False)

    def state_store(self) -> Store:
        if self.store is None:
            self.store = EmbeddedStore(self.state)
        return self.store


# What a person answered to one yes/no question asked through the calling client (MCP elicitation's actions).
ConfirmAnswer = Literal["accept", "decline", "cancel"]

# The road a call came by (tools_server/service.py): REST, MCP, the proxy's bridge, Codex's backend routes,
# a code-mode cell's nested call, or a direct call in-process (tests, benchmarks).
Transport = Literal["rest", "mcp", "bridge", "codex", "cell", "direct"]


@dataclass
class CallContext:
    """Who is calling and from where. `task`/`agent` come from x-ctp-task / x-ctp-agent."""

    services: Services
    task: str | None = None
    agent: str | None = None
    session: str | None = None
    window: str | None = None
    call_id: str | None = None
    cwd: Path | None = None
    transport: Transport = "direct"
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    upstream: UpstreamAccess | None = field(default=None, repr=False)  # bridge only: see UpstreamAccess
    # Asks the person behind the calling client one question (MCP clients that declared elicitation:
    # tools_server/computer_use/approval.py, mcp_confirm_for); None where nobody can be asked (REST, bridge).
    confirm: Callable[[str], Awaitable[ConfirmAnswer]] | None = field(default=None, repr=False)
    cell_id: str | None = None  # a code-mode nested call: the cell that made it
    # Set when the caller stops waiting while the work may live on (a code cell that ended): a shell call
    # then returns at once without reading its session, which stays for write_stdin (nothing is lost).
    detach: asyncio.Event | None = field(default=None, repr=False)
    # A last check the caller's road adds, run after the policy seam and right before the tool (code mode:
    # a person approves a nested patch); it raises ToolError to refuse. Given the tool and its arguments.
    gate: Callable[[Tool, Any], Awaitable[None]] | None = field(default=None, repr=False)
    # What the policy seam's context() hook gave this call (tools_server/service.py): the shell spawn's env.
    env_overlay: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def workspace(self) -> Path | None:
        return self.services.workspace


Executor = Callable[[Any, CallContext], Awaitable[ToolResult]]
# What the policy seam is told of a call beyond its caller (tools_server/service.py): `cwd`, `session_id`.
PolicyFacts = Callable[[Any, CallContext], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    family: str
    capability: str  # the config section whose `enabled` switch turns it on
    args_model: type[BaseModel]
    execute: Executor
    parameters: dict[str, Any] | None = None  # explicit JSON Schema (e.g. Codex's exact one)
    strict: bool = False
    parallel: bool = True
    custom_format: dict[str, Any] | None = None  # Responses `custom` tool format (grammar)
    read_only: bool = False  # changes nothing (MCP `readOnlyHint`); the one place this is declared
    policy_facts: PolicyFacts | None = None

    def json_schema(self) -> dict[str, Any]:
        if self.parameters is not None:
            return self.parameters
        schema = self.args_model.model_json_schema()
        schema.setdefault("additionalProperties", False)
        return schema

    def function_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.json_schema(),
        }
        if self.strict:
            spec["strict"] = True
        return spec

    def custom_spec(self) -> dict[str, Any] | None:
        if self.custom_format is None:
            return None
        return {"type": "custom", "name": self.name, "description": self.description,
                "format": self.custom_format}

    def validate(self, arguments: Any) -> BaseModel:
        if not isinstance(arguments, dict):
            raise ToolError(f"{self.name}: arguments must be a JSON object")
        if (where := _lone_surrogate(arguments)) is not None:
            # JSON can spell one (\ud800), but no file name, database or process can take it
            raise ToolError(f"{self.name}: {where} is not valid Unicode (it has a lone surrogate); send UTF-8 text")
        try:
            return self.args_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(f"{self.name}: {describe_validation(exc)}") from exc

    async def call(self, arguments: Any, ctx: CallContext) -> ToolResult:
        """Validate and run this one tool with no road around it: no discovery, no policy seam, no journal.
        For tests and benchmarks of one family; every transport goes through ToolService.call."""
        try:
            args = self.validate(arguments)
        except ToolError:
            raise  # wrong arguments: the transports answer these as invalid requests
        except Exception as exc:
            return ToolResult.from_error(self.unexpected(exc, ctx))
        return await self.run(args, ctx)

    async def run(self, args: BaseModel, ctx: CallContext) -> ToolResult:
        """The executor on validated arguments; its errors become the call's error result."""
        try:
            return await self.execute(args, ctx)
        except ToolError as exc:
            return ToolResult.from_error(exc)
        except Exception as exc:  # a bug or an OS surprise: a clear tool error, never a 500 or a traceback
            return ToolResult.from_error(self.unexpected(exc, ctx))

    def unexpected(self, exc: BaseException, ctx: CallContext | None = None) -> ToolError:
        """Log one line (the exception's type and where it was raised: never its message, which may
        hold arguments) and return the error the model sees."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        place = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb is not None else "?"
        log.warning("tool %s failed unexpectedly: %s at %s (transport=%s)", self.name, type(exc).__name__,
                    place, ctx.transport if ctx else "?")
        effect = ("nothing was changed" if self.read_only
                  else "whether it changed anything is unknown: check before calling it again")
        return ToolError(f"{self.name} failed with an internal error ({type(exc).__name__}); {effect}. "
                         "If it happens again, report it to the ctproxy operator.", code="internal_error")


def _lone_surrogate(arguments: dict[str, Any]) -> str | None:
    """Where in the arguments a string (or a key) is not encodable as UTF-8, if anywhere."""
    stack: list[tuple[str, Any]] = [("the arguments", arguments)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(value, dict):
            for key, item in value.items():
                shown = f"'{clip(key, 40)}'" if isinstance(key, str) and key.isprintable() else "a field name"
                stack.append((shown, key))
                stack.append((shown if where == "the arguments" else where, item))
        elif isinstance(value, list):
            stack.extend((where, item) for item in value)
    return None


def clip(text: str, limit: int = 200) -> str:
    """A value quoted in an error message, cut so a hostile argument cannot make the message huge."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def describe_validation(exc: ValidationError, max_errors: int = 10) -> str:
    parts = []
    errors = exc.errors(include_url=False, include_input=False)
    for e in errors[:max_errors]:
        loc = clip(".".join(str(p) for p in e["loc"]) or "arguments", 120)
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown field '{loc}'")
        elif e["type"] == "missing":
            parts.append(f"missing required field '{loc}'")
        else:
            parts.append(f"'{loc}': {clip(e['msg'], 400)}")
    if len(errors) > max_errors:
        parts.append(f"and {len(errors) - max_errors} more problems")
    return "; ".join(parts)


class ToolFamily(Protocol):
    """A group of tools that share state (a process manager, a store)."""

    name: str

    def tools(self) -> Iterable[Tool]: ...

    async def close(self) -> None: ...


class Registry:
    def __init__(self, families: Iterable[ToolFamily], config: Config, unavailable: dict[str, str] | None = None):
        self.families = list(families)
        self.config = config
        # capability -> why every call would fail (`ctproxy status` says `unavailable`): its tools are not offered
        self.unavailable = dict(unavailable or {})
        self._all: dict[str, Tool] = {}
        for fam in self.families:
            for tool in fam.tools():
                if tool.name in self._all:
                    raise ValueError(f"tool name registered twice: {tool.name}")
                self._all[tool.name] = tool

    def all_tools(self) -> list[Tool]:
        return list(self._all.values())

    def _offered(self, tool: Tool) -> bool:
        return self.config.enabled(tool.capability) and tool.capability not in self.unavailable

    def enabled_tools(self) -> list[Tool]:
        return [t for t in self._all.values() if self._offered(t)]

    def get(self, name: str) -> Tool | None:
        tool = self._all.get(name)
        if tool is None or not self._offered(tool):
            return None
        return tool

    def unavailable_reason(self, name: str) -> str | None:
        """Why tool `name` is not offered although its capability is switched on, or None (status judged the
        capability `unavailable`, which it does only for one that is switched on)."""
        tool = self._all.get(name)
        return self.unavailable.get(tool.capability) if tool is not None else None

    async def close(self) -> None:
        for fam in self.families:
            await fam.close()
