"""Issue 11, "Compaction: contract gaps measured from outside": each test drives the real proxy in front of
the emulator the way a user would, and checks the contract from outside.

1. The API route's `POST /v1/responses/compact` output is the bootstrap, exactly (responses-api.md §6.1).
2. Overflow recovery retries with a body strictly smaller than the one that failed, learns the upstream's
   real window and remembers it.
3. No compaction loops (openai/codex#40213): at most one compaction per agent request, never two in a row
   without new agent items.
4. Two remote compactions with a `ctproxy up` restart between them: replay stays exact.
"""

from __future__ import annotations

import itertools
import json

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI

from proxy.db import connect
from proxy.windows.remote import store
from tests.emulator import Emulator, context_length_exceeded_400
from tests.proxy.windows.test_compaction_harness import (
    API_KEY,
    assistant,
    codex_turn,
    completed_output_text,
    running_proxy,
    user,
)

pytestmark = pytest.mark.timeout(240)

WINDOW = 20_000  # tokens; threshold 0.8 → compaction above 16,000 (≈ 64 KB)


def tool_turn(i: int, size: int = 5_800) -> list[dict]:
    """A short user ask, a tool call and its large output: agent sessions are mostly tool traffic."""
    call = f"call_{i}"
    return [user(f"ask {i}: look at file {i}"),
            {"type": "function_call", "call_id": call, "name": "read_file", "arguments": f'{{"n": {i}}}'},
            {"type": "function_call_output", "call_id": call, "output": f"file {i}: " + "z" * size}]


def by_route(emu: Emulator, route: str) -> list:
    return [r for r in emu.requests if r.route == route]


# ---- 1. the API route's compact output is the bootstrap ---------------------------------------------

async def test_api_compact_output_is_the_next_input_exactly(tmp_path, monkeypatch):
    config = {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": WINDOW}}
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config, monkeypatch) as base:
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        history: list = []
        for i in range(1, 16):
            history += tool_turn(i)
            answer = await client.responses.create(model="gpt-test-1", input=history, store=False)
            history.append(assistant(answer.output_text))
        await client.close()
        (compact,) = by_route(emu, "compact")
        output = compact.extra["output"]
        assert output[-1]["type"] == "compaction" and len(output) > 1  # retained items + the compaction item
        later = [r for r in by_route(emu, "responses") if r.received_at > compact.received_at]
        assert later
        for req in later:
            inp = req.json["input"]
            # exactly the returned output, in order (ids and status included), then the agent's newer items
            assert inp[:len(output)] == output
            tail = inp[len(output):]
            sent = [i for i in history if i in tail]
            assert tail == sent and tail, "the agent's items after the boundary follow unchanged"


# ---- 2. overflow recovery shrinks, and learns the upstream's real window ---------------------------

LIMIT = 60_000  # bytes: the upstream's real window, far below the model table's
TABLE = {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": 128_000}}
MESSAGE = "m" * 3_000


def overflow_pairs(emu: Emulator) -> list[tuple]:
    """(failed create request, the create request that followed it) for every overflow on a turn."""
    turns = by_route(emu, "responses")
    return [(a, b) for a, b in itertools.pairwise(turns) if a.status == 400]


def learned(tmp_path) -> list[tuple]:
    conn = connect(tmp_path / "state" / "ctproxy.db")
    try:
        return [tuple(r) for r in conn.execute("SELECT model, window_tokens FROM compaction_windows")]
    finally:
        conn.close()


async def test_overflow_retry_is_smaller_and_the_real_window_is_learned_and_remembered(tmp_path, monkeypatch):
    async with Emulator(context_limit_bytes=LIMIT) as emu:
        async with running_proxy(tmp_path, emu.url, TABLE, monkeypatch) as base:
            client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
            history: list = []
            for i in range(30):  # 30 user messages of 3,000 characters, as a stateless agent sends them
                history.append(user(f"{i}: {MESSAGE}"))
                answer = await client.responses.create(model="gpt-test-1", input=history, store=False)
                assert answer.output_text.startswith(f"You said: {i}: mmm"), i  # the agent never sees the 400
                history.append(assistant(answer.output_text))
            await client.close()
            pairs = overflow_pairs(emu)
            assert len(pairs) == 1, "the upstream's window is learned from the first overflow"
            failed, retry = pairs[0]
            assert len(retry.body) < len(failed.body) and retry.status == 200
            assert all(len(r.body) <= LIMIT for r in by_route(emu, "responses")[-5:])
            ((model, window),) = learned(tmp_path)
            assert model == "gpt-test-1" and window <= len(failed.body) // 4 + 1
        # Remembered: a new ctproxy on the same state directory compacts a new conversation before it
        # overflows, without asking the upstream first.
        emu.reset()
        async with running_proxy(tmp_path, emu.url, TABLE, monkeypatch) as base:
            client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
            fresh = [user(f"other {i}: {MESSAGE}") for i in range(19)]  # about 60 kB: above the learned threshold
            answer = await client.responses.create(model="gpt-test-1", input=fresh, store=False)
            await client.close()
            assert answer.output_text.startswith("You said: other 18")
            assert [r.status for r in by_route(emu, "responses")] == [200]
            assert len(by_route(emu, "compact")) == 1


async def test_one_request_far_above_the_real_window_is_retried_smaller(tmp_path, monkeypatch):
    async with Emulator(context_limit_bytes=LIMIT) as emu, running_proxy(tmp_path, emu.url, TABLE, monkeypatch) as base:
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        inp = [user(f"{i}: {MESSAGE}") for i in range(30)]
        answer = await client.responses.create(model="gpt-test-1", input=inp, store=False)
        await client.close()
        assert answer.output_text.startswith("You said: 29: mmm")
        (failed, retry), = overflow_pairs(emu)
        assert len(failed.body) > 88_000 and len(retry.body) < len(failed.body) and retry.status == 200
        assert retry.json["input"][-1] == inp[-1]


# ---- 3. no compaction loops -------------------------------------------------------------------------

LOOP = {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": WINDOW}}
OLDER = "older history: " + "h" * 6_000


async def test_an_upstream_that_always_overflows_gets_one_compaction_not_one_per_retry(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, LOOP, monkeypatch) as base:
        emu.set_default(context_length_exceeded_400())
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        history = [user(OLDER), user("the question")]
        for _ in range(3):  # the agent retries the same request, as agents do
            with pytest.raises(openai.BadRequestError) as exc:
                await client.responses.create(model="gpt-test-1", input=history, store=False)
            assert exc.value.code == "context_length_exceeded"
        assert len(by_route(emu, "compact")) == 1, "no second compaction without new agent items"
        history += [assistant("…"), user("one more thing")]
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model="gpt-test-1", input=history, store=False)
        await client.close()
        assert len(by_route(emu, "compact")) == 2  # new agent items: one compaction for that request


async def test_one_agent_request_compacts_at_most_once(tmp_path, monkeypatch):
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, LOOP, monkeypatch) as base:
        emu.set_default(context_length_exceeded_400())
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        big = [*[user(f"{i}: " + "b" * 8_000) for i in range(9)], user("ask")]  # above the threshold
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model="gpt-test-1", input=big, store=False)
        await client.close()
        assert len(by_route(emu, "compact")) == 1  # the threshold compaction; the overflow does not add one
        first, retry = by_route(emu, "responses")  # the retry is still made, smaller, from that checkpoint
        assert len(retry.body) < len(first.body)


async def test_a_threshold_exceeded_by_every_request_does_not_compact_every_request(tmp_path, monkeypatch):
    config = {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": 4_000}}
    instructions = "Follow the house rules. " + "r" * 14_000  # alone above 80% of the window
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config, monkeypatch) as base:
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        history: list = []
        for i in range(12):
            history.append(user(f"step {i}: " + "s" * 200))
            answer = await client.responses.create(model="gpt-test-1", input=history, instructions=instructions,
                                                   store=False)
            history.append(assistant(answer.output_text))
        await client.close()
        compacts = len(by_route(emu, "compact"))
        assert 1 <= compacts <= 2, f"{compacts} compactions in 12 requests"


# ---- 4. two remote compactions with a ctproxy restart between them ----------------------------------

async def test_two_remote_compactions_across_a_restart_replay_exactly(emulator, proxy_factory, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"remote_compaction": {"enabled": True},
                                                   "model_windows": {"gpt-test*": WINDOW}}))
    sent: list[list] = []  # the agent's input of every turn, in order
    history: list = []

    async def turns(base, numbers):
        async with aiohttp.ClientSession() as http:
            for i in numbers:
                history.append(user(f"turn {i}: " + "x" * 5_800))
                sent.append(list(history))
                status, events = await codex_turn(http, base, {"model": "gpt-test-1", "input": list(history),
                                                               "store": False})
                assert status == 200, events
                history.append(assistant(completed_output_text(events)))

    first = await proxy_factory(upstream=emulator.url, state_dir=state, with_tools=False)
    await turns(first.url, range(1, 14))
    assert len(by_route(emulator, "compaction")) == 1
    await first.astop()  # the `ctproxy up` process ends; a new one starts on the same state directory
    second = await proxy_factory(upstream=emulator.url, state_dir=state, with_tools=False)
    n = 14
    while len(by_route(emulator, "compaction")) < 2 and n < 40:
        await turns(second.url, [n])
        n += 1
    await turns(second.url, range(n, n + 3))  # replayed after the second compaction
    await second.astop()

    comps = by_route(emulator, "compaction")
    assert len(comps) == 2, "the second compaction happened in the restarted process"
    conn = connect(state / "ctproxy.db")
    try:
        (key,) = store.sessions_with_checkpoints(conn)  # the windows of one journal session
        cp1, cp2 = store.checkpoints(conn, key)
    finally:
        conn.close()
    assert cp1.strategy == cp2.strategy == "remote"
    item1, item2 = orjson.loads(cp1.compaction_item), orjson.loads(cp2.compaction_item)
    assert item1 != item2
    received = by_route(emulator, "responses")
    assert len(received) == len(sent)
    replayed = {1: 0, 2: 0}
    for agent_items, req in zip(sent, received, strict=True):
        inp = req.json["input"]
        if item2 in inp:
            want, replayed[2] = [*cp2.retained, item2, *agent_items[cp2.boundary:]], replayed[2] + 1
        elif item1 in inp:
            want, replayed[1] = [*cp1.retained, item1, *agent_items[cp1.boundary:]], replayed[1] + 1
        else:
            want = agent_items
        assert inp == want
    assert replayed[1] >= 2 and replayed[2] >= 2  # both checkpoints replayed, the first one across the restart
    # The second compaction's own input is the first checkpoint's exact bootstrap, then the newer items.
    second_input = comps[1].json["input"]
    assert second_input[:len(cp1.retained) + 1] == [*cp1.retained, item1]
    assert second_input[-1] == {"type": "compaction_trigger"}
