"""`ctproxy up`'s rough edges for a new user (issue 10): one `up` per state directory, one-line errors,
real ports for port 0, and a status that describes the running processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.support.cli import ctproxy as cli
from tests.support.procs import processes_mentioning

REPO = Path(__file__).resolve().parents[3]




class Up:
    """`ctproxy up` in the background; `wait()` returns once it is ready or has exited (generous bound)."""

    def __init__(self, *args: str, log: Path):
        self.log_path = log
        self._fh = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "proxy.app.cli", "up", *args], cwd=REPO,
                                     stdout=self._fh, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, bound: float = 90) -> str:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return "exited"
            if "ctproxy ready" in self.output():
                return "ready"
            time.sleep(0.05)
        raise AssertionError(f"ctproxy up neither became ready nor exited:\n{self.output()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()


async def test_a_second_up_on_the_same_state_dir_is_refused(proxy_factory, tmp_path):
    first = await proxy_factory()
    second = Up("--state-dir", str(first.state_dir), "--listen", "127.0.0.1:0",
                "--tools-listen", "127.0.0.1:0", log=tmp_path / "second.log")
    try:
        outcome = await asyncio.to_thread(second.wait)
    finally:
        second.stop()
    assert outcome == "exited", f"a second ctproxy up started on the same state dir:\n{second.output()}"
    assert second.proc.returncode == 2
    lines = [line for line in second.output().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "already running" in lines[0] and f"pid {first.proc.pid}" in lines[0] and "--state-dir" in lines[0]
    # The first one is untouched: status still finds it, and it still serves.
    info = json.loads(cli("status", "--json", "--state-dir", str(first.state_dir)).stdout)
    assert info["proxy"]["pid"] == first.proc.pid
    async with aiohttp.ClientSession() as http, http.get(first.tools_url + "/healthz") as resp:
        assert resp.status == 401  # answering (and asking for its token)


async def test_up_starts_again_once_the_first_one_is_gone_even_killed(proxy_factory, tmp_path):
    first = await proxy_factory()
    await first.astop(signal.SIGKILL)  # no clean-up ran: the OS released the lock
    again = await proxy_factory(state_dir=first.state_dir)
    info = json.loads(cli("status", "--json", "--state-dir", str(again.state_dir)).stdout)
    assert info["proxy"]["pid"] == again.proc.pid


def _listening(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock



async def test_a_busy_tool_server_port_is_one_line_and_leaves_nothing_behind(tmp_path):
    state = tmp_path / "state"
    busy = _listening(0)
    port = busy.getsockname()[1]
    try:
        out = await asyncio.to_thread(cli, "up", "--state-dir", str(state), "--listen", "127.0.0.1:0",
                                      "--tools-listen", f"127.0.0.1:{port}")
    finally:
        busy.close()
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "already in use" in lines[0] and "--tools-listen" in lines[0]
    assert "Traceback" not in out.stdout + out.stderr
    assert not processes_mentioning(str(state.resolve()))
    assert "not running" in cli("status", "--state-dir", str(state)).stdout


async def test_port_zero_prints_and_records_the_real_ports(emulator, tmp_path):
    import openai

    state = tmp_path / "state"
    up = Up("--state-dir", str(state), "--listen", "127.0.0.1:0", "--tools-listen", "127.0.0.1:0",
            "--upstream", emulator.url, "--trust-upstream", log=tmp_path / "up.log")
    try:
        assert await asyncio.to_thread(up.wait) == "ready", up.output()
        banner = up.output()
        run = json.loads((state / "run.json").read_text())
        proxy_url, tools_url = run["proxy"], run["tools"]
        for url in (proxy_url, tools_url):
            host, _, port = url.removeprefix("http://").rpartition(":")
            assert host == "127.0.0.1" and int(port) > 0, url
        assert proxy_url != tools_url
        assert f"proxy        {proxy_url}" in banner and f"tool server  {tools_url}" in banner
        assert f"OPENAI_BASE_URL={proxy_url}/v1" in banner
        assert ":0 " not in banner and not banner.rstrip().endswith(":0")
        status = json.loads(cli("status", "--json", "--state-dir", str(state)).stdout)
        assert status["proxy"]["proxy"] == proxy_url and status["proxy"]["tools"] == tools_url

        # Both answer on the ports that were printed.
        client = openai.AsyncOpenAI(base_url=proxy_url + "/v1", api_key="sk-test", max_retries=0, timeout=60)
        answer = await client.responses.create(model="gpt-5", input="hello port zero")
        await client.close()
        assert answer.output_text
        token = (state / "token").read_text().strip()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http, http.get(
                tools_url + "/healthz", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200 and (await resp.json())["ok"] is True
    finally:
        up.stop()
