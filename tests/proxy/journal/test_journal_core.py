"""Pure parts of the journal: canonical ids, branch alignment, safe text, roles/tools, addresses."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.items.addresses import AddressError, auto_address, resolve_address, validate_address
from proxy.items.canonical import canonical_hash, chain_id, item_type
from proxy.items.classify import is_control, is_hidden_tool, normalize_tool, role_of, tool_of
from proxy.items.render import render_item
from proxy.journal.branch import Entry, align, align_stateful
from proxy.journal.excerpt import find_matches, page, preview, regions

USER = {"role": "user", "content": "hello"}
OUT_MSG = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}]}
RESENT_MSG = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec", "arguments": "{\"a\":1}",
        "status": "completed"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "done"}


def test_canonical_ignores_what_clients_drop_on_resend():
    assert canonical_hash(OUT_MSG) == canonical_hash(RESENT_MSG)
    assert canonical_hash(USER) == canonical_hash(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]})
    assert canonical_hash(REASONING) == canonical_hash({"type": "reasoning", "summary": []})
    assert canonical_hash(CALL) == canonical_hash({k: v for k, v in CALL.items() if k not in ("id", "status")})


def test_canonical_sees_real_edits():
    assert canonical_hash(USER) != canonical_hash({"role": "user", "content": "hello!"})
    assert canonical_hash(CALL) != canonical_hash({**CALL, "arguments": "{\"a\":2}"})
    assert canonical_hash(OUTPUT) != canonical_hash({**OUTPUT, "call_id": "call_2"})
    assert canonical_hash(USER) != canonical_hash({"role": "developer", "content": "hello"})


def test_chain_ids_depend_on_parent():
    c = canonical_hash(USER)
    assert chain_id("root:s", c) == chain_id("root:s", c)
    assert chain_id("root:s", c) != chain_id("root:t", c)
    assert chain_id("it_a", c).startswith("it_") and len(chain_id("it_a", c)) == 19


def _branch(*items: dict) -> list[Entry]:
    out, parent = [], "root:s"
    for it in items:
        canon = canonical_hash(it)
        parent = chain_id(parent, canon)
        out.append(Entry(parent, canon, item_type(it)))
    return out


def test_align_continue_skips_omitted_reasoning():
    entries = _branch(USER, REASONING, OUT_MSG)
    a = align(entries, [USER, RESENT_MSG, {"role": "user", "content": "next"}])
    assert a.kind == "continue"
    assert a.matched == [0, 2, None]
    assert a.keep == 3 and a.new_from == 2


def test_align_exact_resend_has_no_new_items():
    entries = _branch(USER, REASONING, OUT_MSG)
    a = align(entries, [USER, REASONING, OUT_MSG])
    assert a.kind == "continue" and a.new_from == 3 and a.matched == [0, 1, 2]


def test_align_edit_diverges_at_the_edit():
    entries = _branch(USER, OUT_MSG, {"role": "user", "content": "b"}, CALL)
    a = align(entries, [USER, RESENT_MSG, {"role": "user", "content": "B (edited)"}])
    assert a.kind == "diverged"
    assert a.keep == 2 and a.new_from == 2 and a.changes_branch


def test_align_retry_from_an_earlier_point_is_a_prefix():
    entries = _branch(USER, OUT_MSG, {"role": "user", "content": "b"}, CALL)
    a = align(entries, [USER])
    assert a.kind == "prefix" and a.keep == 1 and a.new_from == 1


def test_align_client_trimmed_prefix_keeps_ids():
    u2 = {"role": "user", "content": "b"}
    entries = _branch(USER, OUT_MSG, u2, CALL, OUTPUT)
    a = align(entries, [u2, CALL, OUTPUT, {"role": "user", "content": "c"}])
    assert a.kind == "trimmed"
    assert a.matched == [2, 3, 4, None] and a.keep == 5


def test_align_client_compaction_appends_everything():
    entries = _branch(USER, OUT_MSG, {"role": "user", "content": "b"})
    compaction = {"type": "compaction", "encrypted_content": "opaque"}
    a = align(entries, [USER, {"role": "user", "content": "b"}, compaction, {"role": "user", "content": "c"}])
    assert a.kind == "compaction" and a.keep == 3 and a.new_from == 0


def test_align_stateful_appends_after_the_previous_response():
    entries = _branch(USER, OUT_MSG, {"role": "user", "content": "b"}, OUT_MSG)
    assert align_stateful(entries, [USER], None).kind == "stateful"
    a = align_stateful(entries, [USER], 1)
    assert a.kind == "diverged" and a.keep == 2


def test_render_reasoning_and_images_never_enter_searchable_text():
    r = render_item({"type": "reasoning", "summary": [{"type": "summary_text", "text": "secret plan"}],
                     "encrypted_content": "zzz"})
    assert "secret" not in r.text and "zzz" not in r.text and r.segments == []
    msg = render_item({"role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
        {"type": "input_text", "text": "here"}]})
    assert "iVBOR" not in msg.text and "[image #1: image/png" in msg.text
    assert len(msg.images) == 1 and msg.images[0].data_base64 == "iVBORw0KGgo="
    # "look" and "here" are separate parts: no match spans them.
    assert find_matches(msg.text, msg.segments, "look") and not find_matches(msg.text, msg.segments, "k\n[")
    assert not find_matches(msg.text, msg.segments, "image")


def test_render_tool_items():
    call = render_item(CALL)
    assert call.text.startswith("[call exec]") and find_matches(call.text, call.segments, '"a":1')
    assert not find_matches(call.text, call.segments, "call exec")
    assert render_item({"type": "function_call_output", "call_id": "x", "output": ""}).text == "[empty tool result]"
    shell = render_item({"type": "local_shell_call_output", "call_id": "x", "output": "total 0\nfile"})
    assert find_matches(shell.text, shell.segments, "total 0")
    ws = render_item({"type": "web_search_call", "action": {"type": "search", "queries": ["mitmproxy sse"]}})
    assert find_matches(ws.text, ws.segments, "mitmproxy sse")


def test_roles():
    assert role_of(OUTPUT) == "tool"
    assert role_of({"type": "custom_tool_call_output", "call_id": "c", "output": "x"}) == "tool"
    assert role_of(CALL) == "assistant" and role_of(REASONING) == "assistant"
    assert role_of(USER) == "user" and role_of({"role": "developer", "content": "x"}) == "developer"
    assert role_of({"role": "system", "content": "x"}) == "system"
    assert role_of({"type": "compaction", "encrypted_content": "x"}) == "user"


def test_tool_namespaces():
    assert tool_of(CALL) == ("functions", "exec")
    assert tool_of({**CALL, "name": "history_list_items"}) == ("history", "list_items")
    assert tool_of({**CALL, "namespace": "history", "name": "read_item"}) == ("history", "read_item")
    assert tool_of({**CALL, "namespace": "mcp__fs", "name": "read"}) == ("mcp__fs", "read")
    assert tool_of({"type": "web_search_call", "action": {}}) == ("functions", "web_search")
    assert tool_of(OUTPUT) == (None, None)  # resolved through its call by the writer
    assert tool_of({"type": "custom_tool_call_output", "call_id": "c", "output": "", "name": "notes_write_file"}) \
        == ("notes", "write_file")
    assert normalize_tool("functions", "notes_read_file") == ("notes", "read_file")
    assert is_hidden_tool("history", "list_items") and is_hidden_tool("functions", "new_context")
    assert not is_hidden_tool("functions", "exec")


def test_the_recovery_tools_are_filed_alike_whatever_road_they_came_by():
    """Seed 000 defects 1 and 12: a bridged `mcp_call` (server label `ctproxy`), Codex's MCP spellings
    (`mcp__ctproxy__history_search_contents`, or namespace `mcp__ctproxy`) and a bare name file the same
    concept pair, hidden from default list/search; other MCP servers and other ctproxy tools keep theirs."""
    bridged = {"type": "mcp_call", "id": "mcp_1", "server_label": "ctproxy", "name": "notes_write_file",
               "arguments": "{}", "output": "ok"}
    assert tool_of(bridged) == ("notes", "write_file")
    assert tool_of({**bridged, "name": "new_context"}) == ("functions", "new_context")
    assert tool_of({**bridged, "name": "exec_command"}) == ("ctproxy", "exec_command")
    assert tool_of({**bridged, "server_label": "fs", "name": "notes_write_file"}) == ("fs", "notes_write_file")
    assert tool_of({**CALL, "name": "mcp__ctproxy__history_search_contents"}) == ("history", "search_contents")
    assert tool_of({**CALL, "name": "mcp__ctproxy__get_context_remaining"}) == ("functions", "get_context_remaining")
    assert tool_of({**CALL, "namespace": "mcp__ctproxy", "name": "history_read_item"}) == ("history", "read_item")
    for item in (bridged, {**CALL, "name": "mcp__ctproxy__history_search_contents"},
                 {**bridged, "name": "get_context_remaining"}):
        assert is_hidden_tool(*tool_of(item)), item
    assert not is_hidden_tool(*tool_of({**bridged, "name": "exec_command"}))


def test_control_messages():
    assert is_control({"role": "developer", "content": "<ctp_guidance>do this</ctp_guidance>"})
    assert is_control({"role": "user", "content": [{"type": "input_text", "text": "  <ctp_reminder>x"}]})
    assert not is_control({"role": "user", "content": "please use <ctp_x> tags"})


@pytest.mark.parametrize("bad", ["root", "/", "/root/", "/root//a", "/root/./a", "/root/../a", "/root/root",
                                 "/root/A", "/root/a-b", "/boss", "/root/a/root"])
def test_invalid_addresses(bad):
    with pytest.raises(AddressError):
        validate_address(bad)


def test_address_resolution():
    assert resolve_address(None) == "/root"
    assert resolve_address("reviewer") == "/root/reviewer"
    assert resolve_address("checker", base="/root/reviewer") == "/root/reviewer/checker"
    assert resolve_address("/root/x/y", base="/root/reviewer") == "/root/x/y"
    with pytest.raises(AddressError):
        resolve_address("..", base="/root/reviewer")
    assert auto_address("c:abc") == auto_address("c:abc") != auto_address("c:abd")
    assert validate_address(auto_address("k"))


def test_regions_read_back_exactly_and_at_most_three():
    text = "alpha needle beta " * 30 + "😀needle😀" + " gamma" * 100
    segs = [(0, len(text))]
    ms = find_matches(text, segs, "needle")
    assert len(ms) == 31
    regs = regions(text, ms, 400)
    assert 1 <= len(regs) <= 3
    for g in regs:
        assert text[g.offset_chars:g.offset_chars + g.limit_chars] == g.text
        for s, e in g.matches:
            assert g.offset_chars <= s and e <= g.offset_chars + g.limit_chars and text[s:e] == "needle"
    assert sum(g.limit_chars for g in regs) <= 400 + 6


def test_pages_reconstruct_unicode_text():
    text = "a😀b" * 50 + "é" * 7
    parts, off = [], 0
    while True:
        pg = page(text, off, 7)
        parts.append(pg.text)
        if pg.next_offset is None:
            break
        off = pg.next_offset
    assert "".join(parts) == text
    assert page(text, 10_000, 5).text == "" and page(text, 10_000, 5).offset == len(text)
    assert preview("x" * 10, 5) == "xxxx…" and preview("xy", 5) == "xy"

_ITEMS = st.sampled_from([
    USER, OUT_MSG, REASONING, CALL, OUTPUT, {"role": "user", "content": "b"}, {"role": "developer", "content": "d"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
])


@settings(max_examples=300, deadline=None)
@given(st.lists(_ITEMS, min_size=0, max_size=12), st.lists(_ITEMS, min_size=0, max_size=12),
       st.integers(min_value=0, max_value=12), st.booleans())
def test_alignment_invariants(branch_items, tail, cut, drop_reasoning):
    entries = _branch(*branch_items)
    sent = [i for i in branch_items[:cut] if not (drop_reasoning and i is REASONING)] + tail
    a = align(entries, sent)
    # Input items matched to the branch come first, in increasing branch order, with equal content.
    matched = [(k, j) for k, j in enumerate(a.matched) if j is not None]
    assert [k for k, _ in matched] == list(range(len(matched)))
    assert all(j1 < j2 for (_, j1), (_, j2) in itertools.pairwise(matched))
    assert all(entries[j].canon == canonical_hash(sent[k]) for k, j in matched)
    if a.kind != "compaction":
        assert a.new_from == len(matched)
        assert not matched or a.keep > matched[-1][1]
    assert 0 <= a.keep <= len(entries)
    # Resending the branch exactly is never an edit.
    again = align(entries, list(branch_items))
    assert again.kind == ("continue" if entries else "new") and again.new_from == len(branch_items) == len(entries)


def test_a_failed_bridged_call_keeps_its_error_text():
    """Seed 000 defect 11: the bridge stores an mcp_call's error as the API's object; its text is kept."""
    from proxy.items.bridged import mcp_error

    item = {"type": "mcp_call", "id": "mcp_1", "server_label": "ctproxy", "name": "notes_read_file",
            "arguments": '{"path":"missing.md"}', "output": None,
            "error": mcp_error("no note 'missing.md' in the notes of /root")}
    text = render_item(item).text
    assert "no note 'missing.md' in the notes of /root" in text and '{"path":"missing.md"}' in text
    assert "an older string error" in render_item({**item, "error": "an older string error"}).text


def test_messages_a_client_injects_are_control():
    """Seed 000 defect 9: Codex's injected user-role context is not one of the user's requests."""
    env = {"role": "user", "content": [{"type": "input_text",
                                         "text": "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"}]}
    agents = {"role": "user",
              "content": "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\nbe kind\n</INSTRUCTIONS>"}
    assert is_control(env) and is_control(agents)
    assert not is_control({"role": "user", "content": "why does <environment_context> show up in my logs?"})
    assert not is_control({"role": "user", "content": "fix the bug"})
    assert not is_control({"role": "developer", "content": "<environment_context>x</environment_context>"})
