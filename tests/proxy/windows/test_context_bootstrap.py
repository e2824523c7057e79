"""The bootstrap builder (proxy/windows/notes/bootstrap.py): guidance, identity, notes index, continuation."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.notes import NotesStore
from proxy.windows.notes.bootstrap import (
    ALL_TOOLS,
    CONTINUATION,
    GUIDANCE_MARKER,
    INCREMENTAL_NOTES_LINE,
    NoteMeta,
    NotesSnapshot,
    WindowStart,
    build_bootstrap,
    developer_message,
    insert_guidance,
    is_guidance,
    leading_instructions,
    notes_index_text,
    read_notes_index,
)


def _text(item: dict) -> str:
    return "".join(p["text"] for p in item["content"])


def test_guidance_has_the_contract_s_parts():
    (g,) = [i for i in insert_guidance([]) if is_guidance(i)]
    text = _text(g)
    assert g["role"] == "developer" and text.startswith(GUIDANCE_MARKER)
    assert INCREMENTAL_NOTES_LINE in text.splitlines()
    for name in ALL_TOOLS:
        assert name in text
    assert "It is a good idea" not in text


def test_insert_guidance_once_after_leading_instructions_and_deduplicated():
    sys_msg = {"role": "system", "content": "be careful"}
    dev = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "perms"}], "x": 1}
    user = {"role": "user", "content": "hi"}
    once = insert_guidance([sys_msg, dev, user])
    assert once[0] is sys_msg and once[1] is dev and is_guidance(once[2]) and once[3] is user
    assert insert_guidance(once) == once  # idempotent
    # an agent that resends it (even twice, even an old wording) still gets exactly one, in place
    old = developer_message(GUIDANCE_MARKER + "\nold words")
    resent = insert_guidance([sys_msg, old, user, old])
    assert [is_guidance(i) for i in resent] == [False, True, False]
    assert resent[1] == once[2]
    # no context tool reachable: none, and a resent one is dropped
    assert insert_guidance([old, user], tools=()) == [user]
    # only the reachable tools are named
    only_notes = _text(insert_guidance([], tools=("notes_read_file", "exec_command"))[0])
    assert "notes_read_file" in only_notes and "history_read_item" not in only_notes


def _snapshot(n: int, agent: str = "/root/reviewer", name: str = "note") -> NotesSnapshot:
    return NotesSnapshot(agent, tuple(NoteMeta(f"{agent}/notes/{name}{i:03d}.md", 10 * i, 1_700_000_000 + i)
                                      for i in range(n)))


def test_notes_index_limits_and_wording():
    text = notes_index_text(_snapshot(40))
    lines = text.splitlines()
    assert lines[0].startswith("Existing notes for /root/reviewer at this context-window reset")
    rows = [orjson.loads(line) for line in lines[1:-1]]
    assert len(rows) == 25 and lines[-1] == "[15 more note(s) not listed; list them with notes_list_files_by_prefix]"
    assert [r["path"] for r in rows[:2]] == ["/root/reviewer/notes/note039.md", "/root/reviewer/notes/note038.md"]
    assert set(rows[0]) == {"path", "bytes", "updated_at"} and rows[0]["updated_at"].endswith("Z")
    # 6,000 code points at most, whole lines, the omitted count
    long = _snapshot(25, name="ü" * 300)
    text = notes_index_text(long)
    assert len(text) <= 6_000
    body = text.splitlines()
    assert all(orjson.loads(line) for line in body[1:-1])
    assert body[-1] == f"[{25 - (len(body) - 2)} more note(s) not listed; list them with notes_list_files_by_prefix]"
    # quotes and newlines in paths are JSON-escaped, so they read back as they are
    odd = NotesSnapshot("/root", (NoteMeta('/root/notes/a"b\nc.md', 1, 1.0),))
    assert orjson.loads(notes_index_text(odd).splitlines()[1])["path"] == '/root/notes/a"b\nc.md'
    assert "none (your notes directory is empty)" in notes_index_text(NotesSnapshot("/root", ()))
    assert "index unavailable" in notes_index_text(NotesSnapshot("/root", None))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=200), st.integers(0, 10**6), st.floats(0, 2e9)),
                max_size=60))
def test_notes_index_bounds_hold_for_any_notes(files):
    snap = NotesSnapshot("/root/a", tuple(NoteMeta(f"/root/a/notes/{p}", b, t) for p, b, t in files))
    text = notes_index_text(snap)
    assert len(text) <= 6_000
    lines = text.split("\n")
    rows = [line for line in lines[1:] if line.startswith("{")]
    assert len(rows) <= 25 and all(orjson.loads(r)["path"].startswith("/root/a/notes/") for r in rows)
    if len(rows) < len(files):
        assert lines[-1] == f"[{len(files) - len(rows)} more note(s) not listed; list them with " \
                            "notes_list_files_by_prefix]"


def test_read_notes_index_lists_only_the_agent_s_own_and_never_contents(tmp_path: Path):
    store = NotesStore(tmp_path / "notes", "task_x")
    store.write("/root", "root-secret.md", "ROOT CONTENT")
    store.write("/root/reviewer", "checkpoint.md", "REVIEWER CONTENT")
    store.write("/root/reviewer", "old.md", "x")
    os.utime(store.agent_dir("/root/reviewer") / "old.md", (1_000_000_000, 1_000_000_000))
    snap = read_notes_index(store, "/root/reviewer")
    assert [m.path for m in snap.files] == ["/root/reviewer/notes/checkpoint.md", "/root/reviewer/notes/old.md"]
    text = notes_index_text(snap)
    assert "CONTENT" not in text and "root-secret" not in text
    empty = read_notes_index(store, "/root/nobody")
    assert empty.files == ()
    # unreadable: the index says so, and nothing raises
    os.chmod(store.agent_dir("/root/reviewer"), 0)
    try:
        if os.geteuid() != 0:  # root reads anything
            assert read_notes_index(store, "/root/reviewer").files in (None, ())
    finally:
        os.chmod(store.agent_dir("/root/reviewer"), 0o700)

    class Broken(NotesStore):
        def iter_files(self, address):
            raise PermissionError(13, "denied")

    assert read_notes_index(Broken(tmp_path / "notes", "task_x"), "/root").files is None


def test_build_bootstrap_order_and_byte_stability():
    lead = [{"role": "developer", "content": "agent rules"}, {"role": "user", "content": "task"}]
    start = WindowStart("/root/reviewer", "w_2", "w_1", _snapshot(3), task_id="task_1")
    boot = build_bootstrap(start, leading_instructions(lead))
    assert boot[0] is lead[0] and is_guidance(boot[1])
    assert "You are agent /root/reviewer of task task_1. This is context window w_2." in _text(boot[2])
    assert "w_1" in _text(boot[2])
    assert _text(boot[3]).startswith("Existing notes for /root/reviewer at this context-window reset")
    assert _text(boot[4]) == CONTINUATION and "wait for the user" in CONTINUATION
    assert all(i["role"] == "developer" for i in boot)
    again = build_bootstrap(WindowStart("/root/reviewer", "w_2", "w_1", _snapshot(3), task_id="task_1"),
                            leading_instructions(lead))
    assert orjson.dumps(again) == orjson.dumps(boot)  # the same bytes: the prompt cache keeps hitting
    # guidance is inserted once and stays in place over the bootstrap
    forwarded = [*boot, {"role": "user", "content": "next"}]
    assert insert_guidance(forwarded) == forwarded
    # tool order declared by the session does not change the bytes
    none = _snapshot(0, "/root")
    a = build_bootstrap(WindowStart("/root", "w", None, none, tools=("new_context", "notes_read_file")))
    b = build_bootstrap(WindowStart("/root", "w", None, none, tools=("notes_read_file", "new_context")))
    assert orjson.dumps(a) == orjson.dumps(b)


def test_rollover_boundary_keeps_calls_with_outputs_and_the_agent_s_later_messages():
    from proxy.windows.notes.bootstrap import rollover_boundary

    call = {"type": "function_call", "call_id": "c", "name": "new_context", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "c", "output": "A new context window will start..."}
    steer = {"role": "user", "content": "also check the tests"}
    items = [{"role": "user", "content": "task"}, call, out]
    assert rollover_boundary(items) == 3  # only terminating tools: all before the boundary
    mixed = [{"role": "user", "content": "task"}, call, {"type": "function_call", "call_id": "d", "name": "ls"},
             out, {"type": "function_call_output", "call_id": "d", "output": "a b"}]
    assert rollover_boundary(mixed) == 5  # a mixed batch: every output stays with its call
    assert rollover_boundary([*items, steer]) == 3  # steering / follow-up: follows the bootstrap unchanged
    assert rollover_boundary([steer]) == 0 and rollover_boundary([]) == 0
