"""Argument models of the nine tools: each validates exactly its own Codex schema.

Strict types (no "5" for 5), and an unknown field is an error that names it — and, when the field
belongs to another of the nine tools, names that tool. Optional fields also accept null (= omitted).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from tools_server.history.schemas import field_owners

_OWNERS = field_owners()
Role = Literal["user", "assistant", "tool", "system", "developer"]


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    TOOL: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _only_own_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key in cls.model_fields:
                    continue
                others = [t for t in _OWNERS.get(key, []) if t != cls.TOOL]
                if others:
                    raise PydanticCustomError(
                        "other_tool_field", "field '{field}' belongs to {owner}, not {tool}; remove it",
                        {"field": key, "owner": " / ".join(others), "tool": cls.TOOL})
                raise PydanticCustomError(
                    "unknown_field", "unknown field '{field}'; {tool} accepts: {fields}",
                    {"field": key, "tool": cls.TOOL, "fields": ", ".join(cls.model_fields)})
        return data


class ListWindowsArgs(ToolArgs):
    TOOL: ClassVar[str] = "history_list_windows"
    limit: int | None = Field(None, ge=1)
    agent_name: str | None = None
    recent_first: bool | None = None


class ListItemsArgs(ToolArgs):
    TOOL: ClassVar[str] = "history_list_items"
    limit: int | None = Field(None, ge=1)
    recent_first: bool | None = None
    tool_namespace: str | None = None
    role: Role | None = None
    agent_name: str | None = None
    tool_name: str | None = None
    window_id: str | None = None
    max_chars_per_item: int | None = Field(None, ge=1)


class ReadItemArgs(ToolArgs):
    TOOL: ClassVar[str] = "history_read_item"
    agent_name: str | None = None
    item_id: str
    offset_chars: int | None = Field(None, ge=0)
    limit_chars: int | None = Field(None, ge=1)
    window_id: str


class SearchContentsArgs(ToolArgs):
    TOOL: ClassVar[str] = "history_search_contents"
    limit: int | None = Field(None, ge=1)
    query: str
    recent_first: bool | None = None
    tool_namespace: str | None = None
    role: Role | None = None
    agent_name: str | None = None
    tool_name: str | None = None
    window_id: str | None = None


ARGS: dict[str, type[ToolArgs]] = {m.TOOL: m for m in (
    ListWindowsArgs, ListItemsArgs, ReadItemArgs, SearchContentsArgs)}
