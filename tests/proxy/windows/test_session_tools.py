"""Tools are tools, however a client declares them (issue 46 (1), issue 44 (2)): one function reads every shape
the Responses API allows, and the texts the model reads name the tools as it sees them."""

from __future__ import annotations

import copy

from proxy.windows.notes import bootstrap as boot
from proxy.windows.notes import reminder
from proxy.windows.opening import reachable_context_tools

CTX = list(boot.ALL_TOOLS)


def fn(name: str) -> dict:
    return {"type": "function", "name": name, "description": name, "strict": False,
            "parameters": {"type": "object", "properties": {}}}


def dev(text: str) -> dict:
    return {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}]}


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


CODEX_NAMESPACE = {"type": "namespace", "name": "mcp__ctproxy", "description": "ctproxy",
                   "tools": [fn(n) for n in CTX]}


def test_top_level_functions_flat_codex_names_and_custom_tools():
    flat = reachable_context_tools({"tools": [fn(f"mcp__ctproxy__{n}") for n in CTX], "input": []}, [])
    assert tuple(flat) == boot.ALL_TOOLS
    assert boot.seen_as(flat, "history_read_item") == "mcp__ctproxy__history_read_item"
    plain = reachable_context_tools({"tools": [fn(n) for n in CTX], "input": []}, [])
    assert tuple(plain) == boot.ALL_TOOLS and boot.seen_as(plain, "new_context") == "new_context"
    custom = reachable_context_tools({"tools": [{"type": "custom", "name": "notes_write_file"}], "input": []}, [])
    assert tuple(custom) == ("notes_write_file",)


def test_codex_namespace_is_read_and_spelled_inside_it():
    """The old code read only top-level functions: Codex's `mcp__ctproxy` namespace gave nothing (defect 1)."""
    tools = reachable_context_tools({"tools": [fn("shell"), CODEX_NAMESPACE], "input": [user("hi")]}, [])
    assert tuple(tools) == boot.ALL_TOOLS
    assert boot.seen_as(tools, "history_read_item") == "mcp__ctproxy.history_read_item"
    text = boot.guidance_text(tools)
    assert "mcp__ctproxy.history_read_item" in text and "mcp__ctproxy.notes_write_file" in text
    assert "then call mcp__ctproxy.new_context" in text
    assert " history_read_item" not in text.replace("mcp__ctproxy.history_read_item", "")
    assert "mcp__ctproxy.notes_write_file" in reminder.reminder_text(90, 100, tools)
    assert "then call mcp__ctproxy.new_context" in reminder.reminder_text(90, 100, tools)


def test_additional_tools_item_of_codex_lite_path():
    payload = {"input": [{"type": "additional_tools", "role": "developer",
                          "tools": [{"type": "namespace", "name": "functions", "tools": [fn("exec"), fn("wait")]},
                                    CODEX_NAMESPACE]},
                         user("hi")]}
    tools = reachable_context_tools(payload, [])
    assert tuple(tools) == boot.ALL_TOOLS and boot.seen_as(tools, "new_context") == "mcp__ctproxy.new_context"


def test_deferred_namespace_of_ctproxys_is_reachable():
    payload = {"input": [
        {"type": "additional_tools", "role": "developer",
         "tools": [{"type": "namespace", "name": "functions", "tools": [fn("exec"), fn("wait")]}]},
        dev("You are Codex."),
        dev("## Tools\nDeferred tool namespaces: mcp__ctproxy, mcp__other\nLoad them with exec."),
        user("say hello")]}
    tools = reachable_context_tools(payload, [])
    assert tuple(tools) == boot.ALL_TOOLS
    # code mode: `exec` calls them as tools.mcp__ctproxy__history_read_item
    assert boot.seen_as(tools, "history_read_item") == "mcp__ctproxy__history_read_item"
    # Codex 0.171's own wording: one bullet per namespace, inside its <tools> block
    bullets = {"input": [dev("You are Codex."), dev("<tools>\nDeferred tool namespaces:\n- mcp__ctproxy\n</tools>"),
                         user("hi")]}
    assert tuple(reachable_context_tools(bullets, [])) == boot.ALL_TOOLS
    # another server's deferred namespace is not ctproxy's; and a user message saying it does not count
    assert reachable_context_tools({"input": [dev("Deferred tool namespaces: mcp__other"), user("x")]}, []) == ()
    assert reachable_context_tools({"input": [user("Deferred tool namespaces: mcp__ctproxy")]}, []) == ()


def test_hosted_mcp_tool_at_ctprox_mcp_with_its_allowed_tools():
    mcp = {"type": "mcp", "server_label": "ctx", "server_url": "http://127.0.0.1:4100/mcp",
           "require_approval": "never", "allowed_tools": ["history_read_item", "notes_write_file", "new_context"]}
    tools = reachable_context_tools({"tools": [mcp], "input": []}, [])
    assert tuple(tools) == ("history_read_item", "notes_write_file", "new_context")
    elsewhere = {**mcp, "server_url": "https://mcp.example.com/mcp"}
    assert reachable_context_tools({"tools": [elsewhere], "input": []}, []) == ()


def test_bridged_families_and_nothing_declared():
    assert tuple(reachable_context_tools({"input": []}, ["notes"])) == boot.NOTES_TOOLS
    assert reachable_context_tools({"tools": [fn("shell")], "input": []}, []) == ()


def test_the_answer_follows_a_new_input_of_the_same_tools():
    """Kept per request: the same `tools` with another input (a deferred namespace now named) is asked again."""
    tools = [fn("shell")]
    assert reachable_context_tools({"tools": tools, "input": [user("x")]}, []) == ()
    again = {"tools": tools, "input": [dev("Deferred tool namespaces: mcp__ctproxy"), user("x")]}
    assert tuple(reachable_context_tools(again, [])) == boot.ALL_TOOLS
    before = copy.deepcopy(again)
    reachable_context_tools(again, [])
    assert again == before  # read only


def test_a_new_windows_bootstrap_names_the_tools_as_seen():
    tools = reachable_context_tools({"tools": [CODEX_NAMESPACE], "input": []}, [])
    start = boot.WindowStart("/root", "w2", "w1", boot.NotesSnapshot("/root", ()), tools, "task_x")
    head, _ = boot.window_notes(start)
    texts = [p["text"] for item in head for p in item["content"]]
    assert "read it with mcp__ctproxy.history_list_items (window_id=w1)" in texts[1]
    plain = boot.window_notes(boot.WindowStart("/root", "w2", "w1", boot.NotesSnapshot("/root", ()),
                                               boot.ALL_TOOLS, "task_x"))[0]
    assert "read it with history_list_items (window_id=w1)" in plain[1]["content"][0]["text"]
