"""Pure parts of shell sessions: the dialect normaliser, the rolling preview, the budgeted read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools_server.shell import limits
from tools_server.shell.dialect import normalize_exec, normalize_write
from tools_server.shell.errors import ShellError
from tools_server.shell.preview import RollingPreview, StreamDecoder, fit, read_both


def code(exc: pytest.ExceptionInfo[ShellError]) -> str:
    return exc.value.code


# -- dialect -------------------------------------------------------------------------------------------
def test_exec_defaults_and_aliases() -> None:
    req = normalize_exec({"command": "ls", "cwd": "sub", "yieldTimeMs": 1000})
    assert (req.cmd, req.workdir, req.yield_ms) == ("ls", "sub", 1000)
    assert req.max_output_bytes == limits.DEFAULT_MAX_OUTPUT_TOKENS * 4
    assert normalize_exec({"cmd": "ls"}).yield_ms == 10_000


def test_exec_yield_is_clamped_like_codex() -> None:
    assert normalize_exec({"cmd": "x", "yield_time_ms": 1}).yield_ms == 250
    assert normalize_exec({"cmd": "x", "yield_time_ms": 10**9}).yield_ms == 30_000


def test_equal_duplicates_pass_conflicts_refused() -> None:
    assert normalize_exec({"cmd": "ls", "command": "ls"}).cmd == "ls"
    with pytest.raises(ShellError) as exc:
        normalize_exec({"cmd": "ls", "command": "pwd"})
    assert code(exc) == "conflicting-alias"
    with pytest.raises(ShellError) as exc:
        normalize_exec({"cmd": "ls", "workdir": "a", "cwd": "b"})
    assert code(exc) == "conflicting-alias"


def test_budget_tokens_to_bytes_and_conflict() -> None:
    assert normalize_exec({"cmd": "x", "max_output_tokens": 10}).max_output_bytes == 40
    assert normalize_exec({"cmd": "x", "maxOutputBytes": 7}).max_output_bytes == 7
    assert normalize_exec({"cmd": "x", "max_output_tokens": 10, "maxOutputBytes": 40}).max_output_bytes == 40
    with pytest.raises(ShellError) as exc:
        normalize_exec({"cmd": "x", "max_output_tokens": 10, "maxOutputBytes": 41})
    assert code(exc) == "conflicting-alias"


@pytest.mark.parametrize("field", ["shell", "login", "sandbox_permissions", "justification", "prefix_rule"])
def test_unsupported_codex_fields(field: str) -> None:
    with pytest.raises(ShellError) as exc:
        normalize_exec({"cmd": "ls", field: "x"})
    assert code(exc) == "unsupported-field"
    assert field in exc.value.message


def test_tty_true_refused_false_accepted() -> None:
    assert normalize_exec({"cmd": "ls", "tty": False}).cmd == "ls"
    with pytest.raises(ShellError) as exc:
        normalize_exec({"cmd": "ls", "tty": True})
    assert code(exc) == "tty-unsupported"
    assert "PTY" in exc.value.message


def test_unknown_and_foreign_fields() -> None:
    with pytest.raises(ShellError) as exc:
        normalize_exec({"cmd": "ls", "chars": "x"})
    assert "belongs to write_stdin" in exc.value.message
    with pytest.raises(ShellError) as exc:
        normalize_exec({"cmd": "ls", "bogus": 1})
    assert "unknown field `bogus`" in exc.value.message
    with pytest.raises(ShellError) as exc:
        normalize_write({"session_id": "1", "cmd": "ls"})
    assert "belongs to exec_command" in exc.value.message


def test_cmd_must_be_a_string() -> None:
    for bad in ({"cmd": ["bash", "-lc", "ls"]}, {"cmd": ""}, {}, {"cmd": 3}):
        with pytest.raises(ShellError):
            normalize_exec(bad)


def test_write_session_ids_and_yields() -> None:
    req = normalize_write({"session_id": 1234, "chars": "a"})
    assert (req.session_id, req.chars, req.yield_ms) == ("1234", "a", 250)
    assert normalize_write({"session_id": 1234, "sessionId": "1234"}).session_id == "1234"
    with pytest.raises(ShellError) as exc:
        normalize_write({"session_id": 1234, "sessionId": "99"})
    assert code(exc) == "conflicting-alias"
    poll = normalize_write({"sessionId": "abc"})
    assert poll.is_poll and poll.yield_ms == 5_000
    assert normalize_write({"session_id": "a", "yield_time_ms": 10**9}).yield_ms == 300_000
    assert normalize_write({"session_id": "a", "yield_time_ms": 10**9}, poll_max_ms=60_000).yield_ms == 60_000
    assert normalize_write({"session_id": "a", "chars": "x", "yield_time_ms": 10**9}).yield_ms == 30_000
    assert normalize_write({"session_id": "a", "input": "hi", "chars": "hi"}).chars == "hi"
    for bad in (True, 1.5, "", None):
        with pytest.raises(ShellError):
            normalize_write({"session_id": bad})


def test_terminate_with_input_refused() -> None:
    with pytest.raises(ShellError):
        normalize_write({"session_id": "1", "chars": "x", "terminate": True})
    assert normalize_write({"session_id": "1", "terminate": True}).terminate


def test_bool_is_not_a_number() -> None:
    with pytest.raises(ShellError):
        normalize_exec({"cmd": "x", "yield_time_ms": True})


# -- preview -------------------------------------------------------------------------------------------
def test_preview_drops_whole_code_points_from_the_front() -> None:
    preview = RollingPreview(limit=10)
    preview.append("€€€€".encode())  # 12 bytes
    drained = preview.drain()
    assert drained.data.decode() == "€€€"
    assert drained.dropped_bytes == 3 and drained.total_bytes == 12
    assert preview.drain().total_bytes == 0


@given(st.lists(st.text(max_size=40), max_size=30), st.integers(min_value=4, max_value=64))
def test_preview_keeps_a_valid_suffix(chunks: list[str], limit: int) -> None:
    preview = RollingPreview(limit=limit)
    whole = "".join(chunks).encode()
    for chunk in chunks:
        preview.append(chunk.encode())
    drained = preview.drain()
    text = drained.data.decode()  # never a broken code point
    assert whole.endswith(drained.data)
    assert len(drained.data) <= limit
    assert drained.dropped_bytes + len(drained.data) == len(whole) == drained.total_bytes
    if drained.dropped_bytes:  # only as much as needed was dropped, in whole code points
        assert len(drained.data) > limit - 4 and text


def test_decoder_holds_split_code_points() -> None:
    dec = StreamDecoder()
    euro = "€".encode()
    assert dec.feed(euro[:2]) == b""
    assert dec.feed(euro[2:] + b"x") == "€x".encode()
    assert dec.feed(b"\xff") == "\ufffd".encode()
    assert dec.feed(b"\xe2") == b"" and dec.finish() == "\ufffd".encode()


@given(st.text(min_size=0, max_size=300), st.integers(min_value=0, max_value=400))
def test_fit_respects_budget_and_code_points(text: str, budget: int) -> None:
    data = text.encode()
    shown, omitted = fit(data, budget)
    shown.decode()
    if len(data) <= budget:
        assert shown == data and omitted == 0
    else:
        assert len(shown) <= budget
        assert omitted > 0


def test_one_budget_stdout_first() -> None:
    out, err = RollingPreview(), RollingPreview()
    out.append(b"o" * 30)
    err.append(b"e" * 30)
    v_out, v_err = read_both(out.drain(), err.drain(), 40)
    assert v_out.text == "o" * 30 and not v_out.clipped
    assert len(v_err.text.encode()) <= 10 and v_err.truncated_bytes > 0
