"""The state directory: created on first use with private permissions; holds the token."""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from filelock import FileLock, Timeout

from proxy.errors import CtproxyError
from proxy.files import atomic_write_text

UP_LOCK = "up.lock"
StoreKind = Literal["embedded", "postgresql"]  # which store holds the state (proxy/store/)


class StateDirBusy(CtproxyError, RuntimeError):
    """Another `ctproxy up` holds the state directory."""


def default_state_dir() -> Path:
    if env := os.environ.get("CTPROXY_HOME"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ctproxy"


@dataclass(frozen=True)
class StateDir:
    root: Path

    @classmethod
    def open(cls, root: Path | None = None) -> StateDir:
        path = (root or default_state_dir()).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
        return cls(path)

    @functools.cached_property
    def db_path(self) -> Path:  # cached: looked up on every request, and a Path costs microseconds to build
        return self.root / "ctproxy.db"

    @property
    def token_path(self) -> Path:
        return self.root / "token"

    @property
    def confdir(self) -> Path:
        """mitmproxy's confdir (CA material for regular mode)."""
        path = self.root / "mitmproxy"
        path.mkdir(exist_ok=True, mode=0o700)
        return path

    def subdir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def token(self) -> str:
        """The tool server's bearer token, created (mode 0600) on first use."""
        with FileLock(str(self.root / ".token.lock"), timeout=10):
            if self.token_path.exists():
                value = self.token_path.read_text(encoding="utf-8").strip()
                if value:
                    return value
            value = "ctp_" + secrets.token_urlsafe(32)
            atomic_write_text(self.token_path, value + "\n", mode=0o600)
            return value

    def lock_for_up(self) -> FileLock | None:
        """Held by `ctproxy up` for its lifetime: one `up` per state directory, since `run.json` (what
        `ctproxy status` reads) and the default ports describe one running proxy. An OS lock (flock),
        released by the kernel when the process dies, so a killed ctproxy never leaves a stale lock.
        Other processes (a `mitmdump -s addons/…`, a standalone tool server) may still share the store.
        Raises StateDirBusy; returns None where the filesystem has no such locks (then nothing is checked)."""
        lock = FileLock(str(self.root / UP_LOCK), timeout=0, mode=0o600, fallback_to_soft=False)
        try:
            lock.acquire()
        except Timeout as exc:
            raise StateDirBusy(str(self.root)) from exc
        except (OSError, NotImplementedError):
            return None
        return lock
