"""The tool's two transports: a JSON function spec and a Responses `custom` tool with a Lark grammar."""

from __future__ import annotations

from typing import Any

# Codex's grammar for the freeform apply_patch tool (openai/codex, codex-rs/core/src/tools/handlers/
# apply_patch.lark, Apache-2.0), unchanged so that constrained sampling matches what models learned.
LARK_GRAMMAR = r"""start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""

CUSTOM_FORMAT: dict[str, Any] = {"type": "grammar", "syntax": "lark", "definition": LARK_GRAMMAR}

DESCRIPTION = """\
Edit files with a patch: add, delete, update and move files in one call. The patch text:
*** Begin Patch
*** Add File: docs/new.md
+Every line of a new file starts with '+'.
*** Delete File: old/unused.py
*** Update File: src/app.py
*** Move to: src/main.py
@@ def handle(request):
     context = request.context
-    return None
+    return respond(context)
*** End Patch
Update hunks: ' ' marks an unchanged context line, '-' a removed line, '+' an added line. Give \
about 3 unchanged lines above and below each change so that it matches exactly one place; an \
'@@ <line>' locator names a line above the change (a function or class) to narrow the search. \
Several '@@' chunks may edit one file, in file order; '*** End of File' after a chunk anchors \
it at the end of the file. 'Move to' is optional. Paths are relative to the working directory \
and stay inside it. Nothing is written unless every operation checks out first. As a function \
tool, pass the patch in `patch`; as a freeform tool, send the patch text itself, not JSON."""

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "patch": {
            "type": "string",
            "description": "The entire patch, from '*** Begin Patch' to '*** End Patch'.",
        },
        "cwd": {
            "type": "string",
            "description": "Optional working directory for the patch paths, relative to the workspace "
            "root (or absolute inside it). Defaults to the workspace root.",
        },
    },
    "required": ["patch"],
    "additionalProperties": False,
}
