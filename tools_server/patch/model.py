"""The parsed form of a patch and the errors the model sees."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.errors import CtproxyError


class PatchError(CtproxyError):
    """A failure found before any file was changed. `code` is a stable category for REST/MCP."""

    def __init__(self, message: str, code: str = "verification_failed", details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details or {}


class PatchSyntaxError(PatchError):
    """The patch text does not follow the format; `line` is 1-based in the text as sent."""

    def __init__(self, message: str, line: int | None = None):
        where = f"invalid hunk at line {line}, " if line is not None else "invalid patch: "
        super().__init__(where + message, code="invalid_patch", details={"line": line} if line else {})
        self.line = line
        self.reason = message


@dataclass
class Chunk:
    """One `@@` section of an Update File hunk."""

    context: str | None  # the `@@ <text>` locator, searched as one line before old_lines
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    # For each new line: the index of the old line it repeats when it is a context line, so a
    # whitespace-tolerant match keeps the file's own spelling of the context.
    new_ref: list[int | None] = field(default_factory=list)
    end_of_file: bool = False
    line: int = 0  # where the chunk starts in the patch (for error messages)
    source: list[str] = field(default_factory=list)  # the chunk's lines as written, to show on errors

    def is_empty(self) -> bool:
        return not self.old and not self.new


@dataclass
class AddFile:
    path: str
    contents: str = ""
    line: int = 0


@dataclass
class DeleteFile:
    path: str
    line: int = 0


@dataclass
class UpdateFile:
    path: str
    move_to: str | None = None
    chunks: list[Chunk] = field(default_factory=list)
    line: int = 0


Hunk = AddFile | DeleteFile | UpdateFile


@dataclass
class Patch:
    hunks: list[Hunk]
    workdir: str | None = None  # from a `cd DIR && apply_patch <<'EOF'` wrapper
