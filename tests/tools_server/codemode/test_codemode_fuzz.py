"""Hostile arguments to exec / wait / find_tools: always a tool result or a clear argument error (never an
exception out of the registry, never a Python traceback in what the model reads)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.toolserver import make_services
from tools_server.families import build_registry
from tools_server.registry import ToolError
from tools_server.service import ToolService

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**60, 2**60) | st.floats(allow_nan=False)
                    | st.text(max_size=40),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                              max_size=4), max_leaves=12)
CODE = st.sampled_from(["", "return 1", "throw 1", "while(true){}", "await tools.exec_command({})", "}{", "\u2028",
                        '// @exec: {"yield_time_ms": 250}\nwhile (true) {}', "return tools", "print(globalThis)",
                        "await tools.notes_read_file({path: '../../etc/passwd'})", "return {toJSON() { throw 1 }}"])
ARGS = {
    "exec": st.fixed_dictionaries({"code": CODE}, optional={"uses": JSON, "yield_time_ms": JSON,
                                                            "max_output_tokens": JSON, "input": JSON, "x": JSON}),
    "wait": st.fixed_dictionaries({"cell_id": JSON}, optional={"terminate": JSON, "yield_time_ms": JSON}),
    "find_tools": st.fixed_dictionaries({}, optional={"query": JSON, "load": JSON, "extra": JSON}),
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Any:
    services = make_services(Path(tmp_path_factory.mktemp("cmfuzz")),
                             {"code_mode.enabled": True, "tool_discovery.enabled": True, "shell.enabled": True,
                              "apply_patch.enabled": True})
    loop = asyncio.new_event_loop()
    svc = ToolService(services, build_registry(services))
    yield svc, loop
    loop.run_until_complete(svc.registry.close())
    loop.close()


@pytest.mark.parametrize("tool", sorted(ARGS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_arguments(service: Any, tool: str, data: st.DataObject) -> None:
    svc, loop = service
    args = data.draw(ARGS[tool])

    async def call() -> None:
        try:
            result = await svc.call(tool, args, svc.context(transport="direct", task="t", agent="/root"))
        except ToolError as exc:
            assert "Traceback" not in exc.message
            return
        assert "Traceback" not in result.text and "File \"" not in result.text
        if tool == "exec" and result.details.get("status") == "running":
            await svc.call("wait", {"cell_id": result.details["cell_id"], "terminate": True},
                           svc.context(transport="direct", task="t", agent="/root"))

    loop.run_until_complete(asyncio.wait_for(call(), 60))
