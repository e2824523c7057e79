"""The engine seam: one V8 isolate per cell (mini-racer), driven by message passing only.

Why message passing and not mini-racer's `wrap_py_function`: a Python callback answers JS with a
*synchronous* call into the isolate, and a synchronous call into an isolate that spins (`while (true)`)
blocks the calling thread, here the server's event loop. So Python never calls into the isolate
synchronously: it sends code strings with `eval_cancelable` (non-blocking: the isolate runs on its own
thread) and gets back strings. The cell's host functions (`tools.*`, `print`) only push JSON messages to
an outbox inside the isolate; the driver drains it, runs the tool calls in Python, and delivers the
replies in one `__ctp.step(...)`. Closing the isolate terminates whatever JS runs (even a spin inside
promise reactions), without blocking the loop.

The isolate has no ambient authority: V8 has no `fetch`, `require`, `process` or module loader
(`import()` rejects), and the bootstrap removes mini-racer's timer polyfill and `Atomics.waitAsync`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol

from py_mini_racer import JSEvalException, JSOOMException, MiniRacer

from proxy.errors import CtproxyError

# UTF-16 units of printed text a cell may produce between two yields (twice the 256 KiB preview, as the
# seed's pending-bytes bound for a capture); past it, text is counted as lost, not buffered.
OUTPUT_CREDIT = 512 * 1024


class EngineError(CtproxyError):
    """The isolate failed outside the program's own error handling (memory limit, engine fault)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True)
class Reply:
    """One settled tool call, delivered into the cell: `value` is the result as JSON text, or the error."""

    call_id: int
    ok: bool
    value: str  # ok: JSON text of the result; not ok: the error message
    code: str = ""  # error code (not ok)

    def encoded(self) -> dict[str, Any]:
        return {"id": self.call_id, "ok": self.ok, "v": self.value, "c": self.code}


class Engine(Protocol):
    """What the cell manager needs from a JavaScript engine."""

    async def boot(self, adapters: list[str]) -> None: ...

    async def start(self, source: str) -> None: ...

    async def drain(self) -> list[dict[str, Any]]: ...

    async def deliver(self, replies: list[Reply]) -> None: ...

    async def final_check(self) -> dict[str, Any]: ...

    def memory_exceeded(self) -> bool: ...

    def close(self) -> None: ...


# Everything the cell sees is defined here, before its code runs; the host's handles (`__ctp`) are
# captured by Python right after, so a cell that overwrites globals only breaks itself.
BOOTSTRAP = r"""
(() => {
  "use strict";
  const G = globalThis;
  const stringify = JSON.stringify, parse = JSON.parse, freeze = Object.freeze;
  // the builtins the host's messages need, captured before the cell can replace them
  const apply = Reflect.apply, join = Array.prototype.join;
  const arrayMap = Array.prototype.map;
  const mapGet = Map.prototype.get, mapSet = Map.prototype.set, mapDelete = Map.prototype.delete;
  const mapForEach = Map.prototype.forEach, mapSize = Reflect.getOwnPropertyDescriptor(Map.prototype, "size").get;
  const weakAdd = WeakSet.prototype.add, weakHas = WeakSet.prototype.has;
  // the program's completion is attached with this `then`, so a cell that replaces Promise.prototype.then
  // cannot keep the host from seeing it end (seed004 N7)
  const promiseThen = Promise.prototype.then;
  // The outbox is one string of JSON messages, not an array: a cell that redefines Array.prototype
  // (an index accessor, push) cannot make the host lose a message, so its end is always seen.
  // The producer credit (seed 004 §5.9): at most CREDIT UTF-16 units of messages wait between two drains
  // (the host drains whenever the cell yields). Printed text past it is not kept in the isolate, where it
  // would run into the memory limit and be lost with the isolate: it is counted, and the host records the
  // loss where the output is read and in the capture ("lost").
  let outbox = "";
  let lost = 0;
  const CREDIT = __CREDIT__;
  const pending = new Map();       // call id -> [resolve, reject]
  const rejected = new Map();      // call id -> promise: a rejected tool promise nobody observed yet
  const observed = new WeakSet();
  let nextId = 0;
  const push = (msg) => { outbox = outbox === "" ? stringify(msg) : outbox + "," + stringify(msg); };
  const output = (s) => {
    const room = CREDIT - outbox.length;
    if (s.length > room) {
      lost += s.length - (room > 0 ? room : 0);
      if (room > 0) push({k: "out", s: s.slice(0, room)});
      return;
    }
    push({k: "out", s});
  };
  const show = (v) => {
    if (typeof v === "string") return v;
    if (v === undefined) return "undefined";
    if (typeof v === "function") return "[Function]";
    try { const s = stringify(v); return s === undefined ? String(v) : s; } catch (e) { return String(v); }
  };
  const emit = (args) => { output(apply(join, apply(arrayMap, args, [show]), [" "]) + "\n"); };
  // A tool promise records whether anything ever looked at it (await, then, Promise.all all call
  // `then` on a subclass): a rejection nothing observed is a floating failure, never a success.
  class ToolPromise extends Promise {
    static get [Symbol.species]() { return Promise; }
    then(onFulfilled, onRejected) { apply(weakAdd, observed, [this]); return super.then(onFulfilled, onRejected); }
  }
  const call = (name, args) => {
    let text;
    try {
      text = args === undefined ? "{}" : stringify(args);
    } catch (e) {
      return Promise.reject(e);
    }
    if (typeof text !== "string") text = "null";
    const id = ++nextId;
    let handles;
    const p = new ToolPromise((resolve, reject) => { handles = [resolve, reject]; });
    apply(mapSet, pending, [id, {resolve: handles[0], reject: handles[1], promise: p}]);
    push({k: "call", id, name, args: text});
    return p;
  };
  const toolsObject = {};
  const adapters = (names) => {
    for (const name of names) {
      Object.defineProperty(toolsObject, name, {value: (args) => call(name, args), enumerable: true});
    }
    freeze(toolsObject);
  };
  const step = (inbox) => {
    const messages = parse(inbox);
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i];
      const entry = apply(mapGet, pending, [m.id]);
      if (entry === undefined) continue;
      apply(mapDelete, pending, [m.id]);
      if (m.ok) {
        entry.resolve(parse(m.v));
      } else {
        const err = new Error(m.v);
        err.code = m.c;
        apply(mapSet, rejected, [m.id, entry.promise]);
        entry.reject(err);
      }
    }
    return "";
  };
  const drain = () => {
    if (lost) { push({k: "lost", n: lost}); lost = 0; }
    const s = "[" + outbox + "]";
    outbox = "";
    return s;
  };
  const where = (e) => {
    const m = /\), <anonymous>:(\d+):(\d+)\)/.exec(String(e && e.stack || ""));
    return m ? Number(m[1]) : null;
  };
  const describe = (e) => {
    let s;
    try { s = (e instanceof Error) ? (e.name + ": " + e.message) : ("Uncaught " + show(e)); }
    catch (x) { s = "Uncaught exception"; }
    return s;
  };
  const start = (src) => {
    let main;
    try {
      main = (0, eval)("(async () => {" + src + "\n})");
    } catch (e) {
      push({k: "fail", e: describe(e), line: null});
      return "";
    }
    let p;
    try { p = main(); } catch (e) { push({k: "fail", e: describe(e), line: where(e)}); return ""; }
    apply(promiseThen, p, [(v) => {
      let r;
      try { r = v === undefined ? undefined : stringify(v); }
      catch (e) { push({k: "fail", e: "the returned value cannot be serialized: " + describe(e), line: null}); return; }
      push({k: "done", r: r === undefined ? null : r});
    }, (e) => push({k: "fail", e: describe(e), line: where(e),
                   code: (e && typeof e.code === "string") ? e.code : null})]);
    return "";
  };
  const final = () => {
    let floating = 0;
    apply(mapForEach, rejected, [(p) => { if (!apply(weakHas, observed, [p])) floating++; }]);
    return stringify({floating, pending: apply(mapSize, pending, [])});
  };
  // No ambient authority and no timers (the seed's cell API has none).
  for (const name of ["setTimeout", "clearTimeout", "setInterval", "clearInterval", "__timer_manager"]) {
    try { G[name] = undefined; } catch (e) {}
  }
  try { delete Atomics.waitAsync; } catch (e) {}
  G.print = (...args) => emit(args);
  G.console = freeze({log: (...a) => emit(a), info: (...a) => emit(a), warn: (...a) => emit(a),
                      error: (...a) => emit(a), debug: (...a) => emit(a)});
  G.text = (value) => { output(show(value) + "\n"); };
  Object.defineProperty(G, "tools", {value: toolsObject, enumerable: true});
  Object.defineProperty(G, "__ctp", {value: freeze({step, drain, start, final, adapters})});
  return "";
})()
"""


class IsolateHost(ABC):
    """The host's side of BOOTSTRAP's protocol, over one `_eval`: shared by the in-process isolate (V8Engine)
    and the worker process's (tools_server/codemode/process.py)."""

    _credit: int

    @abstractmethod
    async def _eval(self, code: str) -> Any:
        """Evaluate `code` in the cell's isolate and return its value."""

    async def _boot_isolate(self, adapters: list[str]) -> None:
        await self._eval(BOOTSTRAP.replace("__CREDIT__", str(int(self._credit))))
        await self._eval(f"__ctp.adapters({json.dumps(adapters)})")

    async def start(self, source: str) -> None:
        await self._eval(f"__ctp.start({json.dumps(source)})")

    async def _drain_messages(self) -> list[dict[str, Any]]:
        raw = await self._eval("__ctp.drain()")
        try:
            messages = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            messages = None
        if not isinstance(messages, list):
            # the cell replaced a builtin the host's messages rely on (Array.prototype.join, …)
            raise EngineError("the cell's messages could not be read (did it replace a JavaScript builtin?)",
                              "engine-error")
        return [m for m in messages if isinstance(m, dict)]

    async def deliver(self, replies: list[Reply]) -> None:
        inbox = json.dumps([r.encoded() for r in replies])
        await self._eval(f"__ctp.step({json.dumps(inbox)})")

    async def final_check(self) -> dict[str, Any]:
        raw = await self._eval("__ctp.final()")
        try:
            value = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise EngineError("the cell's final state could not be read (did it replace a JavaScript builtin?)",
                              "engine-error")
        return value


class V8Engine(IsolateHost):
    """One mini-racer isolate with a hard memory limit. Use on the event loop that created it."""

    def __init__(self, memory_limit_bytes: int, output_credit: int = OUTPUT_CREDIT):
        self._credit = output_credit
        self._mr: MiniRacer | None = MiniRacer()
        self._mr.set_hard_memory_limit(memory_limit_bytes)
        self._booted = False

    async def _eval(self, code: str) -> Any:
        if self._mr is None:
            raise EngineError("the cell's isolate is closed", "closed")
        try:
            return await self._mr.eval_cancelable(code)
        except JSOOMException:
            raise EngineError("the cell exceeded its memory limit", "memory-limit") from None
        except JSEvalException as exc:
            if self.memory_exceeded():
                raise EngineError("the cell exceeded its memory limit", "memory-limit") from None
            # a fault of the bootstrap protocol, not of the cell's code (that is reported as a message)
            raise EngineError(f"the JavaScript engine failed ({type(exc).__name__})", "engine-error") from None

    async def boot(self, adapters: list[str]) -> None:
        await self._boot_isolate(adapters)
        self._booted = True

    async def drain(self) -> list[dict[str, Any]]:
        return await self._drain_messages()

    def memory_exceeded(self) -> bool:
        return self._mr is not None and self._mr.was_hard_memory_limit_reached()

    def heap_used(self) -> int | None:
        """For the bench only: a synchronous call, so only on an idle isolate."""
        if self._mr is None:
            return None
        return int(self._mr.heap_stats().get("used_heap_size", 0))

    def close(self) -> None:
        """Terminates any running JavaScript at once (mini-racer frees the context)."""
        mr, self._mr = self._mr, None
        if mr is not None:
            mr.close()
