"""`ctproxy pi-config` (issue 27): Pi's models.json provider for ctproxy, printed or merged like codex-config."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import ctproxy as cli

REPO = Path(__file__).resolve().parents[3]




def test_printed_entry_is_a_responses_provider_with_task_and_agent(tmp_path):
    out = cli("pi-config", "--state-dir", str(tmp_path / "s"), "--model", "gpt-5", "--model", "gpt-4.1",
              "--agent", "/root/reviewer", "--web-search", "off")
    assert out.returncode == 0, out.stderr
    assert "not running" in out.stderr  # says which addresses it used
    provider = json.loads(out.stdout)["providers"]["ctproxy"]
    assert provider["baseUrl"] == "http://127.0.0.1:8787/v1" and provider["api"] == "openai-responses"
    assert provider["apiKey"] == "OPENAI_API_KEY"  # the variable's name: Pi resolves it, no key in the file
    assert provider["headers"]["x-ctp-task"].startswith("task_")
    assert provider["headers"]["x-ctp-agent"] == "/root/reviewer"
    assert provider["headers"]["x-ctp-web-search"] == "off"
    assert [(m["id"], m["contextWindow"]) for m in provider["models"]] == [("gpt-5", 272_000), ("gpt-4.1", 1_047_576)]


def test_write_keeps_the_rest_of_the_file_and_replaces_its_own_entry(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"providers": {"ollama": {"baseUrl": "http://localhost:11434/v1", "models": []},
                                              "ctproxy": {"baseUrl": "http://old", "models": []}},
                                "other": [1, 2]}))
    out = cli("pi-config", "--state-dir", str(tmp_path / "s"), "--write", str(path), "--task", "task_fixed",
              "--proxy", "http://127.0.0.1:9999")
    assert out.returncode == 0, out.stderr
    data = json.loads(path.read_text())
    assert data["other"] == [1, 2] and data["providers"]["ollama"]["baseUrl"] == "http://localhost:11434/v1"
    assert data["providers"]["ctproxy"]["baseUrl"] == "http://127.0.0.1:9999/v1"
    assert data["providers"]["ctproxy"]["headers"]["x-ctp-task"] == "task_fixed"
    assert "pi --provider ctproxy" in out.stdout


def test_a_file_it_cannot_merge_safely_is_left_unchanged(tmp_path):
    path = tmp_path / "models.json"
    for content in ('{\n  // my providers\n  "providers": {}\n}\n', '{"providers": []}', "[1]"):
        path.write_text(content)
        out = cli("pi-config", "--state-dir", str(tmp_path / "s"), "--write", str(path))
        assert out.returncode == 1, out.stdout
        assert "left" in out.stderr and "unchanged" in out.stderr and "by hand" in out.stderr
        assert path.read_text() == content


def test_a_bad_agent_address_is_refused(tmp_path):
    out = cli("pi-config", "--state-dir", str(tmp_path / "s"), "--agent", "reviewer")
    assert out.returncode == 2 and "--agent must be an address" in out.stderr
