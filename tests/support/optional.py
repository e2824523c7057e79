"""Optional test dependencies: a test that needs one skips with the reason the set-up recorded.

scripts/bootstrap.sh installs the real clients and the Debian packages the end-to-end tests drive where the
machine allows it; what it had to skip, and why, it writes to .venv/ctproxy-setup.json (keys: codex, pi, sandbox,
postgresql, openai-agents, litellm, desktop, chromium). A test whose dependency is missing skips with that reason,
or with what to run when the set-up never tried.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / ".venv" / "ctproxy-setup.json"


def setup_skipped(key: str, record: Path | None = None) -> str | None:
    """What scripts/bootstrap.sh said when it skipped `key`, or None when it did not skip it."""
    try:
        return json.loads((record or RECORD).read_text()).get("skipped", {}).get(key)
    except (OSError, ValueError):
        return None


def skip_reason(key: str, what: str, record: Path | None = None) -> str:
    said = setup_skipped(key, record)
    if said:
        return f"{what} is not installed: the set-up skipped {said}"
    return f"{what} is not installed; run scripts/bootstrap.sh (make test does) to install it"


def require_tool(key: str, path: Path, what: str) -> Path:
    """The executable at `path`, or the test skips with the set-up's reason."""
    if not os.access(path, os.X_OK):
        pytest.skip(skip_reason(key, what))
    return path


def require_module(key: str, module: str, what: str):
    """`import module`, or the test skips with the set-up's reason."""
    try:
        return __import__(module)
    except ImportError:
        pytest.skip(skip_reason(key, what))
