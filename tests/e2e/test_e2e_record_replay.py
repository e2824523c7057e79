"""Recording flows, replaying them through the chain, and answering from recordings (server replay)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
from mitmproxy import io

from tests.emulator import Text

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "tests" / "flows" / "basic.mitm"


def _flows(path: Path):
    with path.open("rb") as fh:
        return list(io.FlowReader(fh).stream())


async def _record(emulator, proxy_factory, path: Path) -> None:
    emulator.script(Text("recorded answer one", deltas=3), Text("recorded streamed answer", deltas=5))
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--record", str(path)])
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-rec", max_retries=0)
    await client.responses.create(model="gpt-5", input="first question")
    stream = await client.responses.create(model="gpt-5", input="second question", stream=True)
    async for _ in stream:
        pass
    await client.close()
    await proxy.astop()


async def test_record_then_replay_offline_and_server_replay(emulator, proxy_factory, tmp_path):
    path = tmp_path / "session.mitm"
    await _record(emulator, proxy_factory, path)
    flows = _flows(path)
    assert len(flows) == 2
    assert b"recorded answer one" in flows[0].response.content
    assert b"response.completed" in flows[1].response.content  # the streamed body was stored
    assert isinstance(flows[0].metadata.get("ctp.client_request"), bytes)
    assert all(f.request.headers.get("authorization") == "<redacted>" for f in flows)
    assert b"sk-rec" not in path.read_bytes()

    # ctproxy replay: per flow, what each addon changed.
    out = subprocess.run([sys.executable, "-m", "proxy.app.cli", "replay", str(path), "--upstream", emulator.url,
                          "--trust-upstream"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "=== flow 1: POST" in out.stdout and "=== flow 2: POST" in out.stdout

    # mitmdump offline replay of the same file through an addon.
    mitmdump = shutil.which("mitmdump", path=str(Path(sys.executable).parent))
    res = subprocess.run([mitmdump, "-n", "-q", "-r", str(path), "-s", str(REPO / "addons" / "session.py"),
                          "--set", f"ctp_state_dir={tmp_path / 'st'}"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr + res.stdout

    # Server replay: the upstream is gone; matched requests are answered from the file, misses get a 502.
    await emulator.close()
    replay = await proxy_factory(upstream="http://127.0.0.1:9", extra_args=["--server-replay", str(path)])
    client = openai.AsyncOpenAI(base_url=replay.url + "/v1", api_key="sk-rec", max_retries=0)
    again = await client.responses.create(model="gpt-5", input="first question")
    assert again.output_text == "recorded answer one"
    texts = []
    stream = await client.responses.create(model="gpt-5", input="second question", stream=True)
    async for ev in stream:
        if ev.type == "response.output_text.done":
            texts.append(ev.text)
    assert texts == ["recorded streamed answer"]
    async with aiohttp.ClientSession() as http, http.post(
        replay.url + "/v1/responses", json={"model": "gpt-5", "input": "never recorded"},
        timeout=aiohttp.ClientTimeout(total=20),
    ) as resp:
        assert resp.status == 502
        err = (await resp.json())["error"]
    assert err["code"] == "server_replay_miss" and "/v1/responses" in err["message"]
    await client.close()


def test_committed_flow_replays_through_the_chain():
    assert COMMITTED.exists(), "tests/flows/basic.mitm is missing (regenerate: python -m tests.flows.record)"
    out = subprocess.run([sys.executable, "-m", "proxy.app.cli", "replay", str(COMMITTED)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("=== flow") == len(_flows(COMMITTED)) >= 2
