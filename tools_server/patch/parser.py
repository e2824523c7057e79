"""The Codex patch format: `*** Begin Patch` … `*** End Patch` into hunks (pure, no I/O).

Follows the lenient parser of Codex's `apply-patch` crate: markers may be padded with
whitespace, CRLF patches work, a heredoc wrapper (`apply_patch <<'EOF'` … `EOF`) is removed,
a bare empty line in an Update hunk is an empty context line, and lines before any `@@`
start an implicit first chunk. Errors carry the line number in the text as sent.
"""

from __future__ import annotations

import enum
import re
import shlex

from tools_server.patch.model import AddFile, Chunk, DeleteFile, Hunk, Patch, PatchSyntaxError, UpdateFile

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
END_OF_FILE = "*** End of File"
ENVIRONMENT = "*** Environment ID:"
CONTEXT = "@@ "
BARE_CONTEXT = "@@"

VALID_HEADERS = "valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'"
LINE_PREFIXES = "every line should start with ' ' (context line), '+' (added line), or '-' (removed line)"

# `[cd DIR &&] apply_patch <<'EOF'`, or a bare `<<EOF` as Codex's lenient mode accepts it.
_HEREDOC = re.compile(
    r"""^(?:cd\s+(?P<dir>'[^']*'|"[^"]*"|[^\s'"&;|]+)\s*&&\s*)?"""
    r"""(?:(?:apply_patch|applypatch)\s*)?<<\s*(?P<q>['"]?)(?P<delim>[A-Za-z_][A-Za-z0-9_]*)(?P=q)$"""
)


def parse_patch(text: str) -> Patch:
    lines, first_line_number, workdir = _envelope(text)
    parser = _Parser(first_line_number)
    for index, line in enumerate(lines):
        parser.feed(line, last=index == len(lines) - 1)
    return Patch(hunks=parser.finish(), workdir=workdir)


def _split(text: str) -> list[str]:
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _has_boundaries(lines: list[str]) -> str | None:
    """None when the first and last lines are the markers; else the error to report."""
    if not lines or lines[0].strip() != BEGIN:
        return "the first line of the patch must be '*** Begin Patch'"
    if lines[-1].strip() != END:
        return "the last line of the patch must be '*** End Patch'"
    return None


def _envelope(text: str) -> tuple[list[str], int, str | None]:
    """The patch lines between (and including) the markers, the number of the first, and a workdir."""
    stripped = text.strip()
    leading = text[: len(text) - len(text.lstrip())].count("\n")
    lines = _split(stripped)
    error = _has_boundaries(lines)
    if error is None:
        return lines, leading + 1, None
    match = _HEREDOC.match(lines[0].strip())
    if match and len(lines) >= 4 and lines[-1].strip() == match["delim"]:
        inner = lines[1:-1]
        inner_error = _has_boundaries(inner)
        if inner_error is None:
            workdir = match["dir"]
            if workdir is not None:
                workdir = shlex.split(workdir)[0] if workdir[:1] in "'\"" else workdir
            return inner, leading + 2, workdir
        error = inner_error
    raise PatchSyntaxError(
        error + "; send the whole patch from '*** Begin Patch' to '*** End Patch' as the argument"
    )


class _Mode(enum.Enum):
    NOT_STARTED = 0
    STARTED = 1
    ADD = 2
    DELETE = 3
    UPDATE = 4
    ENDED = 5


class _Parser:
    def __init__(self, first_line_number: int):
        self.mode = _Mode.NOT_STARTED
        self.hunks: list[Hunk] = []
        self.number = first_line_number - 1  # the number of the line being fed
        self._handlers = {
            _Mode.NOT_STARTED: self._not_started,
            _Mode.STARTED: self._between_hunks,
            _Mode.ADD: self._add,
            _Mode.DELETE: self._between_hunks,
            _Mode.UPDATE: self._update,
            _Mode.ENDED: self._ended,
        }

    def feed(self, line: str, last: bool) -> None:
        self.number += 1
        # The final line ends the patch when it trims to the marker, whatever the mode
        # (this is what lets ` *** End Patch` with a leading space close an Update hunk).
        if last and line.strip() == END:
            self._check_update_not_empty(END)
            self.mode = _Mode.ENDED
            return
        self._handlers[self.mode](line)

    def finish(self) -> list[Hunk]:
        if self.mode is not _Mode.ENDED:
            raise PatchSyntaxError("the last line of the patch must be '*** End Patch'")
        return self.hunks

    # -- modes -------------------------------------------------------------------------------

    def _not_started(self, line: str) -> None:
        if line.strip() == BEGIN:
            self.mode = _Mode.STARTED
            return
        raise PatchSyntaxError("the first line of the patch must be '*** Begin Patch'")

    def _between_hunks(self, line: str) -> None:
        trimmed = line.strip()
        if self._header(trimmed):
            return
        raise self._error(f"'{trimmed}' is not a valid hunk header; {VALID_HEADERS}")

    def _add(self, line: str) -> None:
        trimmed = line.strip()
        if self._header(trimmed):
            return
        if line.startswith("+"):
            hunk = self.hunks[-1]
            assert isinstance(hunk, AddFile)
            hunk.contents += line[1:] + "\n"
            return
        raise self._error(
            f"'{trimmed}' is not a valid hunk header, and every line of an Add File hunk "
            f"starts with '+' (write an empty line as '+'); {VALID_HEADERS}"
        )

    def _ended(self, line: str) -> None:
        if line.strip():
            raise PatchSyntaxError("the last line of the patch must be '*** End Patch'; "
                                   f"line {self.number} follows it")

    def _update(self, line: str) -> None:
        hunk = self.hunks[-1]
        assert isinstance(hunk, UpdateFile)
        chunks = hunk.chunks
        last = chunks[-1] if chunks else None
        # The common case first: a ' ', '+' or '-' line can be no header or marker.
        if line[:1] in (" ", "+", "-") and line and (last is None or not last.end_of_file):
            self._change_line(hunk, line)
            return
        # Inside an Update hunk only the right side is trimmed when looking for headers,
        # so an indented `*** Update File:` is context text (as in Codex).
        text = line.rstrip()
        if self._header(text):
            return

        if last is not None and last.end_of_file:
            if not text:
                return
            if text != BARE_CONTEXT and not text.startswith(CONTEXT):
                raise self._error(
                    f"expected a new '@@' chunk or a hunk header after '*** End of File', got: '{line}'"
                )
        if not chunks and hunk.move_to is None and text.startswith(MOVE):
            hunk.move_to = self._path(text[len(MOVE):], MOVE)
            return
        if text == BARE_CONTEXT or text.startswith(CONTEXT):
            if last is not None and last.is_empty():
                raise self._error(f"unexpected line found in update hunk: '{line}'; {LINE_PREFIXES}")
            context = None if text == BARE_CONTEXT else text[len(CONTEXT):]
            chunks.append(Chunk(context=context, line=self.number, source=[text]))
            return
        if text == END_OF_FILE:
            if last is None or last.is_empty():
                raise self._error("update hunk does not contain any lines before '*** End of File'")
            last.end_of_file = True
            last.source.append(text)
            return
        if line == "" or line[0] in " +-":
            self._change_line(hunk, line)
            return
        if last is not None and not last.is_empty():
            raise self._error(
                f"expected update hunk lines or a new '@@' chunk, got: '{line}'; {LINE_PREFIXES}"
            )
        raise self._error(f"unexpected line found in update hunk: '{line}'; {LINE_PREFIXES}")

    def _change_line(self, hunk: UpdateFile, line: str) -> None:
        """A context (' ' or a bare empty line), added ('+') or removed ('-') line."""
        if not hunk.chunks:
            hunk.chunks.append(Chunk(context=None, line=self.number))
        last = hunk.chunks[-1]
        body = line[1:]
        if line == "" or line[0] == " ":
            last.new_ref.append(len(last.old))
            last.old.append(body)
            last.new.append(body)
        elif line[0] == "+":
            last.new_ref.append(None)
            last.new.append(body)
        else:
            last.old.append(body)
        last.source.append(line)

    # -- helpers -----------------------------------------------------------------------------

    def _header(self, text: str) -> bool:
        """Handle `text` if it is a hunk header or End Patch; False otherwise."""
        if self.mode is _Mode.STARTED and text.startswith(ENVIRONMENT):
            raise self._error(
                "'*** Environment ID' is not supported: this tool edits one workspace; remove that line"
            )
        if text == END:
            self._check_update_not_empty(text)
            self.mode = _Mode.ENDED
            return True
        for marker, mode in ((ADD, _Mode.ADD), (DELETE, _Mode.DELETE), (UPDATE, _Mode.UPDATE)):
            if text.startswith(marker):
                self._check_update_not_empty(text)
                path = self._path(text[len(marker):], marker)
                if mode is _Mode.ADD:
                    self.hunks.append(AddFile(path=path, line=self.number))
                elif mode is _Mode.DELETE:
                    self.hunks.append(DeleteFile(path=path, line=self.number))
                else:
                    self.hunks.append(UpdateFile(path=path, line=self.number))
                self.mode = mode
                return True
        return False

    def _check_update_not_empty(self, next_line: str) -> None:
        if self.mode is not _Mode.UPDATE:
            return
        hunk = self.hunks[-1]
        assert isinstance(hunk, UpdateFile)
        if not hunk.chunks:
            raise PatchSyntaxError(
                f"Update File hunk for path '{hunk.path}' is empty; add '@@' chunks with "
                "' ', '-' and '+' lines", line=hunk.line)
        if hunk.chunks[-1].is_empty():
            if next_line == END:
                raise self._error("update hunk does not contain any lines after '@@'")
            raise self._error(f"unexpected line found in update hunk: '{next_line}'; {LINE_PREFIXES}")

    def _path(self, raw: str, marker: str) -> str:
        if not raw.strip():
            raise self._error(f"'{marker.strip()}' needs a file path")
        if "\x00" in raw:
            raise self._error("file paths cannot contain NUL characters")
        return raw

    def _error(self, message: str) -> PatchSyntaxError:
        return PatchSyntaxError(message, line=self.number)
