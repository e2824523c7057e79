"""The matcher and the text format: tiers, uniqueness, retries, and what is kept of a file's format."""

from __future__ import annotations

import pytest

from tools_server.patch.matcher import apply_chunks
from tools_server.patch.model import PatchError, UpdateFile
from tools_server.patch.parser import parse_patch
from tools_server.patch.text import decode_source, encode_lines


def update(body: str) -> UpdateFile:
    (hunk,) = parse_patch(f"*** Begin Patch\n*** Update File: f\n{body}\n*** End Patch").hunks
    assert isinstance(hunk, UpdateFile)
    return hunk


def run(source: bytes, body: str) -> bytes:
    text = decode_source(source, "f")
    return encode_lines(apply_chunks(text.lines, update(body).chunks, "f"), text)


def test_exact_match() -> None:
    assert run(b"a\nb\nc\n", "@@\n a\n-b\n+B\n c") == b"a\nB\nc\n"


def test_trailing_whitespace_tier_keeps_the_files_context_spelling() -> None:
    assert run(b"a  \nb\t\nc\n", "@@\n a\n-b\n+B\n c") == b"a  \nB\nc\n"


def test_surrounding_whitespace_tier() -> None:
    assert run(b"    a\n    b\n", "@@\n a\n-b\n+    B") == b"    a\n    B\n"


def test_first_tier_with_candidates_must_be_unique() -> None:
    with pytest.raises(PatchError) as info:
        run(b"x\ny\nx\ny\n", "@@\n x\n-y\n+z")
    assert info.value.code == "ambiguous_context"
    assert "matches 2 places" in info.value.message and "lines 1, 3" in info.value.message
    assert "-y" in info.value.message  # the chunk is shown


def test_an_exact_single_match_wins_over_fuzzy_ones() -> None:
    # Tier 1 yields one candidate; the trailing-space lines would only match in tier 2.
    assert run(b"x \ny\nx\ny\n", "@@\n x\n-y\n+z") == b"x \ny\nx\nz\n"


def test_ambiguity_is_judged_from_the_cursor_on() -> None:
    # The second chunk only sees what follows the first one.
    assert run(b"a\nx\nb\nx\n", "@@\n a\n-x\n+1\n@@\n b\n-x\n+2") == b"a\n1\nb\n2\n"


def test_locator_moves_the_search_start() -> None:
    assert run(b"def f():\n    x\ndef g():\n    x\n", "@@ def g():\n-    x\n+    y") == (
        b"def f():\n    x\ndef g():\n    y\n"
    )


def test_missing_locator_and_missing_lines() -> None:
    with pytest.raises(PatchError, match="Failed to find context 'def h\\(\\):'"):
        run(b"a\n", "@@ def h():\n-a\n+b")
    with pytest.raises(PatchError, match="Failed to find expected lines") as info:
        run(b"line1\nline2\n", "@@\n-missing\n+changed")
    assert info.value.code == "context_mismatch"


def test_chunk_before_the_cursor_fails() -> None:
    with pytest.raises(PatchError, match="Failed to find expected lines"):
        run(b"a\nb\n", "@@\n-b\n+B\n@@\n-a\n+A")


def test_trailing_empty_old_line_may_match_without_it() -> None:
    # The file's last line is "b"; the patch's old lines end with an empty line.
    assert run(b"a\nb\n", "@@\n a\n-b\n-\n+c") == b"a\nc\n"
    # A non-empty added last line is kept (new lines stay as written); an empty one is dropped
    # together with the empty old line.
    assert run(b"a\nb\n", "@@\n a\n b\n\n+tail") == b"a\nb\n\ntail\n"
    assert run(b"a\nb\n", "@@\n a\n-b\n-\n+c\n+") == b"a\nc\n"


def test_never_retries_with_an_empty_pattern() -> None:
    with pytest.raises(PatchError, match="Failed to find expected lines"):
        run(b"a\n", "@@\n\n+x")
    with pytest.raises(PatchError, match="Failed to find expected lines"):
        run(b"", "@@\n-\n+x")


def test_pure_addition_appends_at_the_end_even_with_a_locator() -> None:
    assert run(b"line1\nline2\n", "@@\n+added 1\n+added 2") == b"line1\nline2\nadded 1\nadded 2\n"
    assert run(b"a\nb\n", "@@ a\n+c") == b"a\nb\nc\n"
    assert run(b"a\n\n", "@@\n+x") == b"a\nx\n\n"  # before a final blank line, as in Codex


def test_end_of_file_anchors_at_the_last_lines() -> None:
    assert run(b"first\nsecond\nx\nsecond\n", "@@\n-second\n+2nd\n*** End of File") == b"first\nsecond\nx\n2nd\n"
    with pytest.raises(PatchError):
        run(b"second\nlast\n", "@@\n-second\n+2nd\n*** End of File")


# -- format fidelity (seed 004 §5.4) --------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("@@\n a\n-b", b"a"),
        ("@@\n b\n+c\n*** End of File", b"a\nb\nc"),
        ("@@\n-a\n+z\n b", b"z\nb"),
    ],
)
def test_missing_final_newline_is_kept(body: str, expected: bytes) -> None:
    assert run(b"a\nb", body) == expected


def test_crlf_bom_and_final_newline_are_kept() -> None:
    src = b"\xef\xbb\xbfone\r\ntwo\r\nthree\r\n"
    assert run(src, "@@\n one\n-two\n+2\n+2.5") == b"\xef\xbb\xbfone\r\n2\r\n2.5\r\nthree\r\n"


def test_empty_source_is_written_like_an_added_file() -> None:
    assert run(b"", "@@\n+a\n+b") == b"a\nb\n"
    assert run(b"\xef\xbb\xbf", "@@\n+a") == b"\xef\xbb\xbfa\n"


def test_deleting_every_line_leaves_an_empty_file() -> None:
    assert run(b"\xef\xbb\xbfa\r\n", "@@\n-a") == b"\xef\xbb\xbf"


@pytest.mark.parametrize(
    ("data", "code", "fragment"),
    [
        (b"a\r\nb\n", "line_endings", "mixes LF and CRLF"),
        (b"a\rb\n", "line_endings", "bare CR line ending (line 1)"),
        (b"a\nb\rc", "line_endings", "bare CR line ending (line 2)"),
        (b"ok\n\xff\xfe\n", "not_utf8", "not valid UTF-8 (byte 3)"),
    ],
)
def test_unsupported_sources_are_refused(data: bytes, code: str, fragment: str) -> None:
    with pytest.raises(PatchError) as info:
        decode_source(data, "f")
    assert info.value.code == code and fragment in info.value.message


# -- many chunks: the position map instead of scanning ----------------------------------------


def many_chunks(n: int) -> str:
    return "\n".join(f"@@ def f{i}():\n-    x = {i}\n+    x = -{i}" for i in range(n))


def test_many_chunks_use_the_position_map_with_the_same_results() -> None:
    source = "".join(f"def f{i}():\n    x = {i}\n    return x\n" for i in range(8)).encode()
    expected = "".join(f"def f{i}():\n    x = {'-' if i < 6 else ''}{i}\n    return x\n" for i in range(8))
    assert run(source, many_chunks(6)) == expected.encode()
    # Whitespace-tolerant tiers and the locator work there too.
    spaced = source.replace(b"    x = 3\n", b"    x = 3   \n")
    assert b"    x = -3\n" in run(spaced, many_chunks(6))


def test_many_chunks_still_refuse_ambiguity() -> None:
    source = b"".join(b"block\n    same\n" for _ in range(8))
    body = "\n".join(["@@\n block\n-    same\n+    changed"] * 5)
    with pytest.raises(PatchError) as info:
        run(source, body)
    assert info.value.code == "ambiguous_context"
