"""What the history and notes families share: limits, caller identity, DB access, capped output."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from proxy.items.addresses import ROOT, AddressError, resolve_address
from proxy.journal.query import HistoryReader
from proxy.notes.paths import quoted
from tools_server.registry import CallContext, Services, ToolError, clip

T = TypeVar("T")

MAX_TOOL_OUTPUT_CHARS = 12_000  # seed 000 maxToolOutputChars
INDEX_OUTPUT_CAP = 6_000  # list/search: min(max tool output, 6000)
PREVIEW_CHARS = 400  # historyItemPreviewChars


def max_output(services: Services, section: str = "history") -> int:
    """The configured max tool output of one family (`history.max_tool_output_chars` or
    `notes.max_tool_output_chars`): each family reads its own section, never the other's."""
    value = getattr(getattr(services.config, section, None), "max_tool_output_chars", None)
    if isinstance(value, int) and value > 0:
        return value
    return MAX_TOOL_OUTPUT_CHARS


def index_cap(services: Services, section: str = "history") -> int:
    return min(max_output(services, section), INDEX_OUTPUT_CAP)


def clamp(value: int | None, default: int, maximum: int) -> tuple[int, bool]:
    """(effective value, whether it was clamped)."""
    if value is None:
        return default, False
    return (maximum, True) if value > maximum else (value, False)


class Readers:
    """The history reader of the tool server's store (`Services.state_store().journal().history()`: on the embedded
    store one connection per worker thread, on PostgreSQL its pool); queries run off the event loop."""

    def __init__(self, services: Services):
        self.services = services

    def _reader(self) -> HistoryReader:
        return self.services.state_store().journal().history()

    async def run(self, fn: Callable[[HistoryReader], T]) -> T:
        return await asyncio.to_thread(lambda: fn(self._reader()))

    def close(self) -> None:
        """The connections belong to the store, closed with it."""


def caller_of(ctx: CallContext, reader: HistoryReader) -> tuple[str, str]:
    """(task id, agent address) of the calling agent; the task must exist and a caller other than its
    root must be registered in it. A relative x-ctp-agent (`reviewer`) is under /root."""
    if not ctx.task:
        raise ToolError("this call names no task: send the x-ctp-task header (and x-ctp-agent) of the "
                        "calling agent", code="no_task")
    try:
        address = resolve_address(ctx.agent) if ctx.agent else ROOT
    except AddressError as exc:
        raise ToolError(f"x-ctp-agent: {clip(str(exc), 400)}", code="invalid_agent") from None
    if not reader.task_exists(ctx.task):
        raise ToolError(f"unknown task {quoted(ctx.task)}: use the task id the proxy assigned (or `ctproxy task new`)",
                        code="unknown_task")
    if address != ROOT and not reader.agent_exists(ctx.task, address):
        # Only agents the task registered may act in it (seed 000): a made-up address would get notes
        # of its own and see everyone else's. The task's root is its owner, registered or not yet.
        raise ToolError(f"x-ctp-agent {quoted(address)} is not registered in task {quoted(ctx.task)}: an agent "
                        "joins a task by sending a request through the proxy with x-ctp-task and x-ctp-agent",
                        code="unregistered_agent")
    return ctx.task, address


def target_agent(reader: HistoryReader, task_id: str, caller: str, agent_name: str | None) -> str:
    """`agent_name` omitted/null = the caller; absolute as given; relative under the caller.
    Only agents registered in the caller's task."""
    try:
        address = resolve_address(agent_name, base=caller) if agent_name is not None else caller
    except AddressError as exc:
        raise ToolError(clip(str(exc), 400), code="invalid_agent") from None
    if address != caller and not reader.agent_exists(task_id, address):
        known = ", ".join(reader.agents(task_id)) or "none"
        raise ToolError(f"unknown agent {quoted(address)} in this task; registered agents: {clip(known, 1000)}",
                        code="unknown_agent")
    return address


def capped_lines(header: str, lines: list[str], cap: int, more: bool, narrow: str,
                 stopped_by: str = "limit", raise_to: str = "") -> tuple[str, int]:
    """The header and as many whole lines as fit in `cap` characters, then a note saying what stopped the
    list and what to do: `more` means the query itself stopped at its `stopped_by` argument (`limit`,
    `max_results`, `max_files`: raise it, `raise_to` says how far, or page); lines left out for the output
    size are counted and the note says to narrow (`narrow`). Returns (text, lines shown)."""
    out = [header]
    used = len(header)
    shown = 0
    for i, line in enumerate(lines):
        left_after = len(lines) - i - 1
        note_room = len(_note(len(lines), more, narrow, stopped_by, raise_to, cap)) + 1 \
            if (left_after or more) else 0
        if used + 1 + len(line) + note_room > cap:
            break
        out.append(line)
        used += 1 + len(line)
        shown += 1
    omitted = len(lines) - shown
    if omitted or more:
        out.append(_note(omitted, more, narrow, stopped_by, raise_to, cap))
    return "\n".join(out), shown


def _note(omitted: int, more: bool, narrow: str, stopped_by: str, raise_to: str, cap: int) -> str:
    """Seed 000 defect 8: name what stopped the list, and advise the fix that helps."""
    parts = []
    if omitted:
        parts.append(f"{omitted} more not shown: the output is capped at {cap} characters; {narrow}")
    if more:
        parts.append(f"more not shown: the list stopped at {stopped_by}; raise {stopped_by}"
                     f"{f' (up to {raise_to})' if raise_to else ''} or narrow to see them")
    return "[" + "; ".join(parts) + "]"
