"""Argument models of the five notes tools (Codex's schemas, seed 000); the base model, which names a
field that belongs to another of seed 000's tools, is shared with the history tools."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from tools_server.history.args import ToolArgs


class NotesListArgs(ToolArgs):
    TOOL: ClassVar[str] = "notes_list_files_by_prefix"
    prefix: str | None = None
    max_results: int | None = Field(None, ge=1)
    file_order_by: Literal["name", "created_at", "updated_at"] | None = None
    file_order: Literal["ascending", "descending"] | None = None


class NotesReadArgs(ToolArgs):
    TOOL: ClassVar[str] = "notes_read_file"
    path: str
    start_line: int | None = None
    stop_line: int | None = None
    offset_chars: int | None = Field(None, ge=0)
    limit_chars: int | None = Field(None, ge=1)


class NotesSearchArgs(ToolArgs):
    TOOL: ClassVar[str] = "notes_search_contents"
    max_matches_per_file: int | None = Field(None, ge=1)
    query: str
    recent_file_first: bool | None = None
    max_files: int | None = Field(None, ge=1)
    path_prefix: str | None = None


class NotesAppendArgs(ToolArgs):
    TOOL: ClassVar[str] = "notes_append_to_file"
    text: str
    path: str


class NotesWriteArgs(ToolArgs):
    TOOL: ClassVar[str] = "notes_write_file"
    text: str
    path: str
