"""Every addon module loads alone under `mitmdump -s addons/<name>.py` (issue 2 acceptance).

For each module in addons/ that defines `addons = [...]` (found by reading the source, so new ones are
picked up): a live run in reverse mode against the emulator with the `openai` SDK (one JSON and one
streamed request), and an offline replay of a recorded flow file (`mitmdump -n -r`). Specific checks
for what a module promises alone: session strips `x-ctp-*`, guard strips credentials unless the
upstream is trusted, history refuses an unknown task and journals a turn, web_search adds one tool.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from mitmproxy import io

from tests.emulator import Emulator, ReceivedRequest
from tests.support.ports import listening_port

REPO = Path(__file__).resolve().parents[2]
ADDONS_DIR = REPO / "addons"
FLOWS_DIR = REPO / "tests" / "flows"
MITMDUMP = Path(sys.executable).parent / "mitmdump"
KEY = "sk-standalone-test-not-real"
CORE = {"routing", "session", "tap", "guard", "body"}  # modules that exist since issue 2


def standalone_modules(directory: Path = ADDONS_DIR) -> list[str]:
    """Modules with a top-level `addons = …` assignment: what `mitmdump -s` loads."""
    names = []
    for path in sorted(directory.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == "addons" for t in targets):
                names.append(path.stem)
                break
    return names


MODULES = standalone_modules()


@dataclass
class Mitmdump:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def _options(state: Path, options: dict[str, str]) -> list[str]:
    args = ["--set", f"ctp_state_dir={state}", "--set", f"confdir={state / 'mitmproxy'}"]
    for key, value in options.items():
        args += ["--set", f"{key}={value}"]
    return args


@pytest.fixture
def mitmdump(tmp_path: Path) -> Iterator[Callable[..., Mitmdump]]:
    """Factory: `mitmdump("session", emu.url, ctp_trust_upstream="true")` → a reverse proxy with that
    one module loaded, listening on a free port; stopped after the test."""
    started: list[Mitmdump] = []

    def start(module: str, upstream: str, **options: str) -> Mitmdump:
        state = tmp_path / f"state-{module}-{len(started)}"
        log_path = tmp_path / f"mitmdump-{module}-{len(started)}.log"
        cmd = [str(MITMDUMP), "-q", "-s", f"addons/{module}.py", "--mode", f"reverse:{upstream}@0",
               "--set", "listen_host=127.0.0.1", *_options(state, options)]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        md = Mitmdump(proc, 0, log_path)
        started.append(md)
        try:
            md.port = listening_port(proc, what=f"mitmdump -s addons/{module}.py")
        except RuntimeError as e:
            pytest.fail(f"{e}:\n{md.log()[-3000:]}")
        return md

    yield start
    for md in started:
        md.stop()


@pytest.fixture
async def sdk() -> AsyncIterator[Callable[..., openai.AsyncOpenAI]]:
    clients: list[openai.AsyncOpenAI] = []

    def make(base: str, headers: dict[str, str] | None = None) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=30,
                                    default_headers=headers or {})
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def _headers(rec: ReceivedRequest) -> dict[str, str]:
    return {k.lower(): v for k, v in rec.headers}


def our_errors(log: str) -> list[str]:
    """Lines of a mitmdump log that report an error in our code (addon hooks, script loading).

    mitmproxy's own shutdown noise (a CancelledError for a client connection still open at SIGTERM)
    is not ours and not counted."""
    ours = (f'File "{ADDONS_DIR}/', f'File "{REPO / "proxy"}/')
    return [line for line in log.splitlines()
            if "Addon error" in line or "error in script" in line or line.strip().startswith(ours)]


def _clean_log(md: Mitmdump) -> None:
    code = md.stop()
    log = md.log()
    assert not our_errors(log), log[-3000:]
    assert code == 0, f"mitmdump exited with {code}:\n{log[-3000:]}"


async def _turns(client: openai.AsyncOpenAI, text: str) -> None:
    """One JSON and one streamed Responses request; both must answer with the emulator's echo."""
    resp = await client.responses.create(model="gpt-5", input=text)
    assert resp.output_text == f"You said: {text}"
    events = [ev async for ev in await client.responses.create(model="gpt-5", input=text + " streamed", stream=True)]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")
    assert deltas == f"You said: {text} streamed"


def test_discovery_finds_the_chain_modules() -> None:
    assert set(MODULES) >= CORE, MODULES
    assert "_flow" not in MODULES and "__init__" not in MODULES


@pytest.mark.parametrize("module", MODULES)
async def test_module_alone_answers_through_mitmdump(module: str, emulator: Emulator, mitmdump, sdk) -> None:
    md = mitmdump(module, emulator.url, ctp_trust_upstream="true", ctp_upstream=emulator.url)
    await _turns(sdk(md.url), f"hello from {module}")
    got = emulator.responses_requests
    assert len(got) == 2
    assert isinstance(got[0].json, dict) and got[0].json["input"] == f"hello from {module}"
    assert got[1].json["stream"] is True
    _clean_log(md)


async def test_session_alone_strips_ctp_headers(emulator: Emulator, mitmdump, sdk) -> None:
    md = mitmdump("session", emulator.url, ctp_trust_upstream="true")
    client = sdk(md.url, {"x-ctp-task": "task-standalone", "x-ctp-agent": "/root/worker", "x-custom": "kept"})
    await _turns(client, "tagged")
    for rec in emulator.responses_requests:
        headers = _headers(rec)
        assert not [k for k in headers if k.startswith("x-ctp-")], sorted(headers)
        assert headers["x-custom"] == "kept"
        assert headers["authorization"] == f"Bearer {KEY}"  # session does not touch credentials
    _clean_log(md)


async def test_guard_alone_strips_credentials_without_trust(emulator: Emulator, mitmdump, sdk) -> None:
    md = mitmdump("guard", emulator.url)  # ctp_trust_upstream defaults to false
    client = sdk(md.url, {"OpenAI-Organization": "org-x", "OpenAI-Project": "proj-x", "x-custom": "kept"})
    await _turns(client, "guarded")
    for rec in emulator.responses_requests:
        headers = _headers(rec)
        for name in ("authorization", "openai-organization", "openai-project"):
            assert name not in headers, (name, sorted(headers))
        assert headers["x-custom"] == "kept"
    _clean_log(md)


async def test_guard_alone_forwards_credentials_to_a_trusted_upstream(emulator: Emulator, mitmdump, sdk) -> None:
    """`--set ctp_trust_upstream=true` is the standalone spelling of `ctproxy up --trust-upstream`."""
    md = mitmdump("guard", emulator.url, ctp_trust_upstream="true", ctp_upstream=emulator.url)
    await _turns(sdk(md.url, {"OpenAI-Organization": "org-x"}), "trusted")
    for rec in emulator.responses_requests:
        headers = _headers(rec)
        assert headers.get("authorization") == f"Bearer {KEY}", sorted(headers)
        assert headers.get("openai-organization") == "org-x"
    _clean_log(md)


async def test_history_alone_refuses_an_unknown_task_and_journals_a_turn(emulator: Emulator, mitmdump, sdk,
                                                                         tmp_path: Path) -> None:
    md = mitmdump("history", emulator.url, ctp_trust_upstream="true")
    with pytest.raises(openai.BadRequestError) as err:
        await sdk(md.url, {"x-ctp-task": "no-such-task"}).responses.create(model="gpt-5", input="x")
    assert "ctproxy task new" in str(err.value)
    assert emulator.responses_requests == []  # refused here, never forwarded
    await _turns(sdk(md.url), "remember me")
    _clean_log(md)  # stopping flushes the journal
    state = next(tmp_path.glob("state-history-*"))
    report = subprocess.run([sys.executable, "-m", "proxy.app.cli", "tasks", "--state-dir", str(state)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    # Each of the two turns journaled its input item and the model's output item.
    journaled = [int(n) for n in re.findall(r"(\d+) journaled", report.stdout)]
    assert sum(journaled) == 4, report.stdout


async def test_web_search_alone_adds_exactly_one_tool(emulator: Emulator, mitmdump, sdk) -> None:
    md = mitmdump("web_search", emulator.url, ctp_trust_upstream="true", ctp_upstream=emulator.url)
    client = sdk(md.url)
    await client.responses.create(model="gpt-5", input="search please")
    await client.responses.create(model="gpt-5", input="already has one", tools=[{"type": "web_search"}])
    for rec in emulator.responses_requests:
        types = [t.get("type") for t in rec.json.get("tools") or []]
        assert types.count("web_search") == 1, types
    _clean_log(md)


# ---- offline replay -----------------------------------------------------------------------------


FLOW_FILES = sorted(FLOWS_DIR.glob("*.mitm"))


def test_there_is_a_recorded_flow_file() -> None:
    assert FLOW_FILES, "tests/flows/*.mitm is missing: record one with `ctproxy up --record tests/flows/basic.mitm`"


def _read_flows(path: Path) -> list[Any]:
    with path.open("rb") as fh:
        return list(io.FlowReader(fh).stream())


@pytest.mark.parametrize("source", FLOW_FILES, ids=[f.name for f in FLOW_FILES])
@pytest.mark.parametrize("module", MODULES)
def test_module_alone_replays_a_recorded_flow_file(module: str, source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.mitm"
    state = tmp_path / "state"
    cmd = [str(MITMDUMP), "-n", "-q", "-r", str(source), "-s", f"addons/{module}.py", "-w", str(out),
           *_options(state, {})]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert not our_errors(log), log[-3000:]
    before, after = _read_flows(source), _read_flows(out)
    assert len(after) == len(before) > 0
    for old, new in zip(before, after, strict=True):
        assert new.request.path == old.request.path
        assert new.response is not None and new.response.status_code == old.response.status_code
