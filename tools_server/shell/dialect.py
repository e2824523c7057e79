"""The one dialect normaliser for exec_command / write_stdin (seed 004 §5.6).

Codex spellings and their aliases map onto one request shape. Equal duplicates pass;
conflicting duplicates, unsupported Codex fields and unknown fields are refused here,
before any admission, hook or spawn. Pure: a dict in, a request or a ShellError out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools_server.shell import limits
from tools_server.shell.errors import ShellError

EXEC = "exec_command"
WRITE = "write_stdin"

# canonical name -> accepted spellings (the first one is Codex's)
_EXEC_ALIASES: dict[str, tuple[str, ...]] = {
    "cmd": ("cmd", "command"),
    "workdir": ("workdir", "cwd"),
    "yield_time_ms": ("yield_time_ms", "yieldTimeMs"),
    "tty": ("tty",),
}
_WRITE_ALIASES: dict[str, tuple[str, ...]] = {
    "session_id": ("session_id", "sessionId"),
    "chars": ("chars", "input"),
    "yield_time_ms": ("yield_time_ms", "yieldTimeMs"),
    "closeStdin": ("closeStdin", "close_stdin"),
    "terminate": ("terminate",),
}
_BUDGET_FIELDS = ("max_output_tokens", "maxOutputBytes")

# Codex fields we know and deliberately do not support: say so instead of "unknown".
_UNSUPPORTED: dict[str, str] = {
    "shell": "the shell is fixed by the server configuration (shell.shell); drop `shell`",
    "login": "commands run as `<shell> -c`, not as a login shell; drop `login`",
    "sandbox_permissions": "this server has no sandbox escalation; drop `sandbox_permissions`",
    "justification": "this server has no approval flow; drop `justification`",
    "prefix_rule": "this server has no approval flow; drop `prefix_rule`",
    "additional_permissions": "this server has no sandbox escalation; drop `additional_permissions`",
    "environment_id": "there is one environment; drop `environment_id`",
    "timeout_ms": "use `yield_time_ms`, then poll with write_stdin or stop with terminate",
    "with_escalated_permissions": "this server has no sandbox escalation; drop it",
}


@dataclass(frozen=True)
class ExecRequest:
    cmd: str
    workdir: str | None
    yield_ms: int
    max_output_bytes: int


@dataclass(frozen=True)
class WriteRequest:
    session_id: str
    chars: str
    yield_ms: int
    max_output_bytes: int
    close_stdin: bool
    terminate: bool

    @property
    def is_poll(self) -> bool:
        return self.chars == "" and not self.close_stdin and not self.terminate


_MISSING = object()


def _pick(tool: str, raw: dict[str, Any], canonical: str, spellings: tuple[str, ...]) -> Any:
    present = [(name, raw[name]) for name in spellings if name in raw]
    if not present:
        return _MISSING
    first_name, first = present[0]
    for name, value in present[1:]:
        if not _same(first, value):
            raise ShellError(tool, "conflicting-alias",
                             f"`{first_name}` and `{name}` disagree; send only one of them")
    return first


def _same(a: Any, b: Any) -> bool:
    # bool is an int in Python: True must not equal 1 here
    return type(a) is type(b) and a == b


def _int(tool: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ShellError(tool, "invalid-arguments", f"`{name}` must be a number")
    if isinstance(value, float) and not value.is_integer():
        raise ShellError(tool, "invalid-arguments", f"`{name}` must be a whole number")
    return int(value)


def _bool(tool: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ShellError(tool, "invalid-arguments", f"`{name}` must be true or false")
    return value


def _check_fields(tool: str, raw: dict[str, Any], own: dict[str, tuple[str, ...]],
                  other: dict[str, tuple[str, ...]]) -> None:
    known = {s for spellings in own.values() for s in spellings} | set(_BUDGET_FIELDS)
    other_names = {s for spellings in other.values() for s in spellings} - known
    other_tool = WRITE if tool == EXEC else EXEC
    for name in raw:
        if name in known:
            continue
        if name in _UNSUPPORTED:
            raise ShellError(tool, "unsupported-field", f"`{name}` is not supported: {_UNSUPPORTED[name]}")
        if name in other_names:
            raise ShellError(tool, "invalid-arguments", f"`{name}` belongs to {other_tool}, not {tool}")
        accepted = ", ".join(spellings[0] for spellings in own.values())
        raise ShellError(tool, "invalid-arguments",
                         f"unknown field `{name}`; {tool} accepts {accepted}, max_output_tokens")


def _budget(tool: str, raw: dict[str, Any]) -> int:
    values: list[tuple[str, int]] = []
    if "max_output_tokens" in raw:
        tokens = _int(tool, "max_output_tokens", raw["max_output_tokens"])
        values.append(("max_output_tokens", tokens * limits.BYTES_PER_TOKEN))
    if "maxOutputBytes" in raw:
        values.append(("maxOutputBytes", _int(tool, "maxOutputBytes", raw["maxOutputBytes"])))
    if len(values) == 2 and values[0][1] != values[1][1]:
        raise ShellError(tool, "conflicting-alias",
                         "`max_output_tokens` (×4 bytes) and `maxOutputBytes` disagree; send only one")
    if not values:
        return limits.DEFAULT_MAX_OUTPUT_TOKENS * limits.BYTES_PER_TOKEN
    if values[0][1] < 0:
        raise ShellError(tool, "invalid-arguments", f"`{values[0][0]}` must not be negative")
    return min(values[0][1], limits.MAX_OUTPUT_BYTES_CAP)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def normalize_exec(raw: Any) -> ExecRequest:
    tool = EXEC
    if not isinstance(raw, dict):
        raise ShellError(tool, "invalid-arguments", "arguments must be a JSON object")
    _check_fields(tool, raw, _EXEC_ALIASES, _WRITE_ALIASES)
    cmd = _pick(tool, raw, "cmd", _EXEC_ALIASES["cmd"])
    if cmd is _MISSING:
        raise ShellError(tool, "invalid-arguments", "missing required field `cmd` (the shell command)")
    if not isinstance(cmd, str):
        raise ShellError(tool, "invalid-arguments", "`cmd` must be one string, run by the shell")
    if not cmd.strip():
        raise ShellError(tool, "invalid-arguments", "`cmd` is empty; send the command to run")
    if "\x00" in cmd:
        raise ShellError(tool, "invalid-arguments", "`cmd` must not contain NUL characters")
    workdir = _pick(tool, raw, "workdir", _EXEC_ALIASES["workdir"])
    if workdir is _MISSING:
        workdir = None
    elif not isinstance(workdir, str) or not workdir or "\x00" in workdir:
        raise ShellError(tool, "invalid-arguments", "`workdir` must be a non-empty path string")
    tty = _pick(tool, raw, "tty", _EXEC_ALIASES["tty"])
    if tty is not _MISSING and _bool(tool, "tty", tty):
        raise ShellError(tool, "tty-unsupported",
                         "no PTY here: sessions use pipes; drop `tty` (stdin stays writable via write_stdin)")
    yield_raw = _pick(tool, raw, "yield_time_ms", _EXEC_ALIASES["yield_time_ms"])
    yield_ms = (limits.EXEC_YIELD_DEFAULT_MS if yield_raw is _MISSING
                else _int(tool, "yield_time_ms", yield_raw))
    return ExecRequest(
        cmd=cmd,
        workdir=workdir,
        yield_ms=_clamp(yield_ms, limits.EXEC_YIELD_MIN_MS, limits.EXEC_YIELD_MAX_MS),
        max_output_bytes=_budget(tool, raw),
    )


def session_key(tool: str, value: Any) -> str:
    """Session ids are opaque strings; a whole number (as Codex models send it) names the same id."""
    if isinstance(value, bool):
        raise ShellError(tool, "invalid-arguments", "`session_id` must be the id string from exec_command")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ShellError(tool, "invalid-arguments", "`session_id` must be the id string from exec_command")


def normalize_write(raw: Any, poll_max_ms: int = limits.POLL_YIELD_MAX_MS_DEFAULT) -> WriteRequest:
    tool = WRITE
    if not isinstance(raw, dict):
        raise ShellError(tool, "invalid-arguments", "arguments must be a JSON object")
    _check_fields(tool, raw, _WRITE_ALIASES, _EXEC_ALIASES)
    # ids compare by their normalised key so 123 and "123" are an equal duplicate
    keys = {name: session_key(tool, raw[name]) for name in _WRITE_ALIASES["session_id"] if name in raw}
    if not keys:
        raise ShellError(tool, "invalid-arguments", "missing required field `session_id`")
    if len(set(keys.values())) > 1:
        raise ShellError(tool, "conflicting-alias", "`session_id` and `sessionId` disagree; send only one")
    session_id = next(iter(keys.values()))
    chars = _pick(tool, raw, "chars", _WRITE_ALIASES["chars"])
    if chars is _MISSING or chars is None:
        chars = ""
    if not isinstance(chars, str):
        raise ShellError(tool, "invalid-arguments", "`chars` must be a string (the exact bytes to send)")
    close_raw = _pick(tool, raw, "closeStdin", _WRITE_ALIASES["closeStdin"])
    close_stdin = False if close_raw is _MISSING else _bool(tool, "closeStdin", close_raw)
    term_raw = _pick(tool, raw, "terminate", _WRITE_ALIASES["terminate"])
    terminate = False if term_raw is _MISSING else _bool(tool, "terminate", term_raw)
    if terminate and chars:
        raise ShellError(tool, "invalid-arguments",
                         "`terminate` cannot carry input; send the input first or stop without `chars`")
    yield_raw = _pick(tool, raw, "yield_time_ms", _WRITE_ALIASES["yield_time_ms"])
    if chars or close_stdin or terminate:
        yield_ms = (limits.WRITE_YIELD_DEFAULT_MS if yield_raw is _MISSING
                    else _int(tool, "yield_time_ms", yield_raw))
        yield_ms = _clamp(yield_ms, limits.WRITE_YIELD_MIN_MS, limits.WRITE_YIELD_MAX_MS)
    else:
        # an empty poll is a long poll, as in Codex
        yield_ms = (limits.POLL_YIELD_MIN_MS if yield_raw is _MISSING
                    else _int(tool, "yield_time_ms", yield_raw))
        yield_ms = _clamp(yield_ms, limits.POLL_YIELD_MIN_MS, max(limits.POLL_YIELD_MIN_MS, poll_max_ms))
    return WriteRequest(
        session_id=session_id,
        chars=chars,
        yield_ms=yield_ms,
        max_output_bytes=_budget(tool, raw),
        close_stdin=close_stdin,
        terminate=terminate,
    )
