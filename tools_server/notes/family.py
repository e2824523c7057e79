"""The five notes tools (seed 000) over the state store's notes (`Services.state_store()`, proxy/store/interface.py).

Relative paths are the caller's notes; `/root/…/notes/<path>` reaches another agent registered in
the same task. Lists and searches stop at whole lines within the max tool output and say how to
narrow; reads reserve their header first, then return the actual page.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from proxy.journal.excerpt import page
from proxy.journal.query import HistoryReader
from proxy.notes import NoteError, NoteInfo, NotePathError, NoteRef, parse
from proxy.notes.lines import LineRangeError, select_lines, split_lines
from proxy.notes.port import NotesBackend
from proxy.notes.store import iso
from tools_server.history import schemas
from tools_server.history.shared import Readers, caller_of, capped_lines, clamp, max_output
from tools_server.notes.args import NotesAppendArgs, NotesListArgs, NotesReadArgs, NotesSearchArgs, NotesWriteArgs
from tools_server.registry import CallContext, Services, Tool, ToolError, ToolResult

LIST_DEFAULT, LIST_MAX = 100, 500
FILES_DEFAULT, FILES_MAX = 50, 500
MATCHES_DEFAULT, MATCHES_MAX = 10, 100
LINE_PREVIEW = 300


def _sort_key(order_by: str):
    if order_by == "created_at":
        return lambda n: (n.created_at, n.rel)
    if order_by == "updated_at":
        return lambda n: (n.updated_at, n.rel)
    return lambda n: n.rel


def _line_excerpt(line: str, pos: int, width: int = LINE_PREVIEW) -> str:
    """The line around its first match, at most `width` code points."""
    if len(line) <= width:
        return line
    start = max(0, min(pos - width // 3, len(line) - width))
    cut = line[start:start + width]
    return ("…" if start else "") + cut + ("…" if start + width < len(line) else "")


class NotesFamily:
    name = "notes"

    def __init__(self, services: Services):
        self.services = services
        self.readers = Readers(services)

    def _store(self, task: str) -> NotesBackend:
        try:
            return self.services.state_store().notes(task)
        except NotePathError as exc:
            raise ToolError(str(exc), code="invalid_task") from None

    def _resolve(self, r: HistoryReader, ctx: CallContext, path: str | None,
                 prefix: bool) -> tuple[NotesBackend, NoteRef]:
        task, caller = caller_of(ctx, r)
        try:
            ref = parse(path or "", caller, lambda a: r.agent_exists(task, a), prefix=prefix)
        except NotePathError as exc:
            raise ToolError(str(exc), code="invalid_path") from None
        return self._store(task), ref

    async def _run(self, fn) -> ToolResult:
        def wrapped(r: HistoryReader) -> ToolResult:
            try:
                return fn(r)
            except NoteError as exc:
                raise ToolError(str(exc), code="notes_error") from None
            except NotePathError as exc:
                raise ToolError(str(exc), code="invalid_path") from None
            except LineRangeError as exc:
                raise ToolError(str(exc)) from None
        return await self.readers.run(wrapped)

    # ---------------------------------------------------------------- list
    async def list_files(self, args: NotesListArgs, ctx: CallContext) -> ToolResult:
        limit, clamped = clamp(args.max_results, LIST_DEFAULT, LIST_MAX)
        order_by, order = args.file_order_by or "name", args.file_order or "ascending"

        def run(r: HistoryReader) -> ToolResult:
            store, ref = self._resolve(r, ctx, args.prefix, prefix=True)
            files = [n for n in store.iter_files(ref.address) if n.rel.startswith(ref.rel)]
            files.sort(key=_sort_key(order_by), reverse=order == "descending")
            shown_files = files[:limit]
            header = (f"notes of {ref.address} with prefix {ref.rel!r}: {len(shown_files)} of {len(files)} "
                      f"(by {order_by}, {order}){'; max_results clamped to 500' if clamped else ''}")
            lines = [orjson.dumps({"path": ref.shown(n.rel), "bytes": n.bytes, "created_at": iso(n.created_at),
                                   "updated_at": iso(n.updated_at)}).decode() for n in shown_files]
            text, shown = capped_lines(header, lines, max_output(self.services, "notes"), len(files) > limit,
                                       "use a longer prefix or a smaller max_results", "max_results", str(LIST_MAX))
            return ToolResult(text, {"agent": ref.address, "files": shown, "total": len(files)})

        return await self._run(run)

    # ---------------------------------------------------------------- read
    async def read_file(self, args: NotesReadArgs, ctx: CallContext) -> ToolResult:
        budget = max_output(self.services, "notes")

        def run(r: HistoryReader) -> ToolResult:
            store, ref = self._resolve(r, ctx, args.path, prefix=False)
            text = store.read(ref.address, ref.rel)
            sel = select_lines(text, args.start_line, args.stop_line)
            total = len(sel.text)
            wide = max(total, 1)
            # Sized for the widest numbers and a "next offset" part, so the page never overflows.
            reserve = len(self._header(ref, sel.first, sel.last, sel.total, wide, wide, wide * 10 + 9)) + 1
            room = max(budget - reserve, 1)
            pg = page(sel.text, args.offset_chars or 0, min(args.limit_chars or room, room))
            header = self._header(ref, sel.first, sel.last, sel.total, pg.offset, pg.end, total)
            details: dict[str, Any] = {"path": ref.shown(), "first_line": sel.first, "last_line": sel.last,
                                       "total_lines": sel.total, "offset_chars": pg.offset, "end_chars": pg.end,
                                       "total_chars": total, "next_offset_chars": pg.next_offset}
            return ToolResult(header + "\n" + pg.text, details)

        return await self._run(run)

    @staticmethod
    def _header(ref: NoteRef, first: int, last: int, total_lines: int, start: int, end: int, total: int) -> str:
        lines = f"lines {first}-{last} of {total_lines}" if first else f"no lines selected of {total_lines}"
        nxt = f" | next offset_chars={end}" if end < total else ""
        return f"[note {ref.shown()} | {lines} | chars {start}-{end} of {total}{nxt}]"

    # ---------------------------------------------------------------- search
    async def search_contents(self, args: NotesSearchArgs, ctx: CallContext) -> ToolResult:
        if not args.query:
            raise ToolError("query must not be empty: give a literal, case-sensitive substring")
        max_files, files_clamped = clamp(args.max_files, FILES_DEFAULT, FILES_MAX)
        per_file, per_clamped = clamp(args.max_matches_per_file, MATCHES_DEFAULT, MATCHES_MAX)

        def run(r: HistoryReader) -> ToolResult:
            store, ref = self._resolve(r, ctx, args.path_prefix, prefix=True)
            files: list[NoteInfo] = [n for n in store.iter_files(ref.address) if n.rel.startswith(ref.rel)]
            if args.recent_file_first:
                files.sort(key=lambda n: (-n.created_at, n.rel))  # creation time: overwriting is not "new"
            else:
                files.sort(key=lambda n: n.rel)
            lines: list[str] = []
            matched_files = 0
            more = False
            # PostgreSQL: the matching notes' contents in one query for the agent, not one query per note.
            bulk = getattr(store, "contents_matching", None)
            found = bulk(ref.address, ref.rel, args.query) if bulk is not None else None
            for info in files:
                if found is not None:
                    text = found.get(info.rel)
                    if text is None:
                        continue  # no match (or removed meanwhile)
                else:
                    try:
                        text = store.read(ref.address, info.rel)
                    except NoteError:
                        continue  # removed meanwhile
                hits = []
                for n, line in enumerate(split_lines(text), 1):
                    pos = line.find(args.query)
                    if pos != -1:
                        hits.append(f"{ref.shown(info.rel)}:{n}: {_line_excerpt(line.rstrip(chr(10)), pos)}")
                if not hits:
                    continue
                if matched_files == max_files:
                    more = True
                    break
                matched_files += 1
                lines.extend(hits[:per_file])
                if len(hits) > per_file:
                    lines.append(f"{ref.shown(info.rel)}: [{len(hits) - per_file} more matching lines]")
            notes = (("; max_files clamped to 500" if files_clamped else "")
                     + ("; max_matches_per_file clamped to 100" if per_clamped else ""))
            header = (f"notes search in {ref.address} under {ref.rel!r}: {matched_files}{'+' if more else ''} "
                      f"file(s) ({'newest created first' if args.recent_file_first else 'by name'}){notes}")
            text, _ = capped_lines(header, lines, max_output(self.services, "notes"), more,
                                   "use a longer path_prefix, a longer query or a smaller max_matches_per_file",
                                   "max_files", "500")
            return ToolResult(text, {"agent": ref.address, "files": matched_files, "more": more})

        return await self._run(run)

    # ---------------------------------------------------------------- writes
    async def append_to_file(self, args: NotesAppendArgs, ctx: CallContext) -> ToolResult:
        def run(r: HistoryReader) -> ToolResult:
            store, ref = self._resolve(r, ctx, args.path, prefix=False)
            res = store.append(ref.address, ref.rel, args.text)
            verb = "created" if res.created else "appended to"
            return ToolResult(f"{verb} {ref.shown()}: +{res.written} bytes, now {res.bytes} bytes",
                              {"path": ref.shown(), "bytes": res.bytes, "written": res.written,
                               "created": res.created})

        return await self._run(run)

    async def write_file(self, args: NotesWriteArgs, ctx: CallContext) -> ToolResult:
        def run(r: HistoryReader) -> ToolResult:
            store, ref = self._resolve(r, ctx, args.path, prefix=False)
            res = store.write(ref.address, ref.rel, args.text)
            verb = "created" if res.created else "replaced"
            return ToolResult(f"{verb} {ref.shown()}: {res.bytes} bytes",
                              {"path": ref.shown(), "bytes": res.bytes, "created": res.created})

        return await self._run(run)

    # ---------------------------------------------------------------- registry
    def tools(self) -> Iterable[Tool]:
        # (name, arguments, executor, reads only): readers run in parallel, writers one at a time.
        table = (
            ("notes_list_files_by_prefix", NotesListArgs, self.list_files, True),
            ("notes_read_file", NotesReadArgs, self.read_file, True),
            ("notes_search_contents", NotesSearchArgs, self.search_contents, True),
            ("notes_append_to_file", NotesAppendArgs, self.append_to_file, False),
            ("notes_write_file", NotesWriteArgs, self.write_file, False),
        )
        return [Tool(name=name, description=schemas.description(name), family=self.name, capability="notes",
                     args_model=model, execute=fn, parameters=schemas.runtime_parameters(name), strict=False,
                     parallel=reads_only, read_only=reads_only)
                for name, model, fn, reads_only in table]

    async def close(self) -> None:
        self.readers.close()

