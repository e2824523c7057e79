"""Where the project's shared/ folder is: beside the clone (as CI lays it out), else /work/shared."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shared_dir() -> Path:
    if env := os.environ.get("CTPROXY_SHARED_DIR"):
        return Path(env)
    for candidate in (REPO.parent / "shared", Path("/work/shared")):
        if candidate.is_dir():
            return candidate
    return REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    return shared_dir().joinpath(*parts)
