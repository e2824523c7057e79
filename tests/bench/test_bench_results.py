"""bench.common.write_result: the latest run in `<name>.json`, every run kept in `<name>.history.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.common as common


def test_a_second_run_replaces_the_latest_and_keeps_the_first_in_the_history(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    common.write_result("proxy", {"run": 1})
    path = common.write_result("proxy", {"run": 2})
    assert json.loads(path.read_text()) == {"run": 2}
    lines = [json.loads(line) for line in (tmp_path / "proxy.history.jsonl").read_text().splitlines()]
    assert [line["result"] for line in lines] == [{"run": 1}, {"run": 2}]
    assert all(line["at"].endswith("Z") and "commit" in line for line in lines)
    assert not list(tmp_path.glob("*.tmp"))  # written whole, then renamed
