"""What session 9 changed on every request's path keeps its behaviour: the headers decoded once per version of
them, a lazy input list still a Sequence (now by registration), the model-window memo, the one-pass positions,
and the context stage synchronous when nothing is pending but still consuming what is."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import fastsimdjson
import orjson
from mitmproxy.test import tflow, tutils

from addons._flow import header_map, header_pairs
from proxy import usage
from proxy.items.lazyitems import LazyItems, positions_of


def _flow(headers: list[tuple[bytes, bytes]]):
    return tflow.tflow(req=tutils.treq(headers=tuple(headers)))


def test_header_map_follows_every_change_of_the_headers():
    flow = _flow([(b"Authorization", b"Bearer a"), (b"X-Ctp-Task", b"t1"), (b"Accept", b"a"), (b"accept", b"b")])
    first = header_map(flow)
    assert first["x-ctp-task"] == "t1" and first["accept"] == "a, b"  # lower-case names, repeated ones joined
    assert header_map(flow) is first  # the same version: decoded once
    assert header_pairs(flow) == (("Authorization", "Bearer a"), ("X-Ctp-Task", "t1"), ("Accept", "a"),
                                  ("accept", "b"))  # repeated headers kept apart for the credential rule
    del flow.request.headers["x-ctp-task"]
    assert "x-ctp-task" not in header_map(flow)
    flow.request.headers["authorization"] = "Bearer b"
    assert header_map(flow)["authorization"] == "Bearer b"
    flow.request.headers = flow.request.headers.copy()  # a new Headers object with equal fields
    assert header_map(flow)["authorization"] == "Bearer b"


def test_a_shared_header_map_is_never_changed_by_the_session_lookup():
    from addons._flow import session_of
    from proxy.host.flowstate import state_of

    body = orjson.dumps({"model": "m", "input": [{"role": "user", "content": "hi"}]})
    flow = tflow.tflow(req=tutils.treq(method=b"POST", path=b"/v1/responses", content=body,
                                       headers=((b"content-type", b"application/json"),)))
    state_of(flow).identity_headers = {"x-ctp-task": "t9"}
    shared = header_map(flow)
    ident = session_of(flow, None)
    assert ident is not None and ident.task == "t9"
    assert "x-ctp-task" not in shared and header_map(flow) is shared


def _lazy(items: list[object]) -> LazyItems:
    raw = orjson.dumps(items)
    return LazyItems(fastsimdjson.parse(raw), raw, 0, len(raw))


def test_lazy_items_keep_the_sequence_methods_and_build_only_what_they_read():
    items = [{"k": i} for i in range(10)]
    lazy = _lazy(items)
    assert isinstance(lazy, Sequence) and not isinstance(lazy, list)
    assert lazy.index({"k": 3}) == 3 and lazy.index({"k": 3}, 2, 5) == 3
    assert lazy.count({"k": 4}) == 1 and {"k": 9} in lazy and {"k": 10} not in lazy
    try:
        lazy.index({"k": 3}, 4)
    except ValueError:
        pass
    else:
        raise AssertionError("index past the item must raise ValueError, as a list's does")
    fresh = _lazy(items)
    assert next(reversed(fresh)) == {"k": 9} and fresh.materialized is None  # one item read, nothing built
    assert list(reversed(fresh)) == items[::-1]
    fresh.materialize()
    assert list(reversed(fresh)) == items[::-1] and fresh.index({"k": 2}) == 2


def test_positions_of_finds_every_wanted_value_in_order():
    values = ["developer", None, "user", "system", "developer", "assistant", "system"]
    assert positions_of(values, ("developer", "system")) == [0, 3, 4, 6]
    assert positions_of(values, ("tool",)) == []
    assert positions_of([], ("developer", "system")) == []


def test_model_window_memo_follows_a_new_table():
    table = {"gpt-test*": 1000, "*": 5}
    assert usage.model_window("gpt-test-1", table) == 1000
    assert usage.model_window("other", table) == 5
    assert usage.model_window("gpt-test-1", {"gpt-test-1": 7}) == 7  # another table: asked again
    assert usage.model_window("gpt-test-1", {}) is None
    assert usage.model_window("", table) is None and usage.model_window(None, table) is None


def test_the_rollover_check_answers_without_the_worker_and_take_still_consumes(tmp_path):
    from proxy.db import connect
    from proxy.dbworker import DBWorker
    from proxy.windows.notes import rollover

    path = tmp_path / "ctproxy.db"
    other = connect(path)  # another process's connection (the tool server's)
    rollover.ensure(other)
    worker = DBWorker(path)
    try:
        store = rollover.RolloverStore(worker, path)
        assert store.may_be_pending("task_1", "/root") is False  # the context stage stays synchronous then
        rollover.mark_pending(other, "task_1", "/root", "new_context", "tool")
        assert store.may_be_pending("task_1", "/root") is True  # the stamp moved: seen at once
        taken = asyncio.run(store.take("task_1", "/root"))
        assert taken is not None and taken.kind == "new_context"
        assert asyncio.run(store.take("task_1", "/root")) is None
    finally:
        worker.close()
        other.close()


def test_header_values_read_in_one_pass_as_headers_get_reads_them() -> None:
    from mitmproxy import http

    from proxy.host import rawheaders

    for fields in ([(b"Content-Type", b"application/json"), (b"content-encoding", b"gzip")],
                   [(b"CONTENT-TYPE", b"a"), (b"Content-Type", b"b"), (b"X-Other", b"y")], [],
                   [(b"content-encoding", b"\xff"), (b"Content-Encoding", b"br")]):
        headers = http.Headers(fields)
        assert rawheaders.values(headers.fields, b"content-type", b"content-encoding") == (
            headers.get("content-type", ""), headers.get("content-encoding", ""))
