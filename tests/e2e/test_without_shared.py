"""A user's clone has no shared/ beside it: the tests that once read it must pass (or skip) without it
(issue 10.17). Runs them in a child pytest with CTPROXY_SHARED_DIR pointing at an empty directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ONCE_NEEDED_SHARED = [
    "tests/e2e/test_codex_cli.py::test_zstd_codex_request_is_decoded_transformed_and_reencoded",
    "tests/proxy/windows/test_compaction_remote.py::test_codex_v2_against_emulator",
    "tests/proxy/windows/test_compaction_transforms.py",
    "tests/e2e/test_compaction_e2e.py::test_codex_session_compacts_once_then_replays_then_falls_back_on_model_switch",
    "tests/doubles/test_emulator.py",
]


def test_the_suite_does_not_need_shared(tmp_path: Path) -> None:
    env = {**os.environ, "CTPROXY_SHARED_DIR": str(tmp_path / "no-shared"), "CTPROXY_OPENAPI_SPEC": ""}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *ONCE_NEEDED_SHARED],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    tail = "\n".join(out.stdout.splitlines()[-25:])
    assert out.returncode == 0, tail
    assert " passed" in tail
