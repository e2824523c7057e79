"""Whose conversation it is (issue 31): a client that sends no session key (the OpenAI Agents SDK, the `openai`
SDK, litellm) is told apart by its first input. The same job run twice opens the same way; run 2 must not
join run 1's task, and what run 2 writes in its first turn must be readable in its second (docs/history.md,
"Whose conversation it is"). Real Agents SDK → `ctproxy up` (bridge: notes) → the emulator."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.emulator import FunctionCall, Text

pytestmark = [pytest.mark.validate_requests, pytest.mark.timeout(300)]


agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (PyPI openai-agents) is an optional client")

INSTRUCTIONS = "You keep the job's notes."


def script_run(emulator, text: str) -> None:
    emulator.script(FunctionCall("notes_write_file", {"path": "job.md", "text": text}),
                    Text("saved"),
                    FunctionCall("notes_read_file", {"path": "job.md"}),
                    Text("read"))


async def run_job(proxy, text: str, emulator) -> None:
    script_run(emulator, text)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-agents", max_retries=0)
    model = agents.OpenAIResponsesModel(model="gpt-5", openai_client=client)
    agent = agents.Agent(name="notes keeper", instructions=INSTRUCTIONS, model=model)
    first = await agents.Runner.run(agent, "start the job")  # the same opening, both runs
    await agents.Runner.run(agent, [*first.to_input_list(), {"role": "user", "content": "read the note back"}])


def read_outputs(emulator) -> list[str]:
    """What each bridged notes_read_file returned, in order (the function_call_output the proxy sent up)."""
    out = []
    for req in emulator.responses_requests:
        items = req.json.get("input") if isinstance(req.json.get("input"), list) else []
        calls = {i.get("call_id") for i in items
                 if i.get("type") == "function_call" and i.get("name") == "notes_read_file"}
        last = [i for i in items if i.get("type") == "function_call_output" and i.get("call_id") in calls]
        if last:
            out.append(str(last[-1]["output"]))
    return out


async def test_the_same_job_run_twice_keeps_each_runs_notes(emulator, proxy_factory):
    agents.set_tracing_disabled(True)
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "notes"])
    await run_job(proxy, "job one", emulator)
    await run_job(proxy, "job two", emulator)
    assert emulator.pending() == 0
    reads = read_outputs(emulator)
    # each run's second turn reads what its own first turn wrote (the last read of each run)
    assert any("job one" in r for r in reads) and any("job two" in r for r in reads), reads
    assert not any("does not exist" in r for r in reads), reads
    notes = sorted(p.read_text() for p in Path(proxy.state_dir, "notes").rglob("job.md"))
    assert notes == ["job one", "job two"]  # two tasks: run 2 did not write into run 1's
