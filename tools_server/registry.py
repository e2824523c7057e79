"""The one tool registry: the bridge, MCP, REST, find_tools and `ctproxy status` all read it.

A tool is a typed async executor plus its Responses-format function spec. Arguments are
validated by the tool's pydantic model (extra fields forbidden) before any effect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from proxy.config import Config
from proxy.state import StateDir


class ToolError(Exception):
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


@dataclass
class Services:
    """What executors may use: configuration, the state directory, the workspace root."""

    config: Config
    state: StateDir
    workspace: Path
    extras: dict[str, Any] = field(default_factory=dict)


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
    transport: Literal["rest", "mcp", "bridge", "direct"] = "direct"
    cancel: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def workspace(self) -> Path:
        return self.services.workspace


Executor = Callable[[Any, CallContext], Awaitable[ToolResult]]


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
        try:
            return self.args_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(f"{self.name}: {describe_validation(exc)}") from exc

    async def call(self, arguments: Any, ctx: CallContext) -> ToolResult:
        args = self.validate(arguments)
        try:
            return await self.execute(args, ctx)
        except ToolError as exc:
            return ToolResult(text=exc.message, details={"error": exc.code, **exc.details}, is_error=True)


def describe_validation(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "arguments"
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown field '{loc}'")
        elif e["type"] == "missing":
            parts.append(f"missing required field '{loc}'")
        else:
            parts.append(f"'{loc}': {e['msg']}")
    return "; ".join(parts)


class ToolFamily(Protocol):
    """A group of tools that share state (a process manager, a store)."""

    name: str

    def tools(self) -> Iterable[Tool]: ...

    async def close(self) -> None: ...


class Registry:
    def __init__(self, families: Iterable[ToolFamily], config: Config):
        self.families = list(families)
        self.config = config
        self._all: dict[str, Tool] = {}
        for fam in self.families:
            for tool in fam.tools():
                if tool.name in self._all:
                    raise ValueError(f"tool name registered twice: {tool.name}")
                self._all[tool.name] = tool

    def all_tools(self) -> list[Tool]:
        return list(self._all.values())

    def enabled_tools(self) -> list[Tool]:
        return [t for t in self._all.values() if self.config.enabled(t.capability)]

    def get(self, name: str) -> Tool | None:
        tool = self._all.get(name)
        if tool is None or not self.config.enabled(tool.capability):
            return None
        return tool

    async def close(self) -> None:
        for fam in self.families:
            await fam.close()
