"""The nine history/notes tools through the real tool server: REST and the official MCP client."""

from __future__ import annotations

import json

from tests.tools_server.history.test_history_tools import PNG, build_world

NINE = {"history_list_windows", "history_list_items", "history_read_item", "history_search_contents",
        "notes_list_files_by_prefix", "notes_read_file", "notes_search_contents", "notes_append_to_file",
        "notes_write_file"}


def said(res) -> str:
    """The text of a result, or a REST error's message (validation errors are HTTP 400 there)."""
    body = getattr(res, "body", None) or {}
    return (body.get("error") or {}).get("message") or res.text


def rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def test_specs_listed_over_rest_and_mcp(tool_server):
    srv = await tool_server()
    specs = {s["name"]: s for s in await srv.list_rest()}
    assert set(specs) >= NINE
    assert specs["history_read_item"]["parameters"]["required"] == ["item_id", "window_id"]
    assert "encrypted" not in json.dumps(specs["notes_write_file"]["parameters"])
    mcp_tools = {t.name: t for t in await srv.mcp_list()}
    assert set(mcp_tools) >= NINE
    assert mcp_tools["history_search_contents"].input_schema["required"] == ["query"]


async def test_history_tools_over_rest_and_mcp(tool_server):
    srv = await tool_server()
    world = build_world(srv.services.state, srv.services)
    try:
        task, ids = world.task, world.ids
        for call in (srv.rest, srv.mcp):
            wins = await call("history_list_windows", {}, task=task)
            assert [r["window_id"] for r in rows(wins.text)] == ["w1", "w2"]
            items = await call("history_list_items", {"role": "tool"}, task=task, agent="/root")
            assert [r["item_id"] for r in rows(items.text)] == [ids["call_out"]]
            hist = await call("history_list_items", {"tool_namespace": "functions", "tool_name": "exec_command"},
                              task=task)
            assert [r["item_id"] for r in rows(hist.text)] == [ids["call"], ids["call_out"]]
            found = await call("history_search_contents", {"query": "needle", "window_id": "w2"}, task=task)
            hit = rows(found.text)[0]
            region = hit["regions"][0]
            back = await call("history_read_item", {"item_id": hit["item_id"], "window_id": "w2",
                                                    "offset_chars": region["offset_chars"],
                                                    "limit_chars": region["limit_chars"]}, task=task)
            assert back.text.split("\n", 2)[2] == region["text"]
            wrong = await call("history_read_item", {"item_id": ids["ask"], "window_id": "w2"}, task=task)
            assert "not 'w2'" in wrong.text
            child = await call("history_list_items", {"agent_name": "reviewer"}, task=task)
            assert [r["item_id"] for r in rows(child.text)] == [ids["child"]]
            foreign = await call("history_list_items", {"agent_name": "/root/reviewer"}, task=ids["other_task"])
            assert "unknown agent" in foreign.text
            extra = await call("history_list_windows", {"query": "x"}, task=task)
            assert "'query' belongs to history_search_contents" in said(extra)
        rest_img = await srv.rest("history_read_item", {"item_id": ids["image"], "window_id": "w1"}, task=task)
        assert rest_img.ok and rest_img.body["images"][0]["data"] == PNG
        mcp_img = await srv.mcp("history_read_item", {"item_id": ids["image"], "window_id": "w1"}, task=task)
        images = [c for c in mcp_img.content if getattr(c, "type", "") == "image"]
        assert len(images) == 1 and images[0].data == PNG and images[0].mime_type == "image/png"
        mcp_list = await srv.mcp("history_list_items", {}, task=task)
        assert not [c for c in mcp_list.content if getattr(c, "type", "") == "image"] and PNG not in mcp_list.text
        bad = await srv.rest("history_list_items", {"limit": 0}, task=task)
        assert not bad.ok
    finally:
        world.journal.close()


async def test_notes_tools_over_rest_and_mcp(tool_server):
    srv = await tool_server()
    world = build_world(srv.services.state, srv.services)
    try:
        task = world.task
        w = await srv.rest("notes_write_file", {"path": "checkpoint.md", "text": "alpha\nbeta\n"}, task=task)
        assert w.ok and w.details["created"] is True
        a = await srv.mcp("notes_append_to_file", {"path": "checkpoint.md", "text": "gamma\n"}, task=task)
        assert not a.is_error and "now 17 bytes" in a.text
        for call in (srv.rest, srv.mcp):
            r = await call("notes_read_file", {"path": "checkpoint.md", "start_line": -2}, task=task)
            assert r.text.split("\n", 1)[1] == "beta\ngamma\n"
            ls = await call("notes_list_files_by_prefix", {"prefix": "check"}, task=task)
            assert [x["path"] for x in rows(ls.text)] == ["checkpoint.md"]
            s = await call("notes_search_contents", {"query": "gam"}, task=task)
            assert "checkpoint.md:3: gamma" in s.text
            other = await call("notes_read_file", {"path": "/root/notes/checkpoint.md"}, task=task,
                               agent="reviewer")
            assert other.text.endswith("gamma\n")
            outside = await call("notes_read_file", {"path": "/root/reviewer/notes/x.md"}, task=world.ids["other_task"])
            assert "unknown agent" in outside.text
            wrong = await call("notes_write_file", {"path": "x.md", "text": "t", "query": "q"}, task=task)
            assert "'query' belongs to" in said(wrong)
            notask = await call("notes_list_files_by_prefix", {}, task=None)
            assert "no task" in notask.text
    finally:
        world.journal.close()
