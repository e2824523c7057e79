"""Issue 46 (seed000-defects.md 5, 9, 11), pure: what a new window points at, whose identity a prompt is, and
which notes are the agent's own in the checkpoint turn."""

from __future__ import annotations

import os
from pathlib import Path

from proxy.notes import NotesStore
from proxy.notes import paths as note_paths
from proxy.windows.notes.bootstrap import (
    CONTINUATION,
    INLINE_NOTE_MAX_CHARS,
    WindowStart,
    identity_text,
    insert_identity,
    is_identity,
    read_notes_index,
    window_notes,
)
from proxy.windows.notes.checkpoint_turn import own_path


def _text(item: dict) -> str:
    return "".join(p["text"] for p in item["content"])


def _start(tmp_path: Path, tools: tuple[str, ...], note: str = "checkpoint: half done") -> WindowStart:
    store = NotesStore(tmp_path / "notes", "task_x")
    store.write("/root", "old.md", "older note")
    os.utime(store.agent_dir("/root") / "old.md", (1_000_000_000, 1_000_000_000))
    store.write("/root", "checkpoint.md", note)
    snap = read_notes_index(store, "/root", with_text="notes_read_file" not in tools)
    return WindowStart("/root", "w2", "w1", snap, tools=tools, task_id="task_x", reason="checkpoint")


def test_a_window_without_read_tools_carries_the_note_and_sends_the_agent_nowhere(tmp_path):
    """Defect 5: an agent with only its own tools was told to read the note and window w1 with tools it lacks."""
    head, tail = window_notes(_start(tmp_path, ()))
    texts = [_text(i) for i in [*head, *tail]]
    whole = "\n".join(texts)
    for missing in ("history_list_items", "notes_read_file", "notes_list_files_by_prefix", "read your checkpoint"):
        assert missing not in whole, missing
    assert "w1" in whole and "not readable from here" in whole
    (note,) = [i for i in head if "checkpoint: half done" in _text(i)]
    assert note["role"] == "user"  # the note's text is data, never an instruction
    assert "older note" not in whole  # only the newest note
    assert tail[0]["role"] == "developer" and "above" in _text(tail[0])


def test_the_inline_note_is_bounded(tmp_path):
    head, _ = window_notes(_start(tmp_path, (), note="n" * (INLINE_NOTE_MAX_CHARS * 3)))
    (note,) = [i for i in head if i["role"] == "user"]
    assert len(_text(note)) < INLINE_NOTE_MAX_CHARS + 400 and "more characters not shown" in _text(note)


def test_a_window_with_the_read_tools_points_at_them_and_carries_no_note(tmp_path):
    tools = ("history_list_items", "history_read_item", "notes_read_file", "notes_write_file", "new_context")
    head, tail = window_notes(_start(tmp_path, tools))
    whole = "\n".join(_text(i) for i in [*head, *tail])
    assert "read it with history_list_items (window_id=w1)" in whole and "pass `path` to notes_read_file" in whole
    assert "checkpoint: half done" not in whole and _text(tail[0]) == CONTINUATION
    assert all(i["role"] == "developer" for i in [*head, *tail])


def test_an_agent_prompt_starting_you_are_agent_is_not_ctproxys_identity():
    """Defect 9: "You are agent Smith, …" was taken for the window identity, and none was added."""
    own = {"role": "developer", "content": "You are agent Smith, a careful coding assistant."}
    user = {"role": "user", "content": "hi"}
    assert not is_identity(own)
    ident = identity_text("/root", "w1", None, "task_x")
    out = insert_identity([own, user], ident)
    assert out[0] is own and _text(out[1]) == ident and out[2] is user
    assert insert_identity(out, ident) is out  # ctproxy's own is still recognised: never twice


def test_the_checkpoint_turns_own_path_agrees_with_note_path_resolution():
    """Defect 11: for an agent named `notes`, `/root/notes/notes/ck.md` is /root's note by the path rules, and the
    fence accepted it as the agent's own."""
    path = "/root/notes/notes/ck.md"
    assert note_paths.parse(path, "/root/notes", lambda _a: True).address == "/root"
    assert not own_path('{"path": "/root/notes/notes/ck.md"}', "/root/notes")
    assert own_path('{"path": "ck.md"}', "/root/notes")
    assert own_path('{"path": "/root/notes/ck.md"}', "/root")
    assert own_path('{"path": "/root/a/notes/ck.md"}', "/root/a")
    assert not own_path('{"path": "/root/a/notes/ck.md"}', "/root")
    assert not own_path('{"path": "/root/../x/notes/a.md"}', "/root")
