"""The four history tools called directly (Tool.call) over a journal built with the real writer."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.config import Config
from proxy.journal import Journal
from proxy.session import SessionIdentity
from proxy.state import StateDir
from tools_server.history import create_family
from tools_server.history.schemas import CODEX_TOOLS, ENCRYPTED_FIELDS, runtime_parameters
from tools_server.registry import CallContext, Services, ToolError

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()
LONG = "".join(f"line {i} 😀 ünïcode {'x' * (i % 7)}\n" for i in range(900))  # > 12,000 code points


@dataclass
class World:
    services: Services
    task: str
    ids: dict[str, str]
    journal: Journal


def _msg(role: str, text: str) -> dict:
    return {"role": role, "content": text}


def _out(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _respond(j: Journal, mark, items, rid):
    return j.ingest_response(mark, items, response_id=rid, model="gpt-5", status="completed", usage=None,
                             error=None, incomplete=False)


def build_world(state: StateDir, services: Services | None = None) -> World:
    """A task with /root (two windows, tools, images, a control message) and /root/reviewer, plus an
    agent of another task; flushed, ready for the tools."""
    j = Journal(state)
    ids: dict[str, str] = {}
    key, task, addr = j.resolve(SessionIdentity("f:root", "fingerprint", None, None), {}, {})
    root = j.session(key, task, addr)
    history: list[dict] = []

    def turn(new_input: list[dict], outputs: list[dict], rid: str) -> tuple[list[str], list[str]]:
        history.extend(new_input)
        mark = j.ingest_request(root, {"input": list(history)})
        out = _respond(j, mark, outputs, rid)
        history.extend(outputs)
        return mark.input_ids[-len(new_input):], out

    (ids["dev"],), _ = turn([_msg("developer", "be terse")], [], "r0")
    (ids["ask"],), (ids["answer"],) = turn([_msg("user", "find the needle please")], [_out("ok, needle hunt")], "r1")
    (ids["run"],), (ids["call"],) = turn([_msg("user", "run it")], [
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd":"grep needle"}'}],
        "r2")
    (ids["call_out"], ids["ctrl"]), (ids["hcall"],) = turn(
        [{"type": "function_call_output", "call_id": "c1", "output": "needle found in a.txt"},
         _msg("developer", "<ctp_reminder>needle budget low</ctp_reminder>")],
        [{"type": "function_call", "call_id": "h1", "name": "history_search_contents",
          "arguments": '{"query":"needle"}'}], "r3")
    (ids["hout"],), _ = turn([{"type": "function_call_output", "call_id": "h1", "output": "needle results"}], [],
                             "r4")
    (ids["image"],), _ = turn([{"role": "user", "content": [
        {"type": "input_text", "text": "see picture"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"}]}], [], "r5")
    head = j.chain_head(root.key)
    j.start_window(root.key, head, "notes", {"notes": []})
    (ids["long"],), _ = turn([_msg("user", LONG)], [], "r6")
    (ids["late"],), _ = turn([_msg("user", "needle in window two " * 40)], [], "r7")
    # A second agent in the same task, and an agent of another task.
    ckey, _, caddr = j.resolve(SessionIdentity("t:c", "header", task, "reviewer"), {}, {})
    child = j.session(ckey, task, caddr)
    m = j.ingest_request(child, {"input": [_msg("user", "review the needle patch")]})
    ids["child"] = m.input_ids[0]
    okey, otask, oaddr = j.resolve(SessionIdentity("f:other", "fingerprint", None, None), {}, {})
    other = j.session(okey, otask, oaddr)
    j.ingest_request(other, {"input": [_msg("user", "other task needle")]})
    ids["other_task"] = otask
    assert j.flush()
    return World(services or Services(Config(), state, state.root), task, ids, j)


@pytest.fixture
def world(tmp_path: Path):
    w = build_world(StateDir.open(tmp_path / "state"))
    yield w
    w.journal.close()


@pytest.fixture
async def tools(world: World):
    fam = create_family(world.services)
    yield {t.name: t for t in fam.tools()}
    await fam.close()


def ctx(world: World, agent: str | None = None, task: str | None = "", call_id: str | None = None) -> CallContext:
    return CallContext(world.services, task=world.task if task == "" else task, agent=agent, call_id=call_id)


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()[1:] if line.startswith("{")]


def test_runtime_schemas_are_codex_minus_encrypted():
    for name, (_, frozen) in CODEX_TOOLS.items():
        if not name.startswith("history_"):
            continue
        runtime = runtime_parameters(name)
        for tool, field in ENCRYPTED_FIELDS:
            if tool == name:
                assert frozen["properties"][field]["encrypted"] is True
                assert "encrypted" not in runtime["properties"][field]
                runtime["properties"][field]["encrypted"] = True
        assert runtime == frozen
    assert runtime_parameters("history_read_item")["required"] == ["item_id", "window_id"]


async def test_list_windows(world, tools):
    res = await tools["history_list_windows"].call({}, ctx(world))
    rows = lines(res.text)
    assert [r["window_id"] for r in rows] == ["w1", "w2"]
    assert rows[0]["items"] == 7 and rows[0]["hidden_items"] == 3 and rows[1]["current"] is True
    res = await tools["history_list_windows"].call({"recent_first": True, "limit": 1}, ctx(world))
    assert [r["window_id"] for r in lines(res.text)] == ["w2"]


async def test_list_items_default_hides_control_and_recovery_tools(world, tools):
    res = await tools["history_list_items"].call({}, ctx(world))
    got = [r["item_id"] for r in lines(res.text)]
    w = world.ids
    assert got == [w["dev"], w["ask"], w["answer"], w["run"], w["call"], w["call_out"], w["image"], w["long"],
                   w["late"]]
    res = await tools["history_list_items"].call({"recent_first": True, "limit": 2}, ctx(world))
    assert [r["item_id"] for r in lines(res.text)] == [w["late"], w["long"]]
    assert "not shown" in res.text  # says there is more and how to narrow


async def test_list_items_filters(world, tools):
    w = world.ids
    call = tools["history_list_items"].call
    assert [r["item_id"] for r in lines((await call({"role": "tool"}, ctx(world))).text)] == [w["call_out"]]
    assert [r["item_id"] for r in lines((await call({"window_id": "w2"}, ctx(world))).text)] == [w["long"], w["late"]]
    assert lines((await call({"window_id": "w9"}, ctx(world))).text) == []  # unknown window: empty, no error
    ns = await call({"tool_namespace": "history"}, ctx(world))
    assert [r["item_id"] for r in lines(ns.text)] == [w["hcall"], w["hout"]]
    assert all(r["tool"] == "history.search_contents" for r in lines(ns.text))
    flat = await call({"tool_name": "history_search_contents"}, ctx(world))
    assert [r["item_id"] for r in lines(flat.text)] == [w["hcall"], w["hout"]]
    both = await call({"tool_namespace": "functions", "tool_name": "exec_command"}, ctx(world))
    assert [r["item_id"] for r in lines(both.text)] == [w["call"], w["call_out"]]
    mixed = await call({"tool_namespace": "history", "tool_name": "exec_command"}, ctx(world))
    assert lines(mixed.text) == []  # namespace and name must belong to the same call
    # The call being executed never lists itself.
    me = await call({"tool_namespace": "history"}, ctx(world, call_id="h1"))
    assert lines(me.text) == []


async def test_list_items_limits_clamping_and_previews(world, tools):
    call = tools["history_list_items"].call
    res = await call({"limit": 1000, "max_chars_per_item": 10}, ctx(world))
    assert "limit clamped to 200" in res.text
    rows = lines(res.text)
    assert all(len(r["preview"]) <= 10 for r in rows)
    long_row = next(r for r in rows if r["item_id"] == world.ids["long"])
    assert long_row["chars"] == len(LONG) and long_row["preview"].endswith("…")
    default = lines((await call({}, ctx(world))).text)
    assert max(len(r["preview"]) for r in default) == 400
    big = await call({"max_chars_per_item": 5900}, ctx(world))
    assert len(big.text) <= 6000 and "max_chars_per_item clamped" in big.text
    for line in big.text.splitlines()[1:]:
        assert line.startswith("{") or line.startswith("[")  # whole lines only
    for bad in ({"limit": 0}, {"limit": "5"}, {"max_chars_per_item": 0}, {"role": "toolResult"}):
        with pytest.raises(ToolError):
            await call(bad, ctx(world))


async def test_unknown_and_foreign_fields_are_named(world, tools):
    with pytest.raises(ToolError, match="'query' belongs to history_search_contents"):
        await tools["history_list_items"].call({"query": "x"}, ctx(world))
    with pytest.raises(ToolError, match="'path' belongs to notes_"):
        await tools["history_list_windows"].call({"path": "x"}, ctx(world))
    with pytest.raises(ToolError, match="unknown field 'cursor'"):
        await tools["history_search_contents"].call({"query": "x", "cursor": 1}, ctx(world))
    with pytest.raises(ToolError, match="max_chars_per_item"):
        await tools["history_search_contents"].call({"query": "x", "max_chars_per_item": 5}, ctx(world))


async def test_read_item_requires_matching_window(world, tools):
    read = tools["history_read_item"].call
    with pytest.raises(ToolError, match="window_id"):
        await read({"item_id": world.ids["ask"]}, ctx(world))
    res = await read({"item_id": world.ids["ask"], "window_id": "w2"}, ctx(world))
    assert res.is_error and "in window 'w1', not 'w2'" in res.text
    res = await read({"item_id": "it_nope", "window_id": "w1"}, ctx(world))
    assert res.is_error and "history_list_items" in res.text
    ok = await read({"item_id": world.ids["ask"], "window_id": "w1"}, ctx(world))
    assert not ok.is_error and ok.text.endswith("find the needle please")
    # Hidden records are still readable by id.
    hidden = await read({"item_id": world.ids["hout"], "window_id": "w1"}, ctx(world))
    assert hidden.text.endswith("needle results")


async def test_read_item_pages_reconstruct_unicode(world, tools):
    read = tools["history_read_item"].call
    first = await read({"item_id": world.ids["long"], "window_id": "w2"}, ctx(world))
    assert 11_900 <= len(first.text) <= 12_000 and first.details["next_offset_chars"] is not None
    assert first.details["offset_chars"] == 0 and len(first.text.split("\n", 2)[2]) == first.details["end_chars"]
    parts, offset = [], 0
    while True:
        res = await read({"item_id": world.ids["long"], "window_id": "w2", "offset_chars": offset,
                          "limit_chars": 997}, ctx(world))
        text = res.text.split("\n", 2)[2]
        assert len(text) == res.details["end_chars"] - res.details["offset_chars"] <= 997
        parts.append(text)
        if res.details["next_offset_chars"] is None:
            break
        offset = res.details["next_offset_chars"]
    assert "".join(parts) == LONG
    past = await read({"item_id": world.ids["long"], "window_id": "w2", "offset_chars": 10**9}, ctx(world))
    assert past.details["offset_chars"] == len(LONG) and past.text.endswith("\n")


async def test_images_only_on_read_item(world, tools):
    listed = await tools["history_list_items"].call({}, ctx(world))
    row = next(r for r in lines(listed.text) if r["item_id"] == world.ids["image"])
    assert row["images"] == 1 and "[image #1: image/png" in row["preview"] and PNG not in listed.text
    assert not listed.images
    found = await tools["history_search_contents"].call({"query": "see picture"}, ctx(world))
    assert not found.images and PNG not in found.text
    read = await tools["history_read_item"].call({"item_id": world.ids["image"], "window_id": "w1"}, ctx(world))
    assert len(read.images) == 1 and read.images[0].data_base64 == PNG and read.images[0].mime_type == "image/png"
    assert "1 image(s) attached" in read.text


async def test_search_regions_read_back_exactly(world, tools):
    res = await tools["history_search_contents"].call({"query": "needle"}, ctx(world))
    rows = lines(res.text)
    w = world.ids
    assert [r["item_id"] for r in rows] == [w["ask"], w["answer"], w["call"], w["call_out"], w["late"]]
    late = rows[-1]
    assert late["matches"] == 40 and 1 <= len(late["regions"]) <= 3
    for region in late["regions"]:
        back = await tools["history_read_item"].call(
            {"item_id": w["late"], "window_id": "w2", "offset_chars": region["offset_chars"],
             "limit_chars": region["limit_chars"]}, ctx(world))
        assert back.text.split("\n", 2)[2] == region["text"]
        for s, e in region["matches"]:
            assert region["text"][s - region["offset_chars"]:e - region["offset_chars"]] == "needle"
    assert "ünïcode" in (await tools["history_search_contents"].call({"query": "ünïcode"}, ctx(world))).text
    # Case-sensitive and literal; short queries scan.
    assert lines((await tools["history_search_contents"].call({"query": "NEEDLE"}, ctx(world))).text) == []
    assert lines((await tools["history_search_contents"].call({"query": "😀"}, ctx(world))).text)[0]["item_id"] \
        == w["long"]
    assert lines((await tools["history_search_contents"].call({"query": "a.txt"}, ctx(world))).text)[0][
        "item_id"] == w["call_out"]


async def test_search_filters_order_limit_and_hidden(world, tools):
    search = tools["history_search_contents"].call
    w = world.ids
    recent = await search({"query": "needle", "recent_first": True, "limit": 2}, ctx(world))
    assert [r["item_id"] for r in lines(recent.text)] == [w["late"], w["call_out"]]
    assert "2+" in recent.text.splitlines()[0]
    tool = await search({"query": "needle", "role": "tool"}, ctx(world))
    assert [r["item_id"] for r in lines(tool.text)] == [w["call_out"]]
    hist = await search({"query": "needle", "tool_namespace": "history"}, ctx(world))
    assert [r["item_id"] for r in lines(hist.text)] == [w["hcall"], w["hout"]]
    assert lines((await search({"query": "needle", "window_id": "nope"}, ctx(world))).text) == []
    # The control message is never found by default.
    assert all(r["item_id"] != w["ctrl"] for r in lines((await search({"query": "budget"}, ctx(world))).text))
    empty = await search({"query": ""}, ctx(world))
    assert empty.is_error


async def test_search_output_is_capped_at_whole_lines(world, tools):
    res = await tools["history_search_contents"].call({"query": "e", "limit": 200}, ctx(world))
    assert len(res.text) <= 6000
    for line in res.text.splitlines()[1:]:
        if line.startswith("{"):
            json.loads(line)
        else:
            assert "narrow" in line


async def test_cross_agent_inside_the_task_and_refusal_outside(world, tools):
    listed = await tools["history_list_items"].call({"agent_name": "reviewer"}, ctx(world))
    assert [r["item_id"] for r in lines(listed.text)] == [world.ids["child"]]
    absolute = await tools["history_list_items"].call({"agent_name": "/root/reviewer"}, ctx(world))
    assert lines(absolute.text) == lines(listed.text)
    # The child reads its parent by absolute address; relative names resolve under the caller.
    up = await tools["history_search_contents"].call({"query": "needle", "agent_name": "/root"},
                                                     ctx(world, agent="/root/reviewer"))
    assert len(lines(up.text)) == 5
    rel = await tools["history_list_items"].call({"agent_name": "reviewer"}, ctx(world, agent="reviewer"))
    assert rel.is_error and "/root/reviewer/reviewer" in rel.text
    unknown = await tools["history_list_windows"].call({"agent_name": "ghost"}, ctx(world))
    assert unknown.is_error and "unknown agent" in unknown.text
    bad = await tools["history_list_windows"].call({"agent_name": "/root/../x"}, ctx(world))
    assert bad.is_error and "invalid agent address" in bad.text
    foreign = await tools["history_search_contents"].call({"query": "needle"},
                                                          ctx(world, task=world.ids["other_task"]))
    assert all(r["item_id"] not in world.ids.values() for r in lines(foreign.text))
    none = await tools["history_list_items"].call({}, ctx(world, task=None))
    assert none.is_error and "no task" in none.text and none.details["error"] == "no_task"
    res = await tools["history_list_items"].call({}, ctx(world, task="task_0000"))
    assert res.is_error and "unknown task" in res.text


def test_a_bare_tool_name_finds_the_agents_calls_and_the_ones_ctproxy_ran_itself():
    """`tool_name: notes_write_file` without a namespace: an agent's call is journaled as the concept pair
    (`notes`, `write_file`), and so is one ctproxy ran (the bridge's `mcp_call`); one journaled before that
    under the server label (`ctproxy`, `notes_write_file`) is found too. With a namespace, only that one."""
    import sqlite3

    from proxy.journal.query import ItemFilter
    from proxy.journal.schema import DDL

    db = sqlite3.connect(":memory:")
    db.executescript(DDL)
    rows = [("a", "notes", "write_file"), ("b", "ctproxy", "notes_write_file"), ("c", "functions", "exec_command"),
            ("d", "ctproxy", "get_context_remaining")]
    for k, (iid, ns, name) in enumerate(rows):
        db.execute("INSERT INTO journal_items (seq, item_id, session_key, window_id, origin, type, tool_namespace,"
                   " tool_name, canon_hash, text, segments, chars, images, created_at) VALUES"
                   " (?, ?, 's', 'w1', 'input', 'function_call', ?, ?, 'h', '', '[]', 0, 0, 0)", (k, iid, ns, name))

    def found(flt: ItemFilter) -> list[str]:
        where, params = flt.normalized().sql()
        return [r[0] for r in db.execute(f"SELECT i.item_id FROM journal_items i WHERE {where} ORDER BY seq",
                                         params)]

    assert found(ItemFilter(tool_name="notes_write_file")) == ["a", "b"]
    assert found(ItemFilter(tool_namespace="notes", tool_name="write_file")) == ["a"]
    # ctproxy's own namespace names the same tool: every road is filed under the concept pair now (seed 000
    # defect 12), and a row journaled before that under the server label is found too
    assert found(ItemFilter(tool_namespace="ctproxy", tool_name="notes_write_file")) == ["a", "b"]
    assert found(ItemFilter(tool_namespace="ctproxy")) == ["b", "d"]
    assert found(ItemFilter(tool_name="exec_command")) == ["c"]


async def test_truncation_notes_name_what_stopped_the_list(world, tools):
    """Seed 000 defect 8: a list stopped by `limit` says so and advises raising it; one cut by the output
    size says that and advises narrowing."""
    by_limit = await tools["history_list_items"].call({"limit": 3}, ctx(world))
    note = by_limit.text.splitlines()[-1]
    assert "stopped at limit" in note and "raise limit (up to 200)" in note and "output is capped" not in note
    windows = await tools["history_list_windows"].call({"limit": 1}, ctx(world))
    assert "stopped at limit" in windows.text.splitlines()[-1]
    by_size = await tools["history_list_items"].call({"limit": 200, "max_chars_per_item": 5000}, ctx(world))
    note = by_size.text.splitlines()[-1]
    assert "output is capped at" in note and "stopped at limit" not in note


async def test_errors_quote_arguments_within_the_output_limit(world, tools):
    """Seed 000 defect 14: an over-long argument is quoted cut, never echoed whole."""
    res = await tools["history_read_item"].call({"item_id": "i" * 100_000, "window_id": "w1"}, ctx(world))
    assert res.is_error and len(res.text) < 1000 and "100000 characters" in res.text
    res = await tools["history_list_items"].call({"agent_name": "a" * 10_000}, ctx(world))
    assert res.is_error and len(res.text) < 2000, len(res.text)


async def test_a_small_configured_cap_still_shows_hits_and_previews(world, tools):
    """Seed 000 defect 10: with history.max_tool_output_chars at 800 (allowed), a search that matches all
    over a 1,000-character message still shows that hit, and a list shows several previews."""

    j = world.journal
    key, task, addr = j.resolve(SessionIdentity("f:qqq", "fingerprint", None, None), {}, {})
    session = j.session(key, task, addr)
    j.ingest_request(session, {"input": [_msg("user", "q" * 1000), _msg("user", "short one"),
                                         _msg("user", "short two"), _msg("user", "short three")]})
    assert j.flush()
    world.services.config.history.max_tool_output_chars = 800
    found = await tools["history_search_contents"].call({"query": "qqq"}, ctx(world, task=task))
    assert len(lines(found.text)) == 1 and len(found.text) <= 800, found.text
    listed = await tools["history_list_items"].call({}, ctx(world, task=task))
    assert len(lines(listed.text)) == 4 and len(listed.text) <= 800, listed.text
