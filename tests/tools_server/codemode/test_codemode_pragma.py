"""The `// @exec:` pragma parser (seed 004 §5.7): a pure function, every rule."""

from __future__ import annotations

import pytest

from tools_server.codemode.pragma import PragmaError, parse_pragma


def test_no_pragma_keeps_the_code_and_the_arguments() -> None:
    p = parse_pragma("print(1)\n", 500, None)
    assert (p.source, p.yield_time_ms, p.max_output_tokens) == ("print(1)\n", 500, None)


def test_pragma_sets_both_and_blanks_its_line() -> None:
    p = parse_pragma('  // @exec: {"yield_time_ms": 1200, "max_output_tokens": 50}\nprint(1)\nboom()')
    assert p.yield_time_ms == 1200 and p.max_output_tokens == 50
    assert p.source == "\nprint(1)\nboom()"  # line 2 stays line 2
    assert p.source.count("\n") == 2


@pytest.mark.parametrize("line, message", [
    ('// @exec: {"timeout": 3}', "only supports `yield_time_ms` and `max_output_tokens`; got `timeout`"),
    ("// @exec: {yield_time_ms: 3}", "not valid JSON"),
    ('// @exec: [1]', "must be a JSON object"),
    ('// @exec: {"yield_time_ms": -1}', "non-negative integer"),
    ('// @exec: {"yield_time_ms": 1.5}', "non-negative integer"),
    ('// @exec: {"max_output_tokens": true}', "non-negative integer"),
    ('// @exec: {"yield_time_ms": 9007199254740992}', "non-negative integer"),
])
def test_bad_pragmas_are_refused(line: str, message: str) -> None:
    with pytest.raises(PragmaError, match=message.replace("(", r"\(").replace("`", "`")):
        parse_pragma(line + "\nprint(1)")


def test_pragma_needs_source_after_it() -> None:
    with pytest.raises(PragmaError, match="followed by JavaScript"):
        parse_pragma('// @exec: {"yield_time_ms": 100}\n  \n')


def test_conflict_with_an_explicit_argument_is_refused_but_agreement_is_not() -> None:
    with pytest.raises(PragmaError, match="conflicts with the `yield_time_ms` argument"):
        parse_pragma('// @exec: {"yield_time_ms": 100}\nx', yield_time_ms=200)
    assert parse_pragma('// @exec: {"yield_time_ms": 100}\nx', yield_time_ms=100).yield_time_ms == 100


def test_a_pragma_on_a_later_line_is_just_a_comment() -> None:
    code = 'x = 1\n// @exec: {"bogus": 1}\n'
    assert parse_pragma(code).source == code
