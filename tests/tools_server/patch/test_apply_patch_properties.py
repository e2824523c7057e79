"""Property-based tests: random edits round-trip exactly; garbage never mutates anything."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tests.patch_conformance.harness import snapshot
from tests.support.toolserver import make_services
from tools_server.patch import PatchFamily
from tools_server.registry import CallContext, ToolResult

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Line text: anything without line breaks, plus lines that look like patch syntax.
LINE = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=10),
    st.sampled_from(["", " ", "\t", "x", "x ", "  x", "}", "*** End Patch", "*** End of File", "@@", "@@ x",
                     "+", "-", "*** Update File: f.txt", "é ✅"]),
)


def apply(root: Path, arguments: dict) -> ToolResult:
    services = make_services(root / "svc", {"apply_patch.enabled": True}, root / "ws")
    return asyncio.run(PatchFamily(services).tool.call(arguments, CallContext(services=services)))


def source_bytes(lines: list[str], eol: str, bom: bool, final_newline: bool) -> bytes:
    text = eol.join(lines) + (eol if final_newline and lines else "")
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")


def lines_of(data: bytes, eol: str) -> list[str]:
    """An independent reading of the file: what the patch author sees as its lines."""
    text = data.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    if not text:
        return []
    lines = text.split(eol)
    if lines[-1] == "":
        lines.pop()
    return lines


def occurrences(lines: list[str], block: list[str]) -> int:
    return sum(lines[i:i + len(block)] == block for i in range(len(lines) - len(block) + 1))


def make_patch(lines: list[str], i: int, j: int, new: list[str], patch_eol: str) -> str:
    """A minimal Codex patch for replacing lines[i:j] with `new`, with enough context to be unique."""
    if not lines:
        body = ["@@", *("+" + n for n in new)]
    else:
        size = 3
        while True:
            before, after = lines[max(0, i - size):i], lines[j:j + size]
            if occurrences(lines, before + lines[i:j] + after) == 1:
                break
            size += 1
        body = ["@@", *(" " + b for b in before), *("-" + r for r in lines[i:j]), *("+" + n for n in new),
                *(" " + a for a in after)]
    return patch_eol.join(["*** Begin Patch", "*** Update File: f.txt", *body, "*** End Patch", ""])


@st.composite
def edits(draw: st.DrawFn) -> tuple[bytes, str, str, bytes]:
    lines = draw(st.lists(LINE, max_size=25))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    bom = draw(st.booleans())
    final_newline = draw(st.booleans())
    data = source_bytes(lines, eol, bom, final_newline)
    lines = lines_of(data, eol)
    i = draw(st.integers(0, len(lines)))
    j = draw(st.integers(i, len(lines)))
    new = draw(st.lists(LINE, max_size=5))
    assume(lines or new)  # an empty file can only be appended to
    patch = make_patch(lines, i, j, new, draw(st.sampled_from(["\n", "\r\n"])))
    edited = lines[:i] + new + lines[j:]
    if not lines:  # no lines, no style to keep: written like an added file
        body = "".join(line + "\n" for line in edited)
    elif not edited:
        body = ""
    else:
        # A file without any line ending has no style to keep: new endings are LF.
        style = eol if eol.encode() in data else "\n"
        body = style.join(edited) + (style if data.endswith(style.encode()) else "")
    expected = (b"\xef\xbb\xbf" if bom else b"") + body.encode("utf-8")
    return data, patch, eol, expected


@SETTINGS
@given(edits())
def test_a_random_edit_round_trips_exactly(case: tuple[bytes, str, str, bytes]) -> None:
    data, patch, _eol, expected = case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        (root / "ws" / "f.txt").write_bytes(data)
        result = apply(root, {"patch": patch})
        assert not result.is_error, result.text
        assert (root / "ws" / "f.txt").read_bytes() == expected


# -- garbage ---------------------------------------------------------------------------------

FILES = {"f.txt": b"alpha\nbeta\ngamma\n", "dir/g.txt": b"one\r\ntwo\r\n", "h.txt": b"solo"}

# Compatible with each other: any subset, in any order, applies.

VALID_FRAGMENTS = [
    "*** Add File: new.txt\n+fresh\n",
    "*** Add File: deep/new.txt\n+a\n+\n+b\n",
    "*** Update File: f.txt\n@@\n alpha\n-beta\n+BETA\n",
    "*** Update File: dir/g.txt\n*** Move to: moved.txt\n@@\n-one\n+ONE\n",
    "*** Delete File: h.txt\n",
]

POISONS = [
    "*** Update File: f.txt\n@@\n-not in the file\n+x\n",
    "*** Delete File: missing.txt\n",
    "*** Update File: missing.txt\n@@\n-a\n+b\n",
    "*** Add File: ../escape.txt\n+x\n",
    "*** Add File: /etc/ctproxy-escape\n+x\n",
    "*** Frobnicate File: f.txt\n",
    "junk line\n",
    "*** Update File: f.txt\n",
    "*** Update File: f.txt\n@@\n\n+x\n",
    "*** Delete File: dir\n",
    "*** Add File: f.txt/inner\n+x\n",
]


@st.composite
def poisoned_patches(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(VALID_FRAGMENTS), max_size=5, unique=True))
    poison = draw(st.sampled_from(POISONS))
    parts.insert(draw(st.integers(0, len(parts))), poison)
    return "*** Begin Patch\n" + "".join(parts) + "*** End Patch\n"


def mutate(text: str, data: st.DataObject) -> str:
    for _ in range(data.draw(st.integers(1, 2))):
        pos = data.draw(st.integers(0, len(text)))
        action = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        char = data.draw(st.sampled_from(list("+- @*\n\r\tx/.")))
        if action == "insert":
            text = text[:pos] + char + text[pos:]
        elif action == "delete":
            text = text[:pos] + text[pos + 1:]
        else:
            text = text[:pos] + char + text[pos + 1:]
    return text


@contextlib.contextmanager
def fixture_tree() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, content in FILES.items():
            (root / "ws" / name).parent.mkdir(parents=True, exist_ok=True)
            (root / "ws" / name).write_bytes(content)
        yield root


@SETTINGS
@given(st.one_of(st.text(max_size=300), poisoned_patches()))
def test_garbage_never_mutates_and_always_errors(patch: str) -> None:
    with fixture_tree() as root:
        before = snapshot(root / "ws")
        result = apply(root, {"patch": patch})
        assert result.is_error, patch
        assert snapshot(root / "ws") == before
        assert not (root / "ws" / "deep").exists()
        assert not [p for p in (root / "ws").rglob("*") if p.name.endswith(".ctp-patch")]


@SETTINGS
@given(st.lists(st.sampled_from(VALID_FRAGMENTS), min_size=1, max_size=4, unique=True), st.data())
def test_a_mangled_patch_applies_whole_or_not_at_all(parts: list[str], data: st.DataObject) -> None:
    patch = mutate("*** Begin Patch\n" + "".join(parts) + "*** End Patch\n", data)
    with fixture_tree() as root:
        before = snapshot(root / "ws")
        result = apply(root, {"patch": patch})
        after = snapshot(root / "ws")
    event("refused" if result.is_error else "applied")
    if result.is_error:
        assert after == before, result.text
    else:
        assert result.text.startswith("Success.")
        committed = [o["status"] for o in result.details["operations"]]
        assert committed and set(committed) == {"committed"}
