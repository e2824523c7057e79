"""The patch parser: markers, hunks, chunks, wrappers, and errors that name the line."""

from __future__ import annotations

import pytest

from tools_server.patch.model import AddFile, Chunk, DeleteFile, PatchSyntaxError, UpdateFile
from tools_server.patch.parser import parse_patch


def wrap(body: str) -> str:
    return f"*** Begin Patch\n{body}\n*** End Patch"


def chunk(context, old, new, eof=False) -> tuple:
    return (context, old, new, eof)


def shape(c: Chunk) -> tuple:
    return (c.context, c.old, c.new, c.end_of_file)


def test_all_hunk_kinds_in_order() -> None:
    patch = parse_patch(wrap(
        "*** Add File: path/add.py\n+abc\n+\n+def\n"
        "*** Delete File: path/delete.py\n"
        "*** Update File: path/update.py\n*** Move to: path/update2.py\n"
        "@@ def f():\n-    pass\n+    return 123\n"
        "@@\n context\n-x\n+y\n*** End of File"
    ))
    add, delete, update = patch.hunks
    assert add == AddFile(path="path/add.py", contents="abc\n\ndef\n", line=2)
    assert delete == DeleteFile(path="path/delete.py", line=6)
    assert isinstance(update, UpdateFile) and update.move_to == "path/update2.py" and update.line == 7
    assert [shape(c) for c in update.chunks] == [
        chunk("def f():", ["    pass"], ["    return 123"]),
        chunk(None, ["context", "x"], ["context", "y"], eof=True),
    ]
    assert update.chunks[1].line == 12


def test_first_chunk_without_at_at_and_bare_empty_lines_are_context() -> None:
    (update,) = parse_patch(wrap("*** Update File: f\n import foo\n\n+bar")).hunks
    assert [shape(c) for c in update.chunks] == [chunk(None, ["import foo", ""], ["import foo", "", "bar"])]
    assert update.chunks[0].new_ref == [0, 1, None]


def test_padded_markers_and_headers() -> None:
    patch = parse_patch(" *** Begin Patch \n  *** Update File: foo.txt\n@@\n-a\n+b\n *** End Patch ")
    assert patch.hunks[0].path == "foo.txt"
    # Inside an update hunk an indented header is context text, as in Codex.
    (update,) = parse_patch(wrap("*** Update File: a.txt\n@@\n-old\n *** Update File: b.txt")).hunks
    assert update.chunks[0].old == ["old", "*** Update File: b.txt"]


def test_crlf_patch() -> None:
    (update,) = parse_patch("*** Begin Patch\r\n*** Update File: f\r\n@@\r\n-old\r\n+new\r\n*** End Patch\r\n").hunks
    assert shape(update.chunks[0]) == chunk(None, ["old"], ["new"])


@pytest.mark.parametrize("opener", ["<<EOF", "<<'EOF'", '<<"EOF"', "apply_patch <<'EOF'", "applypatch <<EOF",
                                    "apply_patch <<'PATCH'"])
def test_heredoc_wrappers(opener: str) -> None:
    delim = opener.rsplit("<<", 1)[1].strip("'\"")
    text = f"{opener}\n*** Begin Patch\n*** Add File: a\n+x\n*** End Patch\n{delim}\n"
    assert parse_patch(text).hunks == [AddFile(path="a", contents="x\n", line=3)]


def test_heredoc_with_cd_gives_workdir() -> None:
    text = "cd 'sub dir' && apply_patch <<'EOF'\n*** Begin Patch\n*** Delete File: a\n*** End Patch\nEOF"
    patch = parse_patch(text)
    assert patch.workdir == "sub dir" and patch.hunks == [DeleteFile(path="a", line=3)]


def test_mismatched_heredoc_quotes_fail_with_begin_error() -> None:
    with pytest.raises(PatchSyntaxError, match="first line of the patch must be"):
        parse_patch("<<\"EOF'\n*** Begin Patch\n*** Add File: a\n+x\n*** End Patch\nEOF\n")


def test_empty_patch_parses_to_no_hunks() -> None:
    assert parse_patch("*** Begin Patch\n*** End Patch").hunks == []


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("bad", None, "first line of the patch must be '*** Begin Patch'"),
        ("*** Begin Patch\nbad", None, "last line of the patch must be '*** End Patch'"),
        (wrap("*** Frobnicate File: foo"), 2, "'*** Frobnicate File: foo' is not a valid hunk header"),
        (wrap("*** Update File: test.py"), 2, "Update File hunk for path 'test.py' is empty"),
        (wrap("*** Update File: a\n@@\n@@\n-x"), 4, "unexpected line found in update hunk: '@@'"),
        (wrap("*** Update File: a\n@@"), 4, "does not contain any lines"),
        (wrap("*** Update File: a\n@@\n-x\nnot a line"), 5, "expected update hunk lines"),
        (wrap("*** Update File: a\nnot a line"), 3, "unexpected line found in update hunk"),
        (wrap("*** Add File: a\nno plus"), 3, "every line of an Add File hunk starts with '+'"),
        (wrap("*** Add File: a\n+x\n\n+y"), 4, "Add File hunk"),  # Add File stays strict about blanks
        (wrap("*** Update File: a\n@@\n-x\n*** End of File\n+y"), 6, "after '*** End of File'"),
        (wrap("*** Environment ID: remote\n*** Delete File: a"), 2, "Environment ID"),
        (wrap("*** Delete File: "), 2, "is not a valid hunk header"),
        ("*** Begin Patch\n*** End Patch\n*** Delete File: a\n*** End Patch", None, "follows it"),
    ],
)
def test_errors_name_the_line(text: str, line: int | None, fragment: str) -> None:
    with pytest.raises(PatchSyntaxError) as info:
        parse_patch(text)
    assert fragment in info.value.message
    assert info.value.line == line
    if line is not None:
        assert info.value.message.startswith(f"invalid hunk at line {line}, ")


def test_line_numbers_count_from_the_text_as_sent() -> None:
    with pytest.raises(PatchSyntaxError) as info:
        parse_patch("\n\napply_patch <<'EOF'\n*** Begin Patch\n*** Nope\n*** End Patch\nEOF")
    assert info.value.line == 5


def test_end_of_file_then_blank_lines_then_new_chunk() -> None:
    (update,) = parse_patch(wrap("*** Update File: f\n@@\n+a\n*** End of File\n\n@@ x\n-b")).hunks
    assert [shape(c) for c in update.chunks] == [chunk(None, [], ["a"], eof=True), chunk("x", ["b"], [])]


def test_hunk_after_update() -> None:
    hunks = parse_patch(wrap("*** Update File: f\n@@\n+line\n*** Add File: o\n+content")).hunks
    assert hunks[1] == AddFile(path="o", contents="content\n", line=5)


def test_empty_add_file_creates_empty_content() -> None:
    assert parse_patch(wrap("*** Add File: empty\n*** Delete File: x")).hunks[0] == AddFile("empty", "", 2)
