"""Virtual note paths (seed 000; pure).

Relative paths belong to the calling agent; another agent's notes are `/root/…/notes/<path>`.
Components are never empty, `.` or `..`; no backslashes or NUL; no shell expansion happens.
A note path has at most MAX_DEPTH components, each at most 255 UTF-8 bytes, and at most
MAX_PATH_BYTES in all: every note can be created, read and listed on any POSIX file system.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from proxy.errors import CtproxyError
from proxy.items.addresses import AddressError, validate_address

_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 1024  # the path inside the agent's notes
MAX_DEPTH = 32  # components of that path
MAX_ARGUMENT_CHARS = 2048  # the whole argument, agent address included, checked before anything else


class NotePathError(CtproxyError, ValueError):
    """A path the model got wrong; the message says what a valid one looks like."""


@dataclass(frozen=True)
class NoteRef:
    address: str  # the owning agent
    rel: str  # path inside the agent's notes ("" = the root, for prefixes)
    absolute: bool  # given as /root/…/notes/…: show paths back the same way

    def shown(self, rel: str | None = None) -> str:
        r = self.rel if rel is None else rel
        return printable(f"{self.address}/notes/{r}" if self.absolute else r)


def check_task_id(task_id: str) -> str:
    if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
        raise NotePathError(f"invalid task id {task_id!r}")
    return task_id


def quoted(path: str, limit: int = 120) -> str:
    """`repr` of a path for an error message, cut when long so the message stays short."""
    return repr(path) if len(path) <= limit else f"{path[:limit]!r}… ({len(path)} characters)"


_LINE_BREAKING = frozenset("\x7f\x85\u2028\u2029")


def printable(path: str) -> str:
    """A path as the tools print it: itself, or JSON-quoted when it holds a control character (a note
    made before those were refused), so it can never start a line of its own."""
    if any(ch < " " or ch in _LINE_BREAKING for ch in path):
        return json.dumps(path, ensure_ascii=False)
    return path


def check_rel(rel: str, *, allow_trailing_empty: bool = False, shown: str | None = None) -> None:
    """A path inside an agent's notes: raise NotePathError unless the tools can use it."""
    _check_components(rel.split("/"), rel if shown is None else shown, allow_trailing_empty)


def is_valid_rel(rel: str) -> bool:
    try:
        rel.encode("utf-8")
        check_rel(rel)
    except (NotePathError, UnicodeEncodeError):
        return False
    return True


def _check_components(parts: list[str], path: str, allow_trailing_empty: bool) -> None:
    shown = quoted(path)
    if len(parts) > MAX_DEPTH:
        raise NotePathError(f"invalid note path {shown}: more than {MAX_DEPTH} levels of directories")
    if len("/".join(parts).encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise NotePathError(f"invalid note path {shown}: longer than {MAX_PATH_BYTES} bytes; use a shorter path")
    for i, part in enumerate(parts):
        if part == "" and allow_trailing_empty and i == len(parts) - 1:
            continue
        if part in ("", ".", ".."):
            raise NotePathError(f"invalid note path {shown}: empty, '.' and '..' components are not allowed")
        if "\\" in part or "\x00" in part:
            raise NotePathError(f"invalid note path {shown}: backslashes and NUL are not allowed")
        if any(ch < " " or ch in _LINE_BREAKING for ch in part):
            # a newline in a path would forge lines of the tools' `path:line: text` output (seed 000)
            raise NotePathError(f"invalid note path {shown}: control characters (newlines, tabs, …) are not "
                                "allowed")
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            raise NotePathError(f"invalid note path {shown}: a component is longer than 255 bytes")


def parse(path: str, caller: str, is_agent: Callable[[str], bool], *, prefix: bool = False) -> NoteRef:
    """Resolve a note path (or, with `prefix`, a path prefix) to its agent and relative path."""
    if not isinstance(path, str):
        raise NotePathError("the path must be a string")
    if len(path) > MAX_ARGUMENT_CHARS:
        raise NotePathError(f"invalid note path {quoted(path)}: longer than {MAX_ARGUMENT_CHARS} characters")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise NotePathError("invalid note path: it is not valid Unicode (a lone surrogate); send UTF-8 text") from None
    if not path.startswith("/"):
        if not prefix and not path:
            raise NotePathError("empty note path: give a relative path like 'checkpoint.md'")
        if path:
            _check_components(path.split("/"), path, allow_trailing_empty=prefix)
        return NoteRef(caller, path, False)
    segments = path.split("/")[1:]
    candidates = [i for i, seg in enumerate(segments) if seg == "notes" and i >= 1]
    if not candidates:
        raise NotePathError(f"invalid note path {quoted(path)}: another agent's notes are addressed as "
                            "/root/<agent>/notes/<path>; relative paths are your own notes")
    first_error: str | None = None
    for i in candidates:
        address = "/" + "/".join(segments[:i])
        try:
            validate_address(address)
        except AddressError as exc:
            first_error = first_error or (str(exc) if len(str(exc)) <= 300 else str(exc)[:300] + "…")
            continue
        if address == caller or is_agent(address):
            rel = "/".join(segments[i + 1:])
            if rel:
                _check_components(rel.split("/"), path, allow_trailing_empty=prefix)
            elif not prefix:
                raise NotePathError(f"invalid note path {quoted(path)}: name a file after /notes/")
            return NoteRef(address, rel, True)
        first_error = first_error or (f"unknown agent {quoted(address)} in this task: only agents registered "
                                      "in the same task can be addressed")
    raise NotePathError(first_error or f"invalid note path {quoted(path)}")
