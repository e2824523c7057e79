"""Issue 29: the context-window contracts users feel (seed 000; audits seed000-defects 3–7, 16 and
seed004-pipeline-defects 1). Each test failed before the change it covers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from proxy.config import load_config
from proxy.usage import model_window

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ}, timeout=120)


# ---- model windows from the config ---------------------------------------------------------------------

def test_config_set_model_windows_keeps_the_specific_entries(tmp_path):
    """`ctproxy config set model_windows …` saves keys sorted ("*" first); a specific entry still wins."""
    state = tmp_path / "state"
    table = {"gpt-test-big": 400_000, "gpt-test*": 50_000, "*": 8_000}
    out = cli("config", "set", "model_windows", json.dumps(table), "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    saved = json.loads((state / "config.json").read_text())["model_windows"]
    assert next(iter(saved)) == "*"  # what the file holds: sorted
    cfg = load_config(state / "config.json")
    assert model_window("gpt-test-big", cfg.model_windows) == 400_000  # the exact name
    assert model_window("gpt-test-1", cfg.model_windows) == 50_000  # the longer glob
    assert model_window("other", cfg.model_windows) == 8_000  # "*" only when nothing else matches


def test_defaults_resolve_whatever_their_order():
    from proxy.config import DEFAULT_MODEL_WINDOWS

    backwards = dict(reversed(list(DEFAULT_MODEL_WINDOWS.items())))
    for model in ("gpt-5", "gpt-5-codex-mini", "gpt-4.1-mini", "o3", "gpt-4o", "unknown-model"):
        assert model_window(model, backwards) == model_window(model, DEFAULT_MODEL_WINDOWS)
    assert model_window("gpt-4.1-mini", backwards) == 1_047_576
