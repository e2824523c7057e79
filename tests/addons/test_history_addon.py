"""The history addon on flows (mitmproxy test helpers): chained with session/tap, and alone."""

from __future__ import annotations

import asyncio
import inspect

import orjson
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from addons.history import History, mark_of
from addons.session import Session
from addons.tap import Tap
from proxy.host.flowstate import state_of
from proxy.items.sse import encode_event


def make_flow(body: dict, headers: tuple = ()) -> http.HTTPFlow:
    req = tutils.treq(method=b"POST", scheme=b"https", host="api.openai.com", port=443, path=b"/v1/responses",
                      content=orjson.dumps(body), headers=((b"content-type", b"application/json"), *headers))
    flow = tflow.tflow(req=req)
    flow.response = None
    return flow


def output_msg(text: str, n: int) -> dict:
    return {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def json_response(items: list[dict], rid: str) -> http.Response:
    body = {"id": rid, "object": "response", "model": "gpt-5", "status": "completed", "output": items,
            "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}}
    return http.Response.make(200, orjson.dumps(body), {"content-type": "application/json"})


def sse_events(items: list[dict], rid: str) -> list[bytes]:
    resp = {"id": rid, "object": "response", "model": "gpt-5", "status": "in_progress", "output": []}
    out = [encode_event({"type": "response.created", "sequence_number": 0, "response": resp})]
    for i, item in enumerate(items):
        out.append(encode_event({"type": "response.output_item.done", "sequence_number": i + 1,
                                 "output_index": i, "item": item}))
    done = {**resp, "status": "completed", "output": [], "usage": {"input_tokens": 5, "output_tokens": 1}}
    out.append(encode_event({"type": "response.completed", "sequence_number": len(items) + 1, "response": done}))
    return out


async def run_request(addons: list, flow: http.HTTPFlow) -> None:
    for a in addons:
        if flow.response is not None:
            break
        if hasattr(a, "request"):
            a.request(flow)


async def run_response(addons: list, flow: http.HTTPFlow) -> None:
    for a in addons:
        if hasattr(a, "responseheaders"):
            a.responseheaders(flow)
    for a in addons:
        if hasattr(a, "response"):
            await settled(a.response(flow))


async def settled(result: object) -> None:
    """A hook's result, awaited when it is awaitable (as mitmproxy does): the tap waits for its usage commit,
    the history stage for the session's registration (read-your-writes)."""
    if inspect.isawaitable(result):
        await result


async def test_chain_journals_input_and_json_output(rt):
    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        flow = make_flow({"model": "gpt-5", "input": [{"role": "user", "content": "hi"}]})
        await run_request(chain, flow)
        mark = mark_of(flow)
        assert mark is not None and mark.address == "/root" and len(mark.input_ids) == 1
        assert state_of(flow).agent_identity == (mark.task_id, "/root")
        flow.response = json_response([output_msg("hello", 1)], "resp_1")
        await run_response(chain, flow)
        assert mark.response_done
        j = rt.services.journal
        assert j.flush()
        assert len(j.item_ids_for_session(mark.session_key)) == 2
        # The next turn continues the same session (resent history keeps its ids).
        flow2 = make_flow({"model": "gpt-5", "input": [
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"role": "user", "content": "again"}]})
        await run_request(chain, flow2)
        mark2 = mark_of(flow2)
        assert mark2.session_key == mark.session_key and mark2.kind == "continue"
        assert mark2.input_ids[:2] == j.item_ids_for_session(mark.session_key)[:2]
        # previous_response_id resolves through the journal's aliases.
        flow3 = make_flow({"model": "gpt-5", "input": "x", "previous_response_id": "resp_1",
                           "instructions": "different"})
        await run_request(chain, flow3)
        assert mark_of(flow3).session_key == mark.session_key and mark_of(flow3).kind == "diverged"


async def test_unknown_task_is_refused_with_400_and_not_forwarded(rt):
    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        flow = make_flow({"model": "gpt-5", "input": "hi"}, ((b"x-ctp-task", b"task_nope"),))
        await run_request(chain, flow)
        assert flow.response is not None and flow.response.status_code == 400
        err = orjson.loads(flow.response.content)["error"]
        assert err["code"] == "unknown_task" and "ctproxy task new" in err["message"]
        assert "x-ctp-task" not in flow.request.headers


async def test_joining_a_task_with_an_agent_name(rt):
    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        root = make_flow({"model": "gpt-5", "input": "plan"})
        await run_request(chain, root)
        task = mark_of(root).task_id
        child = make_flow({"model": "gpt-5", "input": "review"},
                          ((b"x-ctp-task", task.encode()), (b"x-ctp-agent", b"reviewer")))
        await run_request(chain, child)
        assert (mark_of(child).task_id, mark_of(child).address) == (task, "/root/reviewer")
        bad = make_flow({"model": "gpt-5", "input": "x"}, ((b"x-ctp-task", task.encode()), (b"x-ctp-agent", b"A")))
        await run_request(chain, bad)
        assert bad.response.status_code == 400
        assert orjson.loads(bad.response.content)["error"]["code"] == "invalid_agent"


async def _streaming(chain: list, text: str):
    """A streamed request through the chain's request hooks, answered with SSE headers: the flow and the stream
    callable the chain set on its response."""
    flow = make_flow({"model": "gpt-5", "input": text, "stream": True})
    await run_request(chain, flow)
    flow.response = http.Response.make(200, b"", {"content-type": "text/event-stream"})
    for a in chain:
        if hasattr(a, "responseheaders"):
            a.responseheaders(flow)
    return flow, flow.response.stream


async def test_streamed_output_is_enqueued_before_the_last_event_is_forwarded(rt):
    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        flow, stream = await _streaming(chain, "hi")
        assert callable(stream)
        events = sse_events([{"type": "reasoning", "id": "rs_1", "summary": []}, output_msg("hey", 1)], "resp_s")
        mark = mark_of(flow)
        for chunk in events[:-1]:
            assert stream(chunk) == chunk
        assert not mark.response_done
        last = events[-1]
        assert stream(last[:10]) + stream(last[10:]) == last
        assert mark.response_done  # journaled as the terminal event passed, before the client got it
        stream(b"")
        flow.response.content = None
        for a in chain:
            if hasattr(a, "response"):
                await settled(a.response(flow))
        j = rt.services.journal
        assert len(j.item_ids_for_session(mark.session_key)) == 3
        assert j.session_for_response("resp_s") == mark.session_key


async def test_broken_stream_keeps_the_items_that_completed(rt):
    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        flow = make_flow({"model": "gpt-5", "input": "hi", "stream": True})
        await run_request(chain, flow)
        flow.response = http.Response.make(200, b"", {"content-type": "text/event-stream"})
        for a in chain:
            if hasattr(a, "responseheaders"):
                a.responseheaders(flow)
        for chunk in sse_events([output_msg("partial", 1)], "resp_b")[:-1]:
            flow.response.stream(chunk)
        for a in chain:
            if hasattr(a, "error"):
                a.error(flow)
        j = rt.services.journal
        assert j.flush()
        mark = mark_of(flow)
        assert len(j.item_ids_for_session(mark.session_key)) == 2
        row = j.backend._read.execute("SELECT incomplete, item_count FROM journal_responses").fetchone()
        assert tuple(row) == (1, 1)


async def test_history_alone_resolves_strips_headers_and_reads_the_buffered_body(rt):
    addon = History()
    with taddons.context(addon):
        flow = make_flow({"model": "gpt-5", "input": "hi"}, ((b"x-ctp-agent", b"solo"),))
        addon.request(flow)
        assert "x-ctp-agent" not in flow.request.headers
        mark = mark_of(flow)
        assert mark.address == "/root/solo"
        flow.response = http.Response.make(200, b"".join(sse_events([output_msg("yo", 1)], "resp_a")),
                                           {"content-type": "text/event-stream"})
        await settled(addon.response(flow))
        j = rt.services.journal
        assert len(j.item_ids_for_session(mark.session_key)) == 2


async def test_disabled_history_touches_nothing(rt):
    rt.config.history.enabled = False
    addon = History()
    with taddons.context(addon):
        flow = make_flow({"model": "gpt-5", "input": "hi"}, ((b"x-ctp-task", b"task_nope"),))
        addon.request(flow)
        assert flow.response is None and mark_of(flow) is None


async def test_upstream_error_is_kept_with_the_response(rt):
    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        flow = make_flow({"model": "gpt-5", "input": [{"role": "user", "content": "a very long input"}]})
        await run_request(chain, flow)
        err = {"error": {"message": "Your input exceeds the context window of this model.",
                         "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}
        flow.response = http.Response.make(400, orjson.dumps(err), {"content-type": "application/json"})
        await run_response(chain, flow)
        j = rt.services.journal
        assert j.flush()
        row = j.backend._read.execute("SELECT error, item_count, incomplete FROM journal_responses").fetchone()
        assert '"code":"context_length_exceeded"' in row[0] and row[1] == 0
        mark = mark_of(flow)
        assert j.item_ids_for_session(mark.session_key) == mark.input_ids  # the input is journaled all the same


async def test_a_held_answer_is_journaled_once_it_is_settled_and_as_it_ends(rt):
    """While a stage holds the answer (FlowState.settling), the readers wait; `settled()` gives them
    the final answer (a replaced one, as after overflow recovery), not the first."""
    from proxy.host.flowstate import Settling

    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        flow = make_flow({"model": "gpt-5", "input": "hi"})
        await run_request(chain, flow)
        flow.response = json_response([output_msg("first try", 1)], "resp_first")
        state_of(flow).settling = Settling()  # what the compaction stage does for a maybe-overflow
        await run_response(chain, flow)
        mark = mark_of(flow)
        assert not mark.response_done  # nobody read the held answer
        flow.response = json_response([output_msg("the retry", 2)], "resp_retry")  # replaced
        settling, state_of(flow).settling = state_of(flow).settling, None
        settling.settled()
        assert mark.response_done
        j = rt.services.journal
        assert j.session_for_response("resp_retry") == mark.session_key
        assert j.session_for_response("resp_first") is None


async def test_the_usage_commit_starts_at_the_terminal_event_and_the_answer_ends_once_it_is_committed(rt):
    """The answer's end (its `response` hooks, then mitmproxy's end of message) waits until its usage is
    committed, so another process reads it once the agent has the answer. The commit starts as the terminal
    event passes, so by the end there is usually nothing left to wait for, not even a hand-off to the thread."""
    from proxy import usage
    from proxy.db import connect
    from proxy.dbworker import shared

    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        flow, stream = await _streaming(chain, "count my tokens")
        events = sse_events([output_msg("hey", 1)], "resp_u")
        for chunk in events:
            stream(chunk)
        db = shared(rt.services, rt.state.db_path)
        assert not db._pending  # handed to the database thread as the terminal event passed, not a batch later
        waiting = db.settled()
        if waiting is not None:
            await waiting
        stream(b"")
        flow.response.content = None
        tap = next(a for a in chain if isinstance(a, Tap))
        assert tap.response(flow) is None  # committed already: the answer's end does not wait
        for a in chain:
            if hasattr(a, "response") and not isinstance(a, Tap):
                await settled(a.response(flow))
        key = mark_of(flow).session_key
        reader = connect(rt.state.db_path)
        try:
            seen = usage.last_usage_for_session(reader, key)
        finally:
            reader.close()
        assert seen is not None and seen.input_tokens == 5 and seen.response_id == "resp_u"


async def test_a_buffered_answer_ends_only_once_its_usage_is_committed(rt):
    from proxy import usage
    from proxy.db import connect

    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        flow = make_flow({"model": "gpt-5", "input": "count these tokens"})
        await run_request(chain, flow)
        flow.response = json_response([output_msg("ok", 1)], "resp_j")
        await run_response(chain, flow)  # every hook awaited, as mitmproxy does before it sends the answer
        reader = connect(rt.state.db_path)
        try:
            seen = usage.last_usage_for_session(reader, mark_of(flow).session_key)
        finally:
            reader.close()
        assert seen is not None and seen.response_id == "resp_j"


async def test_a_session_its_request_opens_is_not_read_from_the_database(rt, monkeypatch):
    """A second conversation under an answered start is minted by its first request (`proxy.session.minted_for`):
    nothing of it, its task or its claim can be in the database, in any process. Its request hooks and its stream up
    to and through the terminal event (the answer's claim is recorded there) read nothing when its answer is word for
    word the first conversation's (whose continuation this process knows; a new answer's continuation is still
    looked up: another process may hold it); what it writes is all there once committed."""
    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        first, stream = await _streaming(chain, "the same start")
        for chunk in sse_events([output_msg("first answer", 1)], "resp_first"):
            stream(chunk)
        stream(b"")
        await run_response(chain, first)
        j = rt.services.journal
        assert j.flush()

        reads: list[str] = []
        for name in ("session", "branch", "latest_window", "max_ordinal", "session_for_response",
                     "sessions_for_responses", "task_exists", "agent_exists", "stamp", "response_tail"):
            real = getattr(j.backend, name)

            def counted(*args, _name=name, _real=real):
                reads.append(_name)
                return _real(*args)

            monkeypatch.setattr(j.backend, name, counted)
        second, stream = await _streaming(chain, "the same start")
        mark = mark_of(second)
        assert mark.session_key != mark_of(first).session_key and mark.minted
        for chunk in sse_events([output_msg("first answer", 2)], "resp_second"):
            stream(chunk)
        assert mark.response_done
        assert reads == []
        stream(b"")
        await run_response(chain, second)
        monkeypatch.undo()
        assert j.flush()
        key = mark.session_key
        assert j.session_for_response("fclaim:" + key) == key  # its answer claimed it
        assert j.session_for_response("resp_second") == key
        assert [w.window_id for w in j.windows(key)] == ["w1"]
        assert j.task_exists(mark.task_id) and j.agent_exists(mark.task_id, mark.address)
        assert len(j.item_ids_for_session(key)) == 2


async def test_a_registration_not_committed_at_the_terminal_event_starts_its_commit_there(rt):
    """The answer's end waits for the session's registration (read-your-writes). A stream that ends before the
    writer's next drain would start that commit only at the answer's end, after a hop to a thread; it starts as
    the terminal event passes instead, so the end usually finds it done."""
    from addons.history import journal

    chain = [Session(), Tap(), History()]
    with taddons.context(*chain):
        j = journal(rt)
        j.writer.batch_interval = 60.0  # no drain by itself, nor by a loop timer, within this test
        flow, stream = await _streaming(chain, "a short stream")
        registered = mark_of(flow).state.registered
        assert registered is not None and not registered.is_set()
        events = sse_events([output_msg("done", 1)], "resp_short")
        for chunk in events[:-1]:
            stream(chunk)
        assert not registered.is_set()
        stream(events[-1])  # the terminal event
        assert await asyncio.to_thread(registered.wait, 30)  # committed without the answer's end asking
        stream(b"")
        await run_response(chain, flow)
        assert j.session_for_response("resp_short") == mark_of(flow).session_key


async def test_a_session_its_request_opens_has_no_pending_rollover_to_look_up(rt, monkeypatch):
    """The context stage asks whether a rollover is pending for every stateless request of a known session. A
    session (and its task) that this very request opened (`RequestMark.minted`) cannot have one: no agent knew its
    task to mark it. So its request reads nothing for it; the first conversation's next turn still asks."""
    from addons.context import Context
    from proxy.windows.notes.rollover import RolloverStore

    asked: list[tuple[str, str]] = []
    real = RolloverStore._maybe_pending

    def counted(self, task_id, address):
        asked.append((task_id, address))
        return real(self, task_id, address)

    monkeypatch.setattr(RolloverStore, "_maybe_pending", counted)
    chain = [Session(), Tap(), History(), Context()]
    with taddons.context(*chain):
        first, stream = await _streaming(chain, "the same start")
        assert not mark_of(first).minted and asked == [(mark_of(first).task_id, mark_of(first).address)]
        for chunk in sse_events([output_msg("first answer", 1)], "resp_first"):
            stream(chunk)
        stream(b"")
        await run_response(chain, first)
        asked.clear()

        second, _ = await _streaming(chain, "the same start")
        assert mark_of(second).minted and mark_of(second).session_key != mark_of(first).session_key
        assert asked == []
