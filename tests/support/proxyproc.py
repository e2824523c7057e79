"""`ctproxy up` as a real process for end-to-end tests: it binds port 0 for both servers and the test reads the
ports back from its run file (never a port picked beforehand, which another process may take), waits for ready,
stops with SIGTERM."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_COUNT = itertools.count()


class ProxyProcess:
    def __init__(self, state_dir: Path, *, upstream: str | None = None, trust_upstream: bool = True,
                 mode: str = "reverse", extra_args: list[str] | None = None, with_tools: bool = True,
                 env: dict[str, str] | None = None, log_path: Path | None = None):
        self.state_dir = state_dir
        self.port = 0  # read back from the run file once ready
        self.tools_port = 0
        self.upstream = upstream
        self.trust_upstream = trust_upstream
        self.mode = mode
        self.extra_args = extra_args or []
        self.with_tools = with_tools
        self.env = env or {}
        self.log_path = log_path or state_dir.parent / f"ctproxy-{os.getpid()}-{next(_COUNT)}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tools_url(self) -> str:
        return f"http://127.0.0.1:{self.tools_port}"

    def args(self) -> list[str]:
        args = [sys.executable, "-m", "proxy.app.cli", "up", "--state-dir", str(self.state_dir),
                "--listen", "127.0.0.1:0", "--tools-listen", "127.0.0.1:0",
                "--mode", self.mode]
        if self.upstream:
            args += ["--upstream", self.upstream]
            if self.trust_upstream:
                args.append("--trust-upstream")
        if not self.with_tools:
            args.append("--no-tools")
        from tests.support.sandbox import extra_up_args

        return args + extra_up_args(self.extra_args)

    def start(self) -> ProxyProcess:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ctproxy up exited early:\n{self.log()}")
            if b"ctproxy ready" in self.log_path.read_bytes():
                self._read_ports()
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"ctproxy up did not become ready:\n{self.log()}")

    def _read_ports(self) -> None:
        """The ports this process bound, as its run file records them (written before it says ready)."""
        run = json.loads((self.state_dir / "run.json").read_text())
        if run.get("pid") != self.proc.pid:
            raise RuntimeError(f"run.json belongs to pid {run.get('pid')}, not to this ctproxy ({self.proc.pid})")
        self.port = int(run["proxy"].rsplit(":", 1)[1])
        if run.get("tools"):
            self.tools_port = int(run["tools"].rsplit(":", 1)[1])

    async def astart(self) -> ProxyProcess:
        return await asyncio.to_thread(self.start)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    async def astop(self, sig: int = signal.SIGTERM) -> int | None:
        return await asyncio.to_thread(self.stop, sig)
