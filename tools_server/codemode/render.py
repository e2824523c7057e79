"""Codex's code-mode output (research/codex-protocol.md §4.5) for one observation of a cell.

    Script completed | Script failed | Script running with cell ID <id> | Script terminated
    Wall time 1.2 seconds
    Output:
    <text printed since the last observation>
    [Result:\n<the returned value, compact JSON>]
    [Script error:\n<message>]

Status and uncertainty (nested calls left unsettled, shells still running) come before anything
clipped; each preview has its own budget and `clipping` says which one cut. The output preview shows
the newest text (what the cell printed last); the result and the error show their beginning. Whatever a
preview leaves out is in a private file the answer names (`Full output/result/error …: path`, and
`details.recovery`), written by the observer (family.py) before it renders.
"""

from __future__ import annotations

import json
from typing import Any

from tools_server.codemode.cells import Cell


def _clip(text: str, budget: int) -> tuple[str, bool]:
    data = text.encode("utf-8", "replace")
    if len(data) <= budget:
        return text, False
    kept = data[:max(0, budget)].decode("utf-8", "ignore")
    return kept + f"\n…[{len(data) - len(kept.encode('utf-8'))} more bytes not shown]", True


def _clip_tail(text: str, budget: int, dropped: int = 0) -> tuple[str, bool]:
    """The newest `budget` bytes of the output; `dropped` earlier bytes were already left out."""
    data = text.encode("utf-8", "replace")
    if len(data) <= budget and not dropped:
        return text, False
    kept = data[len(data) - min(len(data), max(0, budget)):].decode("utf-8", "ignore")
    left_out = dropped + len(data) - len(kept.encode("utf-8"))
    return f"[…{left_out} earlier bytes not shown]\n" + kept, True


def output_budget(cell: Cell, max_bytes: int) -> int:
    return max(0, min(max_bytes, cell.limits.final_text_bytes))


def status_line(cell: Cell) -> str:
    return {"running": f"Script running with cell ID {cell.id}", "completed": "Script completed",
            "failed": "Script failed", "terminated": "Script terminated"}[cell.state]


def render(cell: Cell, max_bytes: int, output: str | None = None,
           saved: dict[str, dict[str, Any]] | None = None) -> tuple[str, dict[str, Any]]:
    """`output`: the unread text the observer took (None: take it now); `saved`: the result's and the
    error's recovery files when their previews cut them."""
    lim = cell.limits
    budget = output_budget(cell, max_bytes)
    saved = saved or {}
    if output is None:
        output = cell.output.read_unread()
    head = [status_line(cell), f"Wall time {cell.wall_time():.1f} seconds"]
    notes: list[str] = []
    effects = cell.effects
    if cell.expired:
        notes.append(f"Stopped by the wall-clock limit: a cell may run {cell.limits.max_wall_time_s:.0f} seconds "
                     "(start long work with exec_command and poll it with write_stdin instead).")
    if effects is not None and effects.unsettled:
        notes.append(f"Unknown outcome: {effects.unsettled} nested call(s) were still running when the cell "
                     "ended; their effects are unknown (nothing is run again).")
    recovery = cell.capture.snapshot() if cell.capture is not None else None
    if recovery is not None and recovery.get("path"):
        notes.append(f"Full output ({recovery['bytes']} bytes, {recovery['state']}): {recovery['path']}")
    live = sorted(sid for sid, state in cell.shells.items() if state == "running")
    unread = sorted(sid for sid, state in cell.shells.items() if state == "exited")
    if live and cell.state != "running":
        notes.append(f"Shells still running: {', '.join(live)} (continue them with write_stdin session_id).")
    if unread and cell.state != "running":
        notes.append(f"Shells exited, output and exit code unread: {', '.join(unread)} (read them with "
                     "write_stdin session_id).")
    for kind in ("result", "error"):
        if (snap := saved.get(kind)) is not None and snap.get("path"):
            notes.append(f"Full {kind} ({snap['bytes']} bytes, {snap['state']}): {snap['path']}")
    output, out_clipped = _clip_tail(output, budget, cell.output.last_dropped)
    text = "\n".join(head) + "\n" + "".join(n + "\n" for n in notes) + "Output:\n" + output
    details: dict[str, Any] = {"cell_id": cell.id, "status": cell.state, **({"stopped_by": "wall-time-limit"}
                                                                           if cell.expired else {}),
                               "wall_time_seconds": round(cell.wall_time(), 3),
                               "output_bytes": cell.output.total_bytes}
    clipping = {"output": out_clipped or cell.lost_chars > 0, "result": False, "error": False}
    if cell.state == "completed" and cell.result_json is not None:
        result, clipping["result"] = _clip(cell.result_json, lim.result_preview_bytes)
        text += ("" if text.endswith("\n") else "\n") + "Result:\n" + result
        if not clipping["result"]:
            try:
                details["result"] = json.loads(cell.result_json)
            except ValueError:
                pass
    if cell.state == "failed":
        error, clipping["error"] = _clip(cell.error or "the script failed", lim.error_preview_bytes)
        text += ("" if text.endswith("\n") else "\n") + "Script error:\n" + error
        details["error"] = cell.error_code or "script-error"
    if effects is not None:
        details["calls"] = effects.as_dict()
        if cell.state != "completed" and effects.total:
            e = effects
            text += (f"\nNested calls: {e.completed} completed, {e.failed} failed, {e.cancelled} cancelled, "
                     f"{e.unsettled} unsettled")
    if recovery is not None or saved:
        details["recovery"] = {**({"output": recovery} if recovery is not None else {}), **saved}
    if cell.shells:
        details["shells"] = [{"session_id": sid, "running": state == "running", "unread": state != "closed"}
                             for sid, state in sorted(cell.shells.items())]
    details["clipping"] = clipping
    final, _ = _clip(text, lim.final_text_bytes)
    return final, details
