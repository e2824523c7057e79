"""The four history tools over the journal (seed 000): list windows, list items, read, search.

Output: a header line, then one JSON object per line (ids, window, role, tool, sizes, previews),
stopped at whole lines within min(max tool output, 6000) characters with a note saying how to
narrow. history_read_item reserves its address and paging header first, then returns the actual
page; images of the page come back as real image content only there.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Any

import orjson

from proxy.items.render import render_item
from proxy.journal.excerpt import page, regions
from proxy.journal.query import HistoryReader, ItemFilter, ItemRow
from proxy.notes.paths import quoted
from tools_server.history import schemas
from tools_server.history.args import ListItemsArgs, ListWindowsArgs, ReadItemArgs, SearchContentsArgs
from tools_server.history.current_call import current_call_id
from tools_server.history.shared import (
    PREVIEW_CHARS,
    Readers,
    caller_of,
    capped_lines,
    clamp,
    index_cap,
    max_output,
    target_agent,
)
from tools_server.registry import CallContext, ImageContent, Services, Tool, ToolError, ToolResult

LIST_DEFAULT = 50
MIN_PREVIEW_CHARS = 24


def preview_chars(cap: int) -> int:
    """The default preview of one item: 400 characters (seed 000), less under a small configured output
    cap (an eighth of it), so a list or a search still shows items (seed 000 defect 10)."""
    return max(min(PREVIEW_CHARS, cap // 8), MIN_PREVIEW_CHARS)
_BAD_IMAGES_NOTE = 80  # room for the "image(s) left out" line
SEARCH_DEFAULT = 20
LIMIT_MAX = 200
_NARROW_ITEMS = ("narrow with window_id, role, tool_namespace/tool_name, a smaller limit or max_chars_per_item; "
                 "recent_first reverses")


def _line(obj: dict[str, Any]) -> str:
    return orjson.dumps({k: v for k, v in obj.items() if v is not None}).decode()


_SHORT_ESCAPES = frozenset('"\\\b\f\n\r\t')


def _json_chars(ch: str) -> int:
    """How many characters `ch` takes inside a JSON string as orjson writes it."""
    if ch in _SHORT_ESCAPES:
        return 2
    return 6 if ch < " " else 1


def json_preview(text: str, limit: int) -> str:
    """`preview`, but measured in the JSON line the model gets: a text of quotes or backslashes takes
    twice its length there, so the cut is made where the escaped preview reaches `limit`."""
    if len(text) * 6 <= limit or sum(map(_json_chars, text)) <= limit:
        return text
    used, end = 1, 0  # one for the ellipsis
    for ch in text:
        width = _json_chars(ch)
        if used + width > limit:
            break
        used += width
        end += 1
    return text[:end] + "…"


def _item_meta(row: ItemRow) -> dict[str, Any]:
    return {"item_id": row.item_id, "window_id": row.window_id, "role": row.role, "type": row.type,
            "tool": row.tool, "chars": row.chars, "images": row.images or None}


def _filter(args: ListItemsArgs | SearchContentsArgs, call_id: str | None) -> ItemFilter:
    return ItemFilter(args.window_id, args.role, args.tool_namespace, args.tool_name, call_id)


def _own_call(r: HistoryReader, ctx: CallContext, task: str, caller: str, tool: str,
              args: ListItemsArgs | SearchContentsArgs) -> str | None:
    """The call being executed: named by REST (`x-ctp-call-id`) and the bridge; found in the journal
    for MCP, whose clients send only the name and arguments (tools_server/history/current_call.py)."""
    if ctx.call_id is not None:
        return ctx.call_id
    return current_call_id(r, task, caller, tool, args.model_dump(exclude_none=True))


def _order(recent_first: bool | None) -> str:
    return "newest first" if recent_first else "oldest first"


def _clamp_note(clamped: bool, name: str, maximum: int) -> str:
    return f"; {name} clamped to {maximum}" if clamped else ""


def _image_content(img: Any) -> ImageContent | None:
    """The image as tool content when its data is real base64 of an image/* type; else None."""
    data, mime = img.data_base64 or "", (img.mime or "image/png").lower()
    if not data or not mime.startswith("image/"):
        return None
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    return ImageContent(data, mime)


class HistoryFamily:
    name = "history"

    def __init__(self, services: Services):
        self.services = services
        self.readers = Readers(services)

    # ---------------------------------------------------------------- list_windows
    async def list_windows(self, args: ListWindowsArgs, ctx: CallContext) -> ToolResult:
        limit, clamped = clamp(args.limit, LIST_DEFAULT, LIMIT_MAX)

        def run(r: HistoryReader) -> ToolResult:
            task, caller = caller_of(ctx, r)
            agent = target_agent(r, task, caller, args.agent_name)
            wins, total = r.list_windows(task, agent, limit, bool(args.recent_first))
            header = (f"history windows of {agent}: {len(wins)} of {total} ({_order(args.recent_first)})"
                      f"{_clamp_note(clamped, 'limit', LIMIT_MAX)}")
            lines = [_line({"window_id": w.window_id, "items": w.items, "hidden_items": w.hidden_items or None,
                            "strategy": w.strategy, "current": w.current or None}) for w in wins]
            text, shown = capped_lines(header, lines, index_cap(self.services), total > len(wins),
                                       "use a smaller limit, recent_first, or agent_name for one agent",
                                       "limit", str(LIMIT_MAX))
            return ToolResult(text, {"agent": agent, "windows": shown, "total": total})

        return await self.readers.run(run)

    # ---------------------------------------------------------------- list_items
    async def list_items(self, args: ListItemsArgs, ctx: CallContext) -> ToolResult:
        limit, clamped = clamp(args.limit, LIST_DEFAULT, LIMIT_MAX)
        cap = index_cap(self.services)
        per_item_max = max(cap - 400, 1)  # one item's line always fits the output cap
        # the default preview follows a small configured cap, so a list still shows several items
        chars, chars_clamped = clamp(args.max_chars_per_item, preview_chars(cap), per_item_max)

        def run(r: HistoryReader) -> ToolResult:
            task, caller = caller_of(ctx, r)
            agent = target_agent(r, task, caller, args.agent_name)
            flt = _filter(args, _own_call(r, ctx, task, caller, "history_list_items", args))
            rows, more = r.list_items(task, agent, flt, limit, bool(args.recent_first), chars)
            header = (f"history items of {agent}: {len(rows)}{'+' if more else ''} ({_order(args.recent_first)})"
                      f"{_clamp_note(clamped, 'limit', LIMIT_MAX)}"
                      f"{_clamp_note(chars_clamped, 'max_chars_per_item', per_item_max)}")
            lines = [_line({**_item_meta(row), "preview": json_preview(row.text, chars)}) for row in rows]
            text, shown = capped_lines(header, lines, cap, more, _NARROW_ITEMS, "limit", str(LIMIT_MAX))
            return ToolResult(text, {"agent": agent, "items": shown, "more": more or shown < len(rows)})

        return await self.readers.run(run)

    # ---------------------------------------------------------------- read_item
    async def read_item(self, args: ReadItemArgs, ctx: CallContext) -> ToolResult:
        budget = max_output(self.services)

        def run(r: HistoryReader) -> ToolResult:
            task, caller = caller_of(ctx, r)
            agent = target_agent(r, task, caller, args.agent_name)
            found = r.get_item(task, agent, args.item_id)
            if found is None:
                raise ToolError(f"no item {quoted(args.item_id)} in the history of {agent}; find ids with "
                                "history_list_items or history_search_contents", code="unknown_item")
            row, raw, on_branch = found
            if row.window_id != args.window_id:
                raise ToolError(f"item {quoted(args.item_id)} is in window {row.window_id!r}, not "
                                f"{quoted(args.window_id)}; "
                                "pass the window_id returned with the item", code="window_mismatch")
            return self._read(row, raw, on_branch, agent, args.offset_chars or 0, args.limit_chars, budget)

        return await self.readers.run(run)

    @staticmethod
    def _read_header(row: ItemRow, agent: str, start: int, end: int, total: int, on_branch: bool,
                     images: int) -> str:
        tool = f" | tool {row.tool}" if row.tool else ""
        branch = "" if on_branch else " | not on the current branch"
        img = f" | {images} image(s) attached" if images else ""
        nxt = f" | next offset_chars={end}" if end < total else ""
        return (f"[item {row.item_id} | window {row.window_id} | agent {agent} | role {row.role} | {row.type}"
                f"{tool}{branch}]\n[chars {start}-{end} of {total}{nxt}{img}]\n")

    def _read(self, row: ItemRow, raw: bytes, on_branch: bool, agent: str, offset: int, limit: int | None,
              budget: int) -> ToolResult:
        total = row.chars
        wide = max(total, 1)
        # Reserve the header first, sized for the widest numbers it can hold.
        rendered = render_item(orjson.loads(raw)).images
        any_bad = any(img.kind == "data" and _image_content(img) is None for img in rendered)
        reserve = len(self._read_header(row, agent, wide, wide, wide * 10 + 9, on_branch, 99))
        reserve += _BAD_IMAGES_NOTE if any_bad else 0
        room = max(budget - reserve, 1)
        pg = page(row.text, offset, min(limit or room, room))
        on_page = [img for n, img in enumerate(rendered, 1)
                   if img.kind == "data" and f"[image #{n}:" in pg.text]
        images = [c for c in map(_image_content, on_page) if c is not None]
        bad = len(on_page) - len(images)
        header = self._read_header(row, agent, pg.offset, pg.end, total, on_branch, len(images))
        if bad:  # recorded data that is not an image: say so instead of handing a client broken bytes
            header += f"[{bad} image(s) left out: the recorded data is not valid base64 image data]\n"
        details: dict[str, Any] = {"item_id": row.item_id, "window_id": row.window_id, "offset_chars": pg.offset,
                                   "end_chars": pg.end, "total_chars": total, "next_offset_chars": pg.next_offset,
                                   "images": len(images)}
        if bad:
            details["invalid_images"] = bad
        return ToolResult(header + pg.text, details, images=images)

    # ---------------------------------------------------------------- search_contents
    async def search_contents(self, args: SearchContentsArgs, ctx: CallContext) -> ToolResult:
        if not args.query:
            raise ToolError("query must not be empty: give a literal, case-sensitive substring")
        if "\x00" in args.query:  # the full-text index cannot take one (SQLite FTS5: "unterminated string")
            raise ToolError("query must not contain a NUL character: search for the text around it instead")
        limit, clamped = clamp(args.limit, SEARCH_DEFAULT, LIMIT_MAX)

        def run(r: HistoryReader) -> ToolResult:
            task, caller = caller_of(ctx, r)
            agent = target_agent(r, task, caller, args.agent_name)
            flt = _filter(args, _own_call(r, ctx, task, caller, "history_search_contents", args))
            hits, more = r.search(task, agent, args.query, flt, limit, bool(args.recent_first))
            header = (f"history search in {agent}: {len(hits)}{'+' if more else ''} item(s) "
                      f"({_order(args.recent_first)}){_clamp_note(clamped, 'limit', LIMIT_MAX)}")
            cap = index_cap(self.services)
            context = preview_chars(cap)
            while True:  # a small configured cap still shows at least one hit: narrower regions until it fits
                lines = []
                for hit in hits:
                    regs = regions(hit.row.text, hit.matches, context)
                    lines.append(_line({**_item_meta(hit.row), "matches": len(hit.matches), "regions": [
                        {"offset_chars": g.offset_chars, "limit_chars": g.limit_chars,
                         "matches": [list(m) for m in g.matches], "text": g.text} for g in regs]}))
                text, shown = capped_lines(header, lines, cap, more, _NARROW_ITEMS, "limit", str(LIMIT_MAX))
                if shown or not lines or context <= MIN_PREVIEW_CHARS:
                    break
                context = max(context // 2, MIN_PREVIEW_CHARS)
            return ToolResult(text, {"agent": agent, "items": shown, "more": more or shown < len(hits)})

        return await self.readers.run(run)

    # ---------------------------------------------------------------- registry
    def tools(self) -> Iterable[Tool]:
        table = (
            ("history_list_windows", ListWindowsArgs, self.list_windows),
            ("history_list_items", ListItemsArgs, self.list_items),
            ("history_read_item", ReadItemArgs, self.read_item),
            ("history_search_contents", SearchContentsArgs, self.search_contents),
        )
        return [Tool(name=name, description=schemas.description(name), family=self.name, capability="history",
                     args_model=model, execute=fn, parameters=schemas.runtime_parameters(name), strict=False,
                     parallel=True, read_only=True)
                for name, model, fn in table]

    async def close(self) -> None:
        self.readers.close()
