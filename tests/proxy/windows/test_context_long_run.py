"""Issue 13: a long scripted run through `ctproxy up --bridge context,notes,history` (the short variant of
`bench/bench_context.py`'s 2,000 turns). The scripted model forces every way a window changes — bridged
`new_context` (alone and in a batch with the agent's own call), the hard trigger's checkpoint turn (a
clean write, a failed write corrected once, no write → the readable fallback), a manual checkpoint, remote
compaction before forwarding, a failed remote compaction (→ the readable fallback) and an upstream
`context_length_exceeded` (→ remote compaction and one retry) — while a stateless agent (openai SDK, streaming)
resends its whole history every request. Every request the emulator received validates against the
official OpenAPI description and the real API's input rules, every call has its output, nothing but
completed responses reach the agent, every forced window change opened its window, and the journal holds
every item the agent sent and received, in order."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from bench.bench_context import OPENS, SPECIAL, LongRunResult, call_counts, kind_of, long_run
from tests.openapi_schema import spec_available

pytestmark = pytest.mark.timeout(300)
TURNS = 200  # two cycles of the schedule: every special kind twice (the overflow once, in the last cycle)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> LongRunResult:
    """One run shared by the checks below (its own event loop: the run is the fixture's whole work)."""
    return asyncio.run(long_run(TURNS, Path(tmp_path_factory.mktemp("long")), probe_every=10**9))  # no probes


def test_the_schedule_forces_every_kind_of_window_change() -> None:
    kinds = Counter(kind_of(n, TURNS) for n in range(1, TURNS + 1))
    once = {"overflow"}  # last cycle only, and no hard trigger after it (bench_context.LAST_CYCLE_ONLY)
    assert {k: kinds[k] for k in SPECIAL.values()} == {k: 1 if k in once else 2 for k in SPECIAL.values()} | {
        "hard_fail": 1}
    assert set(OPENS) == set(SPECIAL.values())


def test_nothing_failed_reached_the_agent(run: LongRunResult) -> None:
    statuses = run.upstream_statuses
    # the only non-200 answers are the script's own: one context_length_exceeded per overflow turn, one
    # failing /responses/compact per fallback turn; the emulator answers 400 to any invalid body
    assert statuses[200] + statuses[400] + statuses[500] == sum(statuses.values()), statuses
    assert statuses[400] + statuses[500] == run.counts.scripted_errors == 2 + 1, statuses  # 2 fallback, 1 overflow


@pytest.mark.skipif(not spec_available(), reason="the official OpenAPI description is in ../shared/compat "
                    "(or $CTPROXY_OPENAPI_SPEC): without it no request is validated")
def test_every_request_validated(run: LongRunResult) -> None:
    assert run.requests_validated == sum(s.upstream_requests for s in run.samples) - len(run.compact_bodies)
    assert run.requests_validated > TURNS
    from tests.openapi_schema import is_valid

    assert run.compact_bodies and all(is_valid("CompactResponseMethodPublicBody", b) for b in run.compact_bodies)


def test_every_call_has_its_output(run: LongRunResult) -> None:
    calls = call_counts(run.history)
    assert calls["function_call"] >= 45 and calls["custom_tool_call"] >= 40 and calls["mcp_call"] >= 4, calls
    outputs = Counter(i["type"] for i in run.history if i.get("type", "").endswith("_output"))
    assert outputs["function_call_output"] == calls["function_call"]
    assert outputs["custom_tool_call_output"] == calls["custom_tool_call"]
    assert all(i.get("output") and i.get("status") == "completed" for i in run.history if i.get("type") == "mcp_call")


def test_every_forced_window_change_opened_its_window(run: LongRunResult) -> None:
    assert run.opened_by_cause - Counter(remote=10**9) == run.expected_by_cause - Counter(remote=10**9), run.reasons
    opened = run.opened_by_cause
    # hard_fail: a failed checkpoint turn compacts, remotely where eligible (the route is)
    assert opened["notes"] == 2 * 5 and opened["remote"] >= 2 + 1 and opened["fallback"] == 2
    assert run.reasons[("remote", "context_threshold")] == 1
    assert opened["overflow"] == 1
    # per cycle: hard 1 request, hard_fix 2 (one correction), manual 1, hard_fail 1 (not after the overflow)
    assert run.counts.checkpoint_turns == (1 + 2 + 1 + 1) + (1 + 2 + 1)
    assert run.rollovers_metric is not None and run.rollovers_metric >= opened["notes"]


def test_the_overflow_is_compacted_remotely(run: LongRunResult) -> None:
    """With the bridge on too (test_an_overflow_behind_the_bridge_is_compacted_remotely)."""
    assert run.overflow_strategies == Counter({"remote": 1})


def test_the_journal_holds_every_item(run: LongRunResult) -> None:
    matched, own, _ = run.journal_match()
    assert matched == len(run.history) > 3 * TURNS  # every item the agent sent and received, in order
    assert own == (1 + 2 + 1) * 2  # ctproxy's own checkpoint writes (hard, hard_fix's bad and good, manual) ×2


def test_the_journal_holds_nothing_the_agent_did_not_exchange(run: LongRunResult) -> None:
    assert run.journal_match()[2] == []


async def test_an_overflow_behind_the_bridge_is_compacted_remotely(emulator, proxy_factory, tmp_path: Path) -> None:
    """Found by the long run: with `--bridge`, the agent's request is re-routed to the bridge's loopback
    endpoint (its credentials moved into the turn's job) before the answer comes back, and the overflow
    recovery took the compaction endpoint from the flow's destination at that time: the remote call went
    to the bridge endpoint instead of the upstream (`overflow:compaction_count`, then the readable fallback)."""
    import json

    import openai

    from bench.bench_context import new_task, window_reasons
    from tests.emulator import Text, context_length_exceeded_400

    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"remote_compaction": {"enabled": True}}))
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--config", str(cfg), "--bridge", "context"])
    task = await asyncio.to_thread(new_task, proxy.state_dir)
    emulator.script(Text("first"), context_length_exceeded_400())
    emulator.set_default(Text("after the retry"))
    # a history the retry can halve (the bridged specs alone are ≈3 KB of the body)
    history: list[dict[str, object]] = [{"role": "user", "content": "one " + "x" * 40_000}]
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-overflow-test", max_retries=0,
                                  default_headers={"x-ctp-task": task, "x-ctp-agent": "/root"}) as client:
        first = await client.responses.create(model="gpt-4.1", store=False, input=history)
        history += [o.model_dump(mode="json", exclude_none=True) for o in first.output]
        history.append({"role": "user", "content": "two"})
        resp = await client.responses.create(model="gpt-4.1", store=False, input=history)
    assert resp.output_text == "after the retry"
    compacts = [r for r in emulator.requests if r.route == "compact"]
    assert len(compacts) == 1 and compacts[0].header("authorization") == "Bearer sk-overflow-test"
    reasons: Counter[tuple[str, str]] = Counter()
    for _ in range(100):  # windows commit with the journal writer's next batch
        reasons = window_reasons(proxy.state_dir / "ctproxy.db", task)
        if reasons[("remote", "overflow")]:
            break
        await asyncio.sleep(0.1)
    assert reasons[("remote", "overflow")] == 1, reasons


def _fit_input_reference(bootstrap: list[object], tail: list[object], budget: int) -> list[object] | None:
    """fit_input as it was: the whole input serialized again for every message dropped."""
    from proxy.items.inputs import items_bytes, text_parts
    from proxy.windows.fallback import fallback_message, is_fallback_message, shrink_fallback_text
    from proxy.windows.remote.bootstraps import _anchor

    boot, rest = list(bootstrap), list(tail)
    while items_bytes([*boot, *rest]) > budget:
        idx = next((i for i, it in enumerate(boot) if not _anchor(it)), None)
        if idx is None:
            break
        del boot[idx]
    for i, it in enumerate(boot):
        excess = items_bytes([*boot, *rest]) - budget
        if excess <= 0:
            break
        if is_fallback_message(it):
            text = "".join(text_parts(it))
            boot[i] = fallback_message(shrink_fallback_text(text, len(text.encode()) - excess))
    return [*boot, *rest] if items_bytes([*boot, *rest]) <= budget else None


@pytest.mark.parametrize("seed", range(40))
def test_fit_input_counts_bytes_as_one_serialization_would(seed: int) -> None:
    """Found by the long run: after an overflow, every request above the learned window fitted its bootstrap,
    and fit_input serialized the whole input once per dropped message (1.2 s per request at 0.7 MB, in
    py-spy 73% of the proxy's time). Each item is now serialized once; the result must be the same."""
    import random

    from proxy.items.inputs import items_bytes
    from proxy.windows.fallback import fallback_message, fallback_text
    from proxy.windows.remote.bootstraps import fit_input

    rnd = random.Random(seed)

    def text(n: int) -> str:
        return "".join(rnd.choice("ab \"é€\\\n😀") for _ in range(n))

    retained = [{"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": text(rnd.randint(0, 400))}]}
                for _ in range(rnd.randint(0, 12))]
    anchor = rnd.choice([{"type": "compaction", "encrypted_content": text(50)},
                         fallback_message(fallback_text(f"cp_{seed}", [{"role": "user", "content": text(3_000)}]))])
    boot = [*retained, anchor] if rnd.random() < 0.8 else [anchor, *retained]
    tail = [{"role": "user", "content": text(rnd.randint(0, 300))} for _ in range(rnd.randint(0, 5))]
    whole = items_bytes([*boot, *tail])
    for budget in (whole, whole - 1, whole // 2, whole // 5, rnd.randint(0, whole), 10):
        got = fit_input(boot, tail, budget)
        assert got == _fit_input_reference(boot, tail, budget), budget
        assert got is None or items_bytes(got) <= budget
