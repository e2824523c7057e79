"""Stages keep the runtime on self (addons/_stage.Stage): taken in configure, renewed when a ctp_ option
changes or a runtime is installed, and no hook looks the runtime up globally."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from mitmproxy.test import taddons

import addons
from addons.tap import Tap
from addons.web_search import WebSearch
from proxy.app import runtime
from proxy.host import flowbody, httpstream

ADDONS = Path(addons.__file__).parent


def test_a_stage_takes_its_runtime_in_configure_and_again_when_a_ctp_option_changes(tmp_path: Path):
    first, second = tmp_path / "one", tmp_path / "two"
    stage = WebSearch()
    try:
        with taddons.context(stage, loadcore=False) as tctx:
            tctx.options.update(ctp_state_dir=str(first))
            assert stage.rt.state.root == first.resolve()
            bound = stage.rt
            tctx.options.update(ctp_state_dir=str(second))
            assert stage.rt.state.root == second.resolve()
            assert stage.rt is not bound
    finally:
        runtime.uninstall()


def test_installing_a_runtime_rebinds_every_stage(tmp_path: Path):
    tap, search = Tap(), WebSearch()
    try:
        with taddons.context(tap, search, loadcore=False) as tctx:
            tctx.options.update(ctp_state_dir=str(tmp_path / "options"))
            installed = runtime.build(state_dir=str(tmp_path / "installed"))
            runtime.install(installed)
            assert tap.rt is installed and search.rt is installed
    finally:
        runtime.uninstall()


def test_binding_pushes_the_body_limit_and_the_upstream_timers(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"limits": {"max_body_bytes": 123_456},
                                                      "timeouts": {"connect_seconds": 7, "stream_idle_seconds": 9}}))
    stage = Tap()
    try:
        with taddons.context(stage, loadcore=False) as tctx:
            tctx.options.update(ctp_state_dir=str(tmp_path))
            assert flowbody.max_body_bytes() == 123_456
            assert httpstream._settings() == (7, 9)
    finally:
        runtime.uninstall()
        flowbody.set_max_body_bytes(flowbody.DEFAULT_MAX_BODY_BYTES)
        httpstream.set_timeouts(httpstream.DEFAULT_CONNECT_SECONDS, httpstream.DEFAULT_IDLE_SECONDS)


def _calls_runtime_current(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "current"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "runtime"]


def test_no_stage_looks_the_runtime_up_on_a_hook():
    offenders = {}
    for path in sorted(ADDONS.glob("*.py")):
        if path.name == "_stage.py":  # the one place a stage binds
            continue
        lines = _calls_runtime_current(ast.parse(path.read_text()))
        if lines:
            offenders[path.name] = lines
    assert offenders == {}, f"use self.rt (addons/_stage.Stage) instead of runtime.current(): {offenders}"


def test_the_check_above_can_fail():
    assert _calls_runtime_current(ast.parse("from proxy import runtime\nrt = runtime.current()\n")) == [2]
