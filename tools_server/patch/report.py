"""What the model reads after a patch (Codex's wording) and the structured details for REST/MCP."""

from __future__ import annotations

from typing import Any

from tools_server.patch.commit import CommitReport, OpResult
from tools_server.patch.preflight import Operation

_LETTER = {"add": "A", "update": "M", "move": "M", "delete": "D"}
_GROUP_ORDER = ("A", "M", "D")


def describe(op: Operation) -> str:
    """`A path`, `M path`, `D path`, or `M new (moved from old)`: Codex's summary line."""
    if op.kind == "move":
        assert op.dest is not None
        return f"M {op.dest.raw} (moved from {op.target.raw})"
    return f"{_LETTER[op.kind]} {op.target.raw}"


def success_text(report: CommitReport) -> str:
    ops = [r.operation for r in report.results]
    lines = ["Success. Updated the following files:"]
    for letter in _GROUP_ORDER:
        lines.extend(describe(op) for op in ops if _LETTER[op.kind] == letter)
    return "\n".join(lines)


_STATUS_HEADINGS = (
    ("committed", "Committed"),
    ("failed", "Failed (left as it was)"),
    ("partial", "Partly done (destination written, source not removed)"),
    ("unknown", "Outcome unknown (check these files)"),
    ("not_attempted", "Not attempted (left as they were)"),
)


def failure_text(report: CommitReport) -> str:
    lines = [
        f"apply_patch stopped while committing: {report.error}.",
        "A multi-file patch is not a transaction: nothing was rolled back and nothing was retried.",
    ]
    for status, heading in _STATUS_HEADINGS:
        matching = [r for r in report.results if r.status == status]
        if matching:
            lines.append(f"{heading}:")
            lines.extend(f"  {describe(r.operation)}" for r in matching)
    if report.created_dirs:
        lines.append("Directories created: " + ", ".join(report.created_dirs))
    lines.append("Re-read the affected files before patching again.")
    return "\n".join(lines)


def details(report: CommitReport, cwd_display: str) -> dict[str, Any]:
    committed = [r.operation for r in report.results if r.status == "committed"]
    out: dict[str, Any] = {
        "cwd": cwd_display,
        "added": [op.target.raw for op in committed if op.kind == "add"],
        "modified": [op.target.raw for op in committed if op.kind == "update"]
        + [op.dest.raw for op in committed if op.kind == "move" and op.dest is not None],
        "deleted": [op.target.raw for op in committed if op.kind == "delete"],
        "moved": [{"from": op.target.raw, "to": op.dest.raw}
                  for op in committed if op.kind == "move" and op.dest is not None],
        "operations": [_operation(r) for r in report.results],
        "created_dirs": list(report.created_dirs),
    }
    if report.error is not None:
        out["error"] = "commit_failed"
        out["message"] = report.error
    return out


def _operation(result: OpResult) -> dict[str, Any]:
    op = result.operation
    entry: dict[str, Any] = {"op": op.kind, "path": op.target.raw, "status": result.status}
    if op.dest is not None:
        entry["to"] = op.dest.raw
    if result.error is not None:
        entry["error"] = result.error
    return entry
