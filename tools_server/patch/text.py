"""Source files as lines, and back to bytes with the same format (pure, no I/O).

What is kept: a UTF-8 BOM, the line-ending style (LF or CRLF), and whether the file ends
with a line ending. A file with no lines (0 bytes, or only a BOM) has no style to keep and
is written the way Add File writes: LF endings and a final newline (after the BOM if any).
"""

from __future__ import annotations

from dataclasses import dataclass

from tools_server.patch.model import PatchError

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SourceText:
    lines: list[str]
    bom: bool
    eol: str  # "\n" or "\r\n"
    final_newline: bool

    @property
    def empty(self) -> bool:
        return not self.lines


def decode_source(data: bytes, label: str) -> SourceText:
    """Split a file into lines; refuse what cannot be written back faithfully."""
    bom = data.startswith(BOM)
    body = data[len(BOM):] if bom else data
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = exc.start + (len(BOM) if bom else 0)
        raise PatchError(
            f"{label} is not valid UTF-8 (byte {offset}); apply_patch edits UTF-8 text files only",
            code="not_utf8",
        ) from None
    if not text:
        return SourceText(lines=[], bom=bom, eol="\n", final_newline=False)
    eol = _line_ending(text, label)
    lines = text.split(eol)
    final_newline = lines[-1] == ""
    if final_newline:
        lines.pop()
    return SourceText(lines=lines, bom=bom, eol=eol, final_newline=final_newline)


def _line_ending(text: str, label: str) -> str:
    crs = text.count("\r")
    if crs == 0:
        return "\n"
    crlfs = text.count("\r\n")
    if crs != crlfs:
        line = text.count("\n", 0, _bare_cr_at(text)) + 1
        raise PatchError(
            f"{label} has a bare CR line ending (line {line}); apply_patch only edits files whose "
            "lines all end in LF or all in CRLF",
            code="line_endings",
        )
    if text.count("\n") != crlfs:
        raise PatchError(
            f"{label} mixes LF and CRLF line endings; apply_patch only edits files whose lines all "
            "end in LF or all in CRLF (normalise the file first)",
            code="line_endings",
        )
    return "\r\n"


def _bare_cr_at(text: str) -> int:
    start = 0
    while True:
        index = text.index("\r", start)
        if not text.startswith("\r\n", index):
            return index
        start = index + 2


def encode_lines(lines: list[str], source: SourceText) -> bytes:
    """The new content of an updated file, in the source's format."""
    if source.empty:
        body = "".join(line + "\n" for line in lines)
    elif not lines:
        body = ""
    else:
        body = source.eol.join(lines) + (source.eol if source.final_newline else "")
    data = body.encode("utf-8")
    return BOM + data if source.bom else data


def check_no_cr(lines: list[str], label: str) -> None:
    """New text must not bring a carriage return inside a line (it would mix line endings)."""
    for line in lines:
        if "\r" in line:
            raise PatchError(
                f"a line for {label} contains a carriage return inside the line; remove the stray "
                "'\\r' (line endings are kept as the file has them)",
                code="line_endings",
            )
