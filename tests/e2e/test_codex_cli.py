"""Codex CLI (npm @openai/codex, installed by scripts/bootstrap.sh) completes a turn through `ctproxy up`.

Codex runs offline against the emulator: a custom `model_providers` entry points at the proxy's /v1
(see /work/shared/compat/codex-cli/README.md). What Codex 0.169.0 needs to finish a turn, found by
running it: one `POST /v1/responses` answered with a valid SSE stream; it asks for nothing else (no
/v1/models for a custom provider), and it never compresses the body for a custom provider (zstd only
goes with ChatGPT auth on the built-in OpenAI provider). An unreachable provider makes it wait for the
network forever, hence the hard timeout. The zstd case is covered with Codex's captured request.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import zstandard

from tests.emulator import Emulator, Text
from tests.support.codex import codex_env, isolated_dirs, run_codex
from tests.support.proxyproc import ProxyProcess

REPO = Path(__file__).resolve().parents[2]
# A copy of shared/compat/codex-cli/request-exec-first-turn.json (Codex CLI 0.169.0's first request), kept
# in the repo so that a clone without shared/ runs these tests too.
CAPTURED = Path(__file__).resolve().parents[1] / "flows" / "codex-request-exec-first-turn.json"
ANSWER = "Hello from the emulator, relayed by ctproxy."
TIMEOUT = 120.0
# Codex's own tools in its first request (0.169.0, custom provider, unknown model → fallback metadata).
CODEX_TOOLS = {"exec_command", "write_stdin"}


def config_toml(base_url: str, task: str) -> str:
    """A custom provider pointing at the proxy; everything that could phone home switched off.

    The x-ctp-* headers are how a user tags Codex's traffic with a task: the proxy must consume them."""
    return f"""\
model = "gpt-5"
model_provider = "ctproxy"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[model_providers.ctproxy]
name = "ctproxy"
base_url = "{base_url}"
wire_api = "responses"
env_key = "CTPROXY_TEST_KEY"
request_max_retries = 0
stream_max_retries = 0
http_headers = {{ "x-ctp-task" = "{task}", "x-ctp-agent" = "/root" }}
"""


def ctproxy_cli(state_dir: Path, *args: str) -> str:
    """Run a `ctproxy` subcommand on the proxy's state directory; returns its stdout."""
    command, *rest = args
    done = subprocess.run([sys.executable, "-m", "proxy.app.cli", command, "--state-dir", str(state_dir), *rest],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def codex_exec(tmp: Path, base_url: str, task: str, prompt: str) -> tuple[int, str, str, str]:
    """`codex exec` in a fresh CODEX_HOME and HOME; returns (exit code, stdout, stderr, last message)."""
    home, codex_home, workdir = isolated_dirs(tmp)
    (codex_home / "config.toml").write_text(config_toml(base_url, task))
    last = tmp / "last-message.txt"
    # A clean environment: no stray OPENAI_* / CODEX_* from the developer's shell.
    env = codex_env(home, codex_home, CTPROXY_TEST_KEY="sk-codex-test-not-real")
    code, out, err = await run_codex(["exec", "--skip-git-repo-check", "--output-last-message", str(last), prompt],
                                     workdir, env, TIMEOUT)
    message = last.read_text() if last.exists() else ""
    return code, out.decode(errors="replace"), err.decode(errors="replace"), message


def _headers(rec: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in rec.headers}


def _user_texts(body: dict[str, Any]) -> list[str]:
    return [part.get("text", "") for item in body.get("input") or [] if item.get("role") == "user"
            for part in (item.get("content") if isinstance(item.get("content"), list) else [])]


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [t.get("name") or t.get("type") for t in body.get("tools") or []]


async def test_codex_exec_completes_a_turn_through_the_proxy(emulator: Emulator, proxy: ProxyProcess,
                                                             tmp_path: Path) -> None:
    emulator.set_default(Text(ANSWER, deltas=6))  # any retry gets the same answer
    task = ctproxy_cli(proxy.state_dir, "task", "new").strip()  # how a user tags a job's agents
    code, out, err, last = await codex_exec(tmp_path, proxy.url + "/v1", task, "say hi")
    assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-2000:]}"
    assert ANSWER in out
    assert last.strip() == ANSWER

    turns = [r for r in emulator.requests if r.path == "/v1/responses"]
    assert len(turns) == 1, [(r.method, r.path) for r in emulator.requests]
    others = [r for r in emulator.requests if r.path != "/v1/responses"]
    assert all(r.status == 404 for r in others)  # nothing else matters to the turn
    rec = turns[0]
    headers = _headers(rec)
    body = rec.json
    assert isinstance(body, dict), "the proxy must deliver a JSON body the upstream can parse"

    # It is Codex's request, intact: its identity, its stream shape, its tools.
    assert headers["originator"] == "codex_exec"
    assert headers["authorization"] == "Bearer sk-codex-test-not-real"  # trusted upstream: forwarded
    assert body["stream"] is True and body["store"] is False
    assert body["prompt_cache_key"] == headers["session-id"] == headers["thread-id"]
    assert "reasoning.encrypted_content" in body["include"]
    assert isinstance(body.get("client_metadata"), dict)
    names = _tool_names(body)
    assert set(names) >= CODEX_TOOLS, names
    # Codex brings its own web_search: the proxy must not add a second one.
    assert names.count("web_search") == 1, names
    assert sum(1 for t in body["tools"] if t.get("type") in ("web_search", "web_search_preview")) == 1
    # Every Codex message reached the upstream, the prompt last.
    assert _user_texts(body)[-1:] == ["say hi"]

    # The proxy consumed its own headers; none went upstream.
    assert not [k for k in headers if k.startswith("x-ctp-")], sorted(headers)
    # Codex's own headers did go through.
    assert {"x-codex-turn-metadata", "x-codex-window-id", "session-id"} <= set(headers)
    if "content-encoding" in headers:  # not expected for a custom provider; if it appears, it must decode
        assert headers["content-encoding"] == "zstd"
    # The proxy journaled the turn under the user's task: Codex's input items and the answer.
    report = ""
    for _ in range(100):  # the journal writes in the background
        report = ctproxy_cli(proxy.state_dir, "tasks")
        if sum(int(n) for n in re.findall(r"(\d+) journaled", report)) >= len(body["input"]) + 1:
            break
        await asyncio.sleep(0.1)
    assert f"task {task}" in report and "/root" in report, report
    assert sum(int(n) for n in re.findall(r"(\d+) journaled", report)) == len(body["input"]) + 1, report


def _captured() -> tuple[dict[str, str], dict[str, Any]]:
    data = json.loads(CAPTURED.read_text())
    skip = {"host", "content-length"}
    return {k: v for k, v in data["headers"].items() if k.lower() not in skip}, data["body"]


async def test_zstd_codex_request_is_decoded_transformed_and_reencoded(emulator: Emulator, proxy: ProxyProcess) -> None:
    """Codex compresses with zstd when it talks to the official provider with ChatGPT auth. The proxy must
    read such a body (session, transforms) and hand the upstream zstd it can decode, tools not duplicated."""
    headers, body = _captured()
    headers |= {"Content-Encoding": "zstd", "Authorization": "Bearer sk-codex-test-not-real",
                "x-ctp-agent": "/root"}
    raw = zstandard.ZstdCompressor().compress(orjson.dumps(body))
    emulator.script(Text(ANSWER, deltas=3))
    async with aiohttp.ClientSession() as http, http.post(proxy.url + "/v1/responses", data=raw,
                                                          headers=headers) as resp:
        stream = await resp.read()
        assert resp.status == 200, stream[:500]
    assert b"response.completed" in stream
    rec = emulator.responses_requests[-1]
    got = _headers(rec)
    assert got.get("content-encoding") == "zstd"
    assert rec.json is not None, "the upstream could not decode what the proxy sent"
    assert zstandard.ZstdDecompressor().decompressobj().decompress(rec.raw_body) == rec.body
    sent_names = _tool_names(body)
    got_names = _tool_names(rec.json)
    assert got_names.count("web_search") == sent_names.count("web_search") == 1
    assert [n for n in got_names if n in sent_names] == sent_names  # Codex's tools, in Codex's order
    assert _user_texts(rec.json) == _user_texts(body)  # the conversation arrived whole
    assert rec.json["prompt_cache_key"] == body["prompt_cache_key"]
    assert not [k for k in got if k.startswith("x-ctp-")]
