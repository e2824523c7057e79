"""The apply_patch registry entry: both transports' specs, the switch, and calls over REST/MCP."""

from __future__ import annotations

from pathlib import Path

import jsonschema

from tests.support.toolserver import make_services
from tools_server.families import FAMILY_MODULES, build_registry
from tools_server.patch import PatchFamily
from tools_server.patch.spec import LARK_GRAMMAR
from tools_server.registry import CallContext


def test_registered_and_off_by_default(tmp_path: Path) -> None:
    assert "tools_server.patch" in FAMILY_MODULES
    registry = build_registry(make_services(tmp_path))
    assert "apply_patch" in {t.name for t in registry.all_tools()}
    assert registry.get("apply_patch") is None  # seed 004 §5.4: off by default
    enabled = build_registry(make_services(tmp_path / "on", {"apply_patch.enabled": True}))
    assert enabled.get("apply_patch") is not None


def test_function_spec_takes_one_patch_string(tmp_path: Path) -> None:
    tool = PatchFamily(make_services(tmp_path)).tool
    spec = tool.function_spec()
    assert spec["type"] == "function" and spec["name"] == "apply_patch"
    params = spec["parameters"]
    assert params["required"] == ["patch"] and params["additionalProperties"] is False
    assert set(params["properties"]) == {"patch", "cwd"}
    jsonschema.Draft202012Validator.check_schema(params)
    jsonschema.validate({"patch": "*** Begin Patch\n*** End Patch"}, params)
    assert tool.parallel is False  # edits are sequential, as in the seed


def test_custom_spec_carries_codexs_lark_grammar(tmp_path: Path) -> None:
    spec = PatchFamily(make_services(tmp_path)).tool.custom_spec()
    assert spec is not None
    assert spec["type"] == "custom" and spec["name"] == "apply_patch"
    assert spec["format"] == {"type": "grammar", "syntax": "lark", "definition": LARK_GRAMMAR}
    for rule in (
        'start: begin_patch hunk+ end_patch',
        'begin_patch: "*** Begin Patch" LF',
        'end_patch: "*** End Patch" LF?',
        'update_hunk: "*** Update File: " filename LF change_move? change?',
        'change_context: ("@@" | "@@ " /(.+)/) LF',
        'eof_line: "*** End of File" LF',
        "%import common.LF",
    ):
        assert rule in LARK_GRAMMAR


async def test_cwd_from_argument_and_from_the_call_context(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg" / "inner").mkdir(parents=True)
    services = make_services(tmp_path / "svc", {"apply_patch.enabled": True}, ws)
    tool = PatchFamily(services).tool
    result = await tool.call({"patch": "*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch", "cwd": "pkg"},
                             CallContext(services=services))
    assert not result.is_error and (ws / "pkg" / "a.txt").read_text() == "a\n"
    assert result.details["cwd"] == "pkg"
    # A transport cwd (x-ctp-cwd) is the base; the argument is relative to it; a heredoc `cd` too.
    result = await tool.call(
        {"patch": "cd inner && apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: b.txt\n+b\n*** End Patch\nEOF"},
        CallContext(services=services, cwd=ws / "pkg"),
    )
    assert not result.is_error, result.text
    assert (ws / "pkg" / "inner" / "b.txt").read_text() == "b\n"


async def test_rest_lists_both_formats_and_applies_with_header_cwd(tool_server, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "f.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo")
    srv = await tool_server({"apply_patch.enabled": True}, workspace=ws)
    functions = {t["name"]: t for t in await srv.list_rest()}
    customs = {t["name"]: t for t in await srv.list_rest("custom")}
    assert functions["apply_patch"]["type"] == "function"
    assert customs["apply_patch"]["type"] == "custom"
    assert customs["apply_patch"]["format"]["definition"] == LARK_GRAMMAR
    patch = "*** Begin Patch\n*** Update File: f.txt\n@@\n-two\n+2\n*** End Patch"
    res = await srv.rest("apply_patch", {"patch": patch}, cwd="sub")
    assert res.ok, res.body
    assert res.details["modified"] == ["f.txt"]
    assert (ws / "sub" / "f.txt").read_bytes() == b"\xef\xbb\xbfone\r\n2"  # BOM, CRLF, no final newline


async def test_rest_reports_refusals_as_tool_errors(tool_server, tmp_path: Path) -> None:
    srv = await tool_server({"apply_patch.enabled": True}, workspace=tmp_path / "ws")
    res = await srv.rest("apply_patch", {"patch": "*** Begin Patch\n*** Delete File: ../x\n*** End Patch"})
    assert res.status == 200 and not res.ok
    assert res.details["error"] == "outside_workspace"
    res = await srv.rest("apply_patch", {"patch": "x", "bogus": 1})
    assert res.status == 400 and "bogus" in res.body["error"]["message"]


async def test_mcp_lists_and_applies_with_structured_details(tool_server, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "m.txt").write_text("keep\nold\n")
    srv = await tool_server({"apply_patch.enabled": True}, workspace=ws)
    listed = {t.name: t for t in await srv.mcp_list()}
    assert listed["apply_patch"].input_schema["required"] == ["patch"]
    patch = "*** Begin Patch\n*** Update File: m.txt\n*** Move to: n.txt\n@@\n keep\n-old\n+new\n*** End Patch"
    res = await srv.mcp("apply_patch", {"patch": patch}, cwd="pkg")
    assert not res.is_error, res.text
    assert res.text == "Success. Updated the following files:\nM n.txt (moved from m.txt)"
    assert res.structured is not None
    assert res.structured["moved"] == [{"from": "m.txt", "to": "n.txt"}]
    assert res.structured["operations"] == [{"op": "move", "path": "m.txt", "to": "n.txt", "status": "committed"}]
    assert (ws / "pkg" / "n.txt").read_text() == "keep\nnew\n" and not (ws / "pkg" / "m.txt").exists()
    refused = await srv.mcp("apply_patch", {"patch": patch}, cwd="pkg")
    assert refused.is_error and "does not exist" in refused.text
    assert refused.structured is not None and refused.structured["error"] == "not_found"
