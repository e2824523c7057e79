"""A bridged turn whose later round overflows runs each of its calls exactly once (seed 004 pipeline defect 1,
tools defect N3; seed §5.3, §8, §11: no retry after dispatch).

The turn is recovered from the round that failed: the agent's history compacted, the executed calls and
their outputs carried whole into that round (`proxy/windows/recovery.py:midturn_recovery`). When that
cannot help either, the agent gets the error together with what ran, and nothing is sent again. Counted
where the effect lands: the workspace's file (shell, apply_patch), the emulator's Images API (image), the
note (notes). Through `ctproxy up` against the emulator, streaming and not."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.emulator import CustomToolCall, FunctionCall, Text, context_length_exceeded_400

pytestmark = pytest.mark.timeout(180)

CONFIG = {"remote_compaction": {"enabled": True, "threshold": 1.0, "recover_overflow": True},
          "model_windows": {"gpt-5*": 20_000}, "web_search": {"enabled": False}}
OUTPUTS = ("function_call_output", "custom_tool_call_output")
PATCH = "*** Begin Patch\n*** Update File: f.txt\n@@\n a\n+x\n*** End Patch\n"


def tool_case(name: str, tmp: Path):
    """(ctproxy arguments, the model's call, how many times the effect landed)."""
    ws = tmp / "ws"
    ws.mkdir()
    if name == "shell":
        return (["--bridge", "shell", "--enable", "shell", "--workspace", str(ws)],
                lambda cid: FunctionCall("exec_command", {"cmd": "echo RUN >> counter.txt"}, call_id=cid),
                lambda emu, state: len((ws / "counter.txt").read_text().splitlines()))
    if name == "apply_patch":
        (ws / "f.txt").write_text("a\n")
        return (["--bridge", "apply_patch", "--enable", "apply_patch", "--workspace", str(ws)],
                lambda cid: CustomToolCall("apply_patch", PATCH, call_id=cid),
                lambda emu, state: (ws / "f.txt").read_text().count("x"))
    if name == "image":
        return (["--bridge", "image_generation", "--enable", "image_generation"],
                lambda cid: FunctionCall("openai_generate_image", {"prompt": "a red fox"}, call_id=cid),
                lambda emu, state: [r.route for r in emu.requests].count("images"))
    return (["--bridge", "notes"],
            lambda cid: FunctionCall("notes_append_to_file", {"path": "log.md", "text": "ran\n"}, call_id=cid),
            lambda emu, state: sum(p.read_text().count("ran") for p in (state / "notes").rglob("log.md")))


def responder(call, overflows: int):
    """The model: a call while its output is not in the input (a turn run again from round 1 gets it again),
    then `overflows` overflows, then the answer."""
    seen = {"calls": 0, "overflows": 0}

    def reply(req):
        items = req.json.get("input") or []
        if not any(isinstance(i, dict) and i.get("type") in OUTPUTS for i in items):
            seen["calls"] += 1
            return call(f"call_{seen['calls']}")
        if seen["overflows"] < overflows:
            seen["overflows"] += 1
            return context_length_exceeded_400()
        return Text("done")

    return reply


HISTORY = [{"role": "user", "content": "an older history: " + "h" * 40_000},
           {"role": "assistant", "content": "b"}, {"role": "user", "content": "please do it"}]


async def start(emulator, proxy_factory, tmp_path, tool, overflows):
    args, call, count = tool_case(tool, tmp_path)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    proxy = await proxy_factory(upstream=emulator.url, extra_args=[*args, "--config", str(cfg)],
                                env={"OPENAI_API_KEY": ""})
    emulator.set_default(responder(call, overflows))
    return proxy, count


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool", ["shell", "apply_patch", "image", "notes"])
async def test_a_later_overflow_is_recovered_from_that_round_and_each_call_runs_once(
        emulator, proxy_factory, tmp_path, tool, stream):
    proxy, count = await start(emulator, proxy_factory, tmp_path, tool, overflows=1)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-overflow-once", max_retries=0)
    if stream:
        async with client.responses.stream(model="gpt-5", input=HISTORY) as s:
            final = await s.get_final_response()
    else:
        final = await client.responses.create(model="gpt-5", input=HISTORY)
    await client.close()
    assert count(emulator, proxy.state_dir) == 1, proxy.log()[-3000:]
    assert final.output_text == "done"
    assert [o.type for o in final.output] == ["mcp_call", "message"]
    turns = [r for r in emulator.responses_requests if r.route == "responses"]
    failed, retry = turns[1], turns[-1]
    assert failed.status == 400 and retry.status == 200
    assert len(retry.raw_body) < len(failed.raw_body)  # compacted
    carried = [i for i in retry.json["input"] if i.get("type") in OUTPUTS]
    assert [i["call_id"] for i in carried] == ["call_1"]  # the output of the call that ran, carried whole
    assert sum(1 for r in turns if not any(i.get("type") in OUTPUTS for i in r.json["input"])) == 1  # round 1 once


@pytest.mark.parametrize("tool", ["shell", "notes"])
async def test_an_overflow_that_recovery_cannot_fix_hands_the_agent_the_error_and_what_ran(
        emulator, proxy_factory, tmp_path, tool):
    proxy, count = await start(emulator, proxy_factory, tmp_path, tool, overflows=10)
    async with aiohttp.ClientSession() as http, http.post(
            proxy.url + "/v1/responses", json={"model": "gpt-5", "input": HISTORY},
            headers={"Authorization": "Bearer sk-test-overflow-once"}) as resp:
        status, body = resp.status, await resp.json()
    assert count(emulator, proxy.state_dir) == 1, proxy.log()[-3000:]
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "call_1" in body["error"]["message"] and "not run again" in body["error"]["message"]
    assert [(i["type"], i["status"]) for i in body["output"]] == [("mcp_call", "completed")]
    turns = [r for r in emulator.responses_requests if r.route == "responses"]
    assert sum(1 for r in turns if not any(i.get("type") in OUTPUTS for i in r.json["input"])) == 1
