"""Every preflight refusal leaves the tree exactly as it was and says why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.patch_conformance.harness import snapshot
from tests.support.toolserver import make_services
from tools_server.patch import PatchFamily
from tools_server.patch.model import PatchError
from tools_server.patch.paths import lexical_target, working_dir
from tools_server.registry import CallContext, ToolError, ToolResult


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("alpha\nbeta\n")
    (root / "sub").mkdir()
    (root / "sub" / "b.txt").write_text("one\ntwo\n")
    return root


async def call(ws: Path, patch: str, **extra: str) -> ToolResult:
    services = make_services(ws.parent / "svc", {"apply_patch.enabled": True}, ws)
    return await PatchFamily(services).tool.call({"patch": patch, **extra}, CallContext(services=services))


def wrap(body: str) -> str:
    return f"*** Begin Patch\n{body}\n*** End Patch\n"


# An Add File that would succeed, put first so a non-preflighted applier would leave it behind.
CANARY = "*** Add File: canary.txt\n+should never appear\n"


async def refused(ws: Path, body: str, code: str, fragment: str, **extra: str) -> ToolResult:
    before = snapshot(ws)
    links = sorted(p for p in ws.rglob("*") if p.is_symlink())
    result = await call(ws, wrap(CANARY + body), **extra)
    assert result.is_error, result.text
    assert result.details.get("error") == code, result.details
    assert fragment in result.text
    assert result.text.startswith("apply_patch verification failed: ")
    assert result.text.endswith("Nothing was changed.")
    assert snapshot(ws) == before
    assert sorted(p for p in ws.rglob("*") if p.is_symlink()) == links
    assert not [p for p in ws.rglob("*") if p.name.endswith(".ctp-patch")]
    return result


async def test_symlinked_file_is_refused(ws: Path, tmp_path: Path) -> None:
    (ws / "link.txt").symlink_to(ws / "a.txt")
    await refused(ws, "*** Update File: link.txt\n@@\n-alpha\n+x", "symlink", "'link.txt'")
    await refused(ws, "*** Delete File: link.txt", "symlink", "symbolic link")
    await refused(ws, "*** Add File: link.txt\n+x", "symlink", "symbolic link")


async def test_symlinked_directory_on_the_path_is_refused(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s\n")
    (ws / "door").symlink_to(outside, target_is_directory=True)
    await refused(ws, "*** Update File: door/secret.txt\n@@\n-s\n+t", "symlink", "('door')")
    await refused(ws, "*** Add File: door/new.txt\n+x", "symlink", "('door')")
    await refused(ws, "*** Update File: a.txt\n*** Move to: door/a.txt\n@@\n-alpha\n+x", "symlink", "door")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.parametrize("path", ["../escape.txt", "sub/../../escape.txt", "/etc/passwd", "/tmp/x.txt"])
async def test_escapes_are_refused(ws: Path, path: str) -> None:
    await refused(ws, f"*** Add File: {path}\n+x", "outside_workspace", f"'{path}' resolves outside")


async def test_escape_from_a_call_cwd_is_refused_even_inside_the_workspace(ws: Path) -> None:
    await refused(ws, "*** Update File: ../a.txt\n@@\n-alpha\n+x", "outside_workspace", "outside", cwd="sub")


async def test_cwd_outside_the_workspace_is_refused(ws: Path) -> None:
    await refused(ws, "*** Add File: x\n+x", "outside_workspace", "working directory", cwd="..")
    await refused(ws, "*** Add File: x\n+x", "bad_cwd", "does not exist", cwd="nope")


async def test_absolute_paths_inside_the_cwd_are_accepted(ws: Path) -> None:
    result = await call(ws, wrap(f"*** Update File: {ws / 'sub' / 'b.txt'}\n@@\n-one\n+1"), cwd="sub")
    assert not result.is_error, result.text
    assert (ws / "sub" / "b.txt").read_text() == "1\ntwo\n"


async def test_non_utf8_sources_are_refused(ws: Path) -> None:
    (ws / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    await refused(ws, "*** Update File: latin1.txt\n@@\n-x\n+y", "not_utf8", "not valid UTF-8")
    await refused(ws, "*** Delete File: latin1.txt", "not_utf8", "not valid UTF-8")  # no binary deletes


async def test_mixed_and_bare_cr_endings_are_refused(ws: Path) -> None:
    (ws / "mixed.txt").write_bytes(b"a\r\nb\nc\r\n")
    (ws / "cr.txt").write_bytes(b"a\rb\r")
    await refused(ws, "*** Update File: mixed.txt\n@@\n-b\n+B", "line_endings", "mixes LF and CRLF")
    await refused(ws, "*** Update File: cr.txt\n@@\n-a\n+A", "line_endings", "bare CR")
    await refused(ws, "*** Delete File: cr.txt", "line_endings", "bare CR")


async def test_directory_targets_are_refused(ws: Path) -> None:
    await refused(ws, "*** Delete File: sub", "not_a_file", "is a directory")
    await refused(ws, "*** Update File: sub\n@@\n-x\n+y", "not_a_file", "is a directory")
    await refused(ws, "*** Add File: sub\n+x", "not_a_file", "is a directory")
    await refused(ws, "*** Update File: a.txt\n*** Move to: sub\n@@\n-alpha\n+x", "not_a_file", "is a directory")
    await refused(ws, "*** Add File: .\n+x", "bad_path", "working directory itself")


async def test_special_files_are_refused(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    await refused(ws, "*** Delete File: pipe", "not_a_file", "not a regular file")


async def test_a_file_used_as_a_directory_is_refused(ws: Path) -> None:
    await refused(ws, "*** Add File: a.txt/inner.txt\n+x", "not_a_directory", "'a.txt' is a file")


@pytest.mark.parametrize(
    "body",
    [
        "*** Delete File: a.txt\n*** Add File: a.txt\n+x",
        "*** Update File: a.txt\n@@\n-alpha\n+x\n*** Update File: ./a.txt\n@@\n-beta\n+y",
        "*** Update File: a.txt\n*** Move to: sub/b.txt\n@@\n-alpha\n+x\n*** Delete File: sub/b.txt",
        "*** Add File: n.txt\n+x\n*** Update File: a.txt\n*** Move to: n.txt\n@@\n-alpha\n+x",
    ],
)
async def test_two_operations_on_one_path_are_refused(ws: Path, body: str) -> None:
    await refused(ws, body, "path_conflict", "name the same file")


async def test_a_path_and_its_parent_in_one_patch_are_refused(ws: Path) -> None:
    await refused(ws, "*** Add File: d\n+x\n*** Add File: d/e.txt\n+y", "path_conflict", "parent directory")


async def test_context_errors_are_found_before_anything_is_written(ws: Path) -> None:
    await refused(ws, "*** Update File: a.txt\n@@\n-gamma\n+x", "context_mismatch", "Failed to find expected")
    (ws / "dup.txt").write_text("x\ny\nx\ny\n")
    await refused(ws, "*** Update File: dup.txt\n@@\n x\n-y\n+z", "ambiguous_context", "matches 2 places")


async def test_syntax_errors_and_missing_files(ws: Path) -> None:
    await refused(ws, "*** Update File: a.txt\nbogus", "invalid_patch", "invalid hunk at line 5")
    await refused(ws, "*** Update File: none.txt\n@@\n-a\n+b", "not_found", "does not exist")
    await refused(ws, "*** Delete File: none.txt", "not_found", "does not exist")


async def test_stray_carriage_returns_in_new_text_are_refused(ws: Path) -> None:
    await refused(ws, "*** Update File: a.txt\n@@\n-alpha\n+x\ry", "line_endings", "carriage return")


async def test_garbage_arguments(tmp_path: Path) -> None:
    services = make_services(tmp_path, {"apply_patch.enabled": True})
    tool = PatchFamily(services).tool
    with pytest.raises(ToolError, match="give the patch text in 'patch'"):
        await tool.call({}, CallContext(services=services))
    with pytest.raises(ToolError, match="unknown field 'path'"):
        await tool.call({"patch": "x", "path": "y"}, CallContext(services=services))
    with pytest.raises(ToolError, match=r"'patch' is not valid Unicode .*lone surrogate"):  # an invalid argument
        await tool.call({"patch": "*** Begin Patch\n\ud800\n*** End Patch"}, CallContext(services=services))


def test_absolute_paths_may_use_the_workspaces_symlinked_spelling(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    alias = tmp_path / "alias"
    alias.symlink_to(real, target_is_directory=True)
    cwd = working_dir(alias, "sub")
    assert cwd.real == str(real / "sub")
    target = lexical_target(cwd, str(alias / "sub" / "f.txt"))
    assert target.path == str(real / "sub" / "f.txt")
    with pytest.raises(PatchError) as info:
        lexical_target(cwd, str(alias / "f.txt"))
    assert info.value.code == "outside_workspace"
