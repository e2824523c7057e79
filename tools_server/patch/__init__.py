"""apply_patch: a Codex-compatible, preflighted, format-preserving patch tool (seed 004 §4.4, §5.4).

Modules, each with one job: `parser` (patch text → hunks), `matcher` (where chunks apply),
`text` (file bytes ↔ lines with BOM/EOL/final newline kept), `paths` (containment and
symlinks), `preflight` (every check and every new content, before any write), `commit`
(stage, then commit in order and report honestly), `engine` (the sequence), `report`
(texts and details), `spec` (function spec and Lark grammar), `family` (the registry entry).
"""

from tools_server.patch.family import ApplyPatchArgs, PatchFamily, create_family

__all__ = ["ApplyPatchArgs", "PatchFamily", "create_family"]
