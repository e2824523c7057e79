"""`ctproxy replay` and `ctproxy up --server-replay` for a new user (issue 10, points 9, 12, 13): recordings
made against a local http:// upstream replay faithfully, and a file that is not a recording is one line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import openai
import pytest
from mitmproxy import io

from tests.e2e.test_e2e_record_replay import _record  # one recording, for both files
from tests.support.cli import ctproxy as cli
from tests.support.procs import processes_mentioning

REPO = Path(__file__).resolve().parents[3]




def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]




@pytest.fixture
def not_flows(tmp_path: Path) -> dict[str, Path]:
    files = {"text": tmp_path / "notes.txt", "random": tmp_path / "noise.mitm", "json": tmp_path / "flows.json"}
    files["text"].write_text("hello, this is not a recording\n")
    files["random"].write_bytes(bytes(range(256)) * 4)
    files["json"].write_text('{"flows": []}')
    return files


def test_replay_of_a_file_that_is_not_a_flow_file_is_one_line(not_flows, tmp_path):
    for path in not_flows.values():
        out = cli("replay", str(path))
        assert out.returncode == 2, (path, out.stdout, out.stderr)
        line = _one_line(out.stderr)
        assert str(path) in line and "not a mitmproxy flow file" in line and "--record" in line
        assert out.stdout == ""
    empty = tmp_path / "empty.mitm"
    empty.write_bytes(b"")
    out = cli("replay", str(empty))
    assert out.returncode == 1 and "no flows" in _one_line(out.stderr)
    missing = cli("replay", str(tmp_path / "missing.mitm"))
    assert missing.returncode == 2 and "does not exist" in _one_line(missing.stderr)



async def test_server_replay_of_a_file_that_is_not_a_flow_file_is_one_line(not_flows, tmp_path):
    state = tmp_path / "state"
    for path in [not_flows["text"], tmp_path / "missing.mitm"]:
        out = await asyncio.to_thread(cli, "up", "--state-dir", str(state), "--listen", "127.0.0.1:0",
                                      "--tools-listen", "127.0.0.1:0", "--server-replay", str(path))
        assert out.returncode == 2, out.stderr
        line = _one_line(out.stderr)
        assert "--server-replay" in line and str(path) in line
        assert "Traceback" not in out.stdout
        assert not processes_mentioning(str(state.resolve()))


async def test_server_replay_of_an_http_recording_needs_no_upstream(emulator, proxy_factory, tmp_path):
    """Recorded against a local http:// upstream, answered offline by a proxy with the default (https)
    upstream: mitmproxy's match key has the scheme, ctproxy must not."""
    path = tmp_path / "session.mitm"
    await _record(emulator, proxy_factory, path)
    await emulator.close()
    with path.open("rb") as fh:
        assert {f.request.scheme for f in io.FlowReader(fh).stream()} == {"http"}
    replay = await proxy_factory(extra_args=["--server-replay", str(path)])  # no --upstream
    client = openai.AsyncOpenAI(base_url=replay.url + "/v1", api_key="sk-rec", max_retries=0)
    again = await client.responses.create(model="gpt-5", input="first question")
    assert again.output_text == "recorded answer one"
    texts = []
    stream = await client.responses.create(model="gpt-5", input="second question", stream=True)
    async for ev in stream:
        if ev.type == "response.output_text.done":
            texts.append(ev.text)
    assert texts == ["recorded streamed answer"]
    await client.close()
    async with aiohttp.ClientSession() as http, http.post(
        replay.url + "/v1/responses", json={"model": "gpt-5", "input": "never recorded"},
        timeout=aiohttp.ClientTimeout(total=20),
    ) as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "server_replay_miss"


async def test_replay_without_upstream_uses_the_one_recorded(emulator, proxy_factory, tmp_path):
    path = tmp_path / "session.mitm"
    await _record(emulator, proxy_factory, path)
    with path.open("rb") as fh:
        flows = list(io.FlowReader(fh).stream())
    assert all(f.metadata.get("ctp.upstream") == emulator.url for f in flows)
    assert all(f.metadata.get("ctp.trust_upstream") is True for f in flows)

    out = await asyncio.to_thread(cli, "replay", str(path))
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0]
    assert header.startswith(f"replaying against {emulator.url} (trusted") and "recorded against" in header
    assert "api.openai.com" not in out.stdout  # the chain ran as it did when recording
    explicit = await asyncio.to_thread(cli, "replay", str(path), "--upstream", emulator.url, "--trust-upstream")
    body = [line for line in out.stdout.splitlines() if not line.startswith("replaying ")]
    assert body == [line for line in explicit.stdout.splitlines() if not line.startswith("replaying ")]

    # --upstream still wins, and the output says which one was used.
    official = await asyncio.to_thread(cli, "replay", str(path), "--upstream", "https://api.openai.com")
    assert official.returncode == 0, official.stderr
    assert "api.openai.com" in official.stdout and f"recorded against {emulator.url}" in official.stdout


def test_an_old_recording_without_the_upstream_is_labelled():
    committed = REPO / "tests" / "flows" / "basic.mitm"
    out = cli("replay", str(committed))
    assert out.returncode == 0, out.stderr
    with committed.open("rb") as fh:
        flows = list(io.FlowReader(fh).stream())
    if any("ctp.upstream" in f.metadata for f in flows):
        pytest.skip("the committed recording already names its upstream")
    header = out.stdout.splitlines()[0]
    origin = f"{flows[0].request.scheme}://{flows[0].request.host}:{flows[0].request.port}"
    assert header.startswith(f"replaying against {origin}") and "does not name its upstream" in header
    assert "--upstream" in header
    assert "api.openai.com" not in out.stdout
